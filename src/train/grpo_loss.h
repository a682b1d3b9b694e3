// The GRPO loss family of TRL's GRPOTrainer on packed completion tokens, with
// its gradient with respect to each token's logprob (the trainer then runs the
// model backward with it). Host-side math over (T') floats: the per-token work
// is tiny next to the model, and keeping it on the host makes every option
// easy to read and to test.
//
// Notation: token t of sequence s, logp_t the trainer's logprob (with grad),
// old_t the logprob of the trainer's policy when the batch was generated
// (given when the weights have moved since then: num_iterations mu > 1 or
// several optimizer steps per generation; when absent old_t = logp_t
// detached, which is the same value when they have not), roll_t the rollout
// engine's sampling logprob, ref_t the frozen reference's, A_s the sequence's
// advantage (train/advantages.h), m_t the completion mask (zero for every
// token of a truncated completion when mask_truncated_completions), n_s =
// max(1, Σ_t m_t) over the sequence, w_t the per-token loss weight (1 by default).
//   ρ     = importance ratio, TRL's importance_sampling_level:
//           token    : ρ_t = exp(logp_t − old_t)
//           sequence : ρ_s = exp(Σ_t m_t(logp_t − old_t) / n_s)   (GSPO; one value for all tokens of s)
//   pg_t  = −min(ρ·A_s, clip(ρ, 1−ε, 1+ε_high)·A_s)               (grpo, bnpo, dr_grpo, dapo)
//         = −sg(min(ρ, ε_high))·A_s·logp_t                          (cispo: ε_high is the cap itself, TRL's ε_max)
//   is_t  = vLLM importance-sampling correction (detached), with cap C:
//           token_*    : r_t = exp(old_t − roll_t)
//           sequence_* : r_s = exp(Σ_t m_t(old_t − roll_t))   (product of token ratios)
//                        or exp of the mean over the sequence (is_sequence_geomean)
//           *_truncate : min(r, C);   *_mask: 0 where r > C, else r
//   kl_t  = exp(ref_t − logp_t) − (ref_t − logp_t) − 1        (k3; only when β ≠ 0)
//   term_t = w_t · (is_t · pg_t + β · kl_t)
// Normalisation over the micro-batch (k = gradient-accumulation steps, S
// sequences here, S_tot over the whole optimizer step); token counts are
// weighted, Σ_t m_t w_t, so that a token of weight w counts w times in the
// mean (with all w_t = 1 these are TRL's counts):
//   grpo    : Σ_s [Σ_t m_t term_t / max(1, Σ_t m_t w_t)] / S_tot       (TRL: mean_s(...) / k)
//   bnpo    : Σ_t m_t term_t / max(1, Σ_t m_t w_t over THIS micro-batch) / k
//   dr_grpo : Σ_t m_t term_t / (S_tot · max_completion_length)          (TRL: / (S · L) / k)
//   dapo, cispo : Σ_t m_t term_t / N_items, N_items = Σ m_t w_t over the completion tokens (after
//             truncation masking) of the whole generation batch divided by the number of processes
// With S_tot = S·k (equal micro-batches) these are TRL's formulas; with S_tot
// given they stay exact for unequal micro-batches, so k micro-batches sum to
// the loss of one big batch for grpo, dr_grpo, dapo and cispo. bnpo is per
// micro-batch by definition (equal only when micro-batches hold equal token counts).
// Gradient (c_s the sequence's normaliser above, "clipped" = ρ > 1+ε_high with
// A_s > 0 or ρ < 1−ε with A_s < 0, where the clipped branch is constant):
//   token level    : d/d logp_t = c_s·m_t·w_t·(−is_t·A_s·ρ_t·[not clipped] + β·(1 − exp(ref_t − logp_t)))
//   sequence level : the ratio term becomes K_s·(−A_s·ρ_s·[not clipped])·m_t / n_s with
//                    K_s = Σ_t' c_s·m_t'·w_t'·is_t' (every token of s carries the same ratio);
//                    for unit weights and no IS this is GSPO-token's ρ_s·∇logp_t per token
//   cispo          : the ratio term is −c_s·m_t·w_t·is_t·sg(min(ρ, ε_high))·A_s
// (inside the clip range torch.min splits the tie between two equal branches: same total).
// Metrics are TRL's means (clip_low: ρ<1−ε and A<0, clip_high: ρ>1+ε_high and
// A>0, region: either; cispo: clip_high = ρ>ε_high and A>0), over masked tokens
// at token level and over sequences at sequence level, plus rollout-vs-trainer
// mismatch and the IS ratios before the cap.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "core/enum_table.h"
#include "core/status.h"

namespace grpo {

enum class LossType { grpo, bnpo, dr_grpo, dapo, cispo };
enum class IsMode { none, token_truncate, token_mask, sequence_truncate, sequence_mask };
enum class IsLevel { token, sequence };  // TRL's importance_sampling_level ("sequence" = GSPO)
// The one name table of each (TRL's spellings); parse/name below go through them.
std::span<const EnumName<LossType>> loss_type_names();  // grpo, bnpo, dr_grpo, dapo, cispo
std::span<const EnumName<IsLevel>> is_level_names();    // token, sequence
std::span<const EnumName<IsMode>> is_mode_names();      // none, token_truncate, token_mask, sequence_truncate, sequence_mask
Result<LossType> loss_type_from_string(const std::string& s);
const char* loss_type_name(LossType t);
Result<IsLevel> is_level_from_string(const std::string& s);
const char* is_level_name(IsLevel l);
Result<IsMode> is_mode_from_string(const std::string& s);
const char* is_mode_name(IsMode m);

struct GrpoLossConfig {
  LossType loss_type = LossType::dapo;  // TRL's current default
  float beta = 0.f;                     // KL coefficient; 0 = no reference model
  float epsilon = 0.2f;                 // lower clip ε
  float epsilon_high = 0.2f;            // upper clip ε_high (DAPO uses 0.28); cispo: the weight cap ε_max (ScaleRL: 5)
  IsLevel is_level = IsLevel::token;    // ratio per token, or one per sequence (GSPO)
  IsMode is_mode = IsMode::none;        // importance-sampling correction against the rollout logprobs
  bool is_sequence_geomean = false;     // sequence_* modes: geometric mean instead of product
  float is_cap = 3.f;                   // C
  bool mask_truncated_completions = false;
  int max_completion_length = 256;      // dr_grpo's constant
  Status validate() const;
};

// One micro-batch, packed: sequence s owns tokens [seq_offsets[s], seq_offsets[s+1]) of T'.
// Optional spans may be empty.
struct GrpoLossInput {
  std::span<const int32_t> seq_offsets;  // (S+1)
  std::span<const float> logp;           // (T') trainer logprobs (the variable)
  std::span<const float> advantages;     // (S)
  std::span<const float> old_logp;       // (T') optional: empty = logp detached (mu = 1)
  std::span<const float> ref_logp;       // (T') required when β ≠ 0
  std::span<const float> rollout_logp;   // (T') required when is_mode ≠ none; used for metrics when given
  std::span<const float> mask;           // (T') optional 0/1 completion mask; empty = all ones
  std::span<const float> weights;        // (T') optional per-token loss weights; empty = ones
  std::span<const uint8_t> truncated;    // (S) optional: completion hit max length without EOS
  std::span<const float> entropy;        // (T') optional, metrics only
};

// Normalisation over the optimizer step the micro-batch belongs to.
struct GrpoLossNorm {
  int n_micro = 1;              // k: gradient-accumulation steps
  int n_seqs_total = 0;         // S_tot; 0 = S·k (TRL, equal micro-batches)
  double dapo_num_items = 0;    // N_items; 0 = Σ m_t of this micro-batch (right only when k = 1)
};

// Sums over tokens/sequences so that micro-batches merge; the accessors give means.
struct GrpoMetrics {
  double loss = 0;              // Σ of micro-batch losses (= the step's loss)
  double n_tokens = 0;          // Σ m_t
  double kl_sum = 0, entropy_sum = 0;
  double clip_low = 0, clip_high = 0, clip_region = 0;  // masked tokens (token level) or sequences (sequence level)
  double n_clip = 0;            // what the clip counts are out of
  double is_sum = 0, is_min = 1e30, is_max = 0, is_capped = 0, n_is = 0;  // IS ratios (per token or sequence)
  double roll_abs_sum = 0, roll_abs_max = 0, roll_kl_sum = 0, n_roll = 0;  // rollout vs trainer
  void merge(const GrpoMetrics& o);
  double mean(double sum) const { return n_tokens > 0 ? sum / n_tokens : 0.0; }
  double kl_mean() const { return mean(kl_sum); }
  double entropy_mean() const { return mean(entropy_sum); }
  double clip_low_frac() const { return n_clip > 0 ? clip_low / n_clip : 0.0; }
  double clip_high_frac() const { return n_clip > 0 ? clip_high / n_clip : 0.0; }
  double clip_region_frac() const { return n_clip > 0 ? clip_region / n_clip : 0.0; }
  // IS ratios before the cap, over masked tokens (token_*) or sequences (sequence_*).
  double is_mean() const { return n_is > 0 ? is_sum / n_is : 0.0; }
  double is_min_value() const { return n_is > 0 ? is_min : 0.0; }
  double is_capped_frac() const { return n_is > 0 ? is_capped / n_is : 0.0; }
  // Over masked tokens: |logp − rollout_logp| and the k3 estimate of KL(rollout ‖ trainer)
  // from rollout samples: exp(logp − roll) − (logp − roll) − 1.
  double rollout_abs_diff_mean() const { return n_roll > 0 ? roll_abs_sum / n_roll : 0.0; }
  double rollout_kl() const { return n_roll > 0 ? roll_kl_sum / n_roll : 0.0; }
};

struct GrpoLossOutput {
  double loss = 0;
  std::vector<float> dlogp;  // (T') d loss / d logp
  GrpoMetrics metrics;
};

// Checks the input shapes against the config (a Status names the missing or mis-sized field).
Status grpo_loss_check(const GrpoLossConfig& cfg, const GrpoLossInput& in);
// Loss, gradient and metrics. Preconditions: grpo_loss_check passed.
GrpoLossOutput grpo_loss(const GrpoLossConfig& cfg, const GrpoLossInput& in, const GrpoLossNorm& norm);

// Supervised fine-tuning: loss = −Σ_t m_t·logp_t / n_norm (n_norm = Σ m_t over the whole
// step, so that micro-batches add up), dlogp = −m_t / n_norm. Returns the loss.
double sft_loss(std::span<const float> logp, std::span<const float> mask, double n_norm,
                std::vector<float>& dlogp);

}  // namespace grpo
