// Speculative decoding: a cheap proposer guesses the next k tokens of a sequence and
// the target model checks all k + 1 positions in one forward (a multi-token chunk over
// its paged KV), so one engine step can emit up to k + 1 tokens.
//
// Proposers:
//   draft : a second model with the same vocabulary (any size / architecture), with its
//           own paged KV pool indexed by the SAME block tables (the tandem layout,
//           engine/tandem.h). Every token the target computes is also run through the
//           draft (prefill, recompute after preemption, decode), so a prefix-cache hit
//           is valid in both pools; then k − 1 more one-token draft steps propose
//           d_1..d_k. The draft samples with the target's RNG key and counter for the
//           same completion position, under the same sampling settings.
//   ngram : prompt lookup: the longest n in [ngram_min, ngram_max] whose last-n-token
//           suffix occurred earlier in the sequence (most recent occurrence) proposes the
//           tokens that followed it. No model.
//
// Verification: the target samples every verified position j with the RNG counter plain
// decoding would use there (completion index), its own processed distribution (temperature,
// top-k, top-p, min-p, banned ids) and its own logits. Then, per SpeculativeOptions::acceptance:
//   rejection (rows at temperature > 0): speculative sampling (kernels/spec_verify.h). d_{j+1}
//     is kept with probability min(1, p(d)/q(d)) (q: the draft's processed distribution, or a
//     point mass for n-gram proposals); the first rejection emits a draw from
//     norm(max(0, p − q)). Emitted tokens follow p exactly; acceptance is 1 − TV(p, q).
//   match (and greedy rows always): d_{j+1} is kept iff it equals the target's own sample at
//     position j; the first mismatch emits that sample. Outputs equal plain decoding's token
//     for token, for any k; a draft model samples with the same uniform (inverse CDF in id
//     order), a coupling whose acceptance is at most 1 − TV(p, q).
// When all k are kept the target's own sample after d_k is emitted too. Raw and processed
// logprobs (and top-n lists) of every emitted token are the target's at its position.
//
// Rollback: rejected positions are dropped from the sequence; n_computed moves back to
// the committed tokens, blocks past the committed length are returned, and the draft
// remembers the one committed token it has not computed (draft_lag). Speculative tokens
// are never hashed into the prefix cache (BlockManager::append's n_register).
//
// Adaptive k (SpecAdaptive::plan): per step the engine picks, for each decode-ready
// sequence, k_s in [0, k_max] to maximise expected emitted tokens per second of the step.
// A sequence's expected tokens are E_s(k) = 1 + Σ_{j≤k} α_s^j with α_s its own EMA of
// per-position acceptance (until measured: 1 + Σ_{j≤k} Π_{i≤j} α_i, the engine-wide EMA
// by draft position). The step's cost comes from models fitted at run time to measured
// forward times (seconds ≈ a + b · tokens, least squares with forgetting; one fit for the
// target's verify/decode forward, one for a draft round). k = 0 everywhere (plain
// decoding) whenever no plan beats it by 2%; while off, a probe step every probe_every
// steps keeps α measured.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace grpo {

// SpecMethod and SpeculativeOptions ([engine.speculative]) live in engine/engine_options.h.
// "engine.speculative.method = ...: must be one of ..." for an unknown name.
Result<SpecMethod> spec_method_from_string(const std::string& s);
const char* spec_method_name(SpecMethod m);  // canonical name (spec_method_names())

// Prompt lookup: up to k tokens proposed for `tokens` (empty when no suffix of length
// in [n_min, n_max] occurred earlier).
std::vector<int32_t> spec_ngram_propose(const std::vector<int32_t>& tokens, int n_min, int n_max, int k);

// Checks that a draft model can propose for the target (same vocabulary, long enough
// context). Errors say what differs.
Status spec_check_draft(const ModelConfig& target, const ModelConfig& draft, int max_model_len);

// Loads the draft model of method draft (nullptr for the other methods) on ctx's device
// in dtype dt, checked against the target (spec_check_draft). Errors name
// engine.speculative.draft_model.
Result<std::unique_ptr<ModelWeights>> spec_load_draft(const SpeculativeOptions& o, const ModelConfig& target,
                                                     int max_model_len, Context& ctx, DType dt);

// Online linear cost model: seconds ≈ a + b · tokens (exponential forgetting).
class SpecCostFit {
 public:
  void add(double tokens, double seconds);
  bool ready() const;
  double predict(double tokens) const;

 private:
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double x_min_ = 1e300, x_max_ = -1e300;
};

class SpecAdaptive {
 public:
  SpecAdaptive(int k_max, int probe_every);
  // k for a step with n_decode decode-ready sequences of unmeasured acceptance (0 = plain decoding).
  int choose(int n_decode, bool has_draft);
  // k per decode-ready sequence from its own acceptance EMA (alpha[s] < 0: not measured yet,
  // the engine-wide per-position α is used). See plan() in speculative.cpp for the cost model.
  std::vector<int> plan(const std::vector<double>& alpha, bool has_draft);
  // Outcome of one verified sequence: it proposed k and the first `accepted` matched.
  void observe(int k, int accepted);
  // A sequence's own acceptance EMA (Sequence::spec_alpha; < 0 = none yet) after such an outcome.
  static double observe_seq(double alpha, int k, int accepted);
  SpecCostFit target, draft;
  double alpha(int pos) const { return alpha_[size_t(pos)]; }

 private:
  int k_max_, probe_every_;
  std::vector<double> alpha_;
  int64_t steps_ = 0, since_spec_ = 0;
};

class Tokenizer;

// The draft model's runner and the per-step draft rounds (method draft).
class SpecDraft {
 public:
  // eo, geo: the target runner's options and geometry (the draft gets the same pool shape
  // in its own KV dtype).
  SpecDraft(Context& ctx, const ModelWeights& draft, EngineOptions eo, EngineGeometry geo);
  ~SpecDraft();
  // Round 1 over every scheduled sequence (catch-up and the target's ranges, so both pools
  // hold the same tokens), then k − 1 one-token rounds; writes proposals into the
  // placeholders of seqs with n_spec > 0. rows_of(seq, j): sampling settings of the
  // sequence's committed completion index + j.
  template <class RowsOf>
  void propose(const SchedulerOutput& step, RowsOf&& rows_of);
  size_t kv_bytes_per_block() const { return runner_->kv_bytes_per_block(); }
  // Speculative sampling needs q: from now on every round keeps its rows' processed
  // distributions (draft position j of a sequence: row Sequence::spec_q_rows[j] of q()).
  // on = false: the next rounds skip it (a step without rows at temperature > 0).
  void keep_distributions(bool on);
  const Tensor& q() const { return q_; }

 private:
  void run_round(const SchedulerOutput& round, const std::vector<RowSampling>& rows, int j);
  Context& ctx_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<SampledRow> sampled_;
  int max_seqs_ = 0, k_max_ = 0;
  bool keep_q_ = false;
  Tensor q_;  // (k_max · max_seqs, V) f32: round j's rows from row j · max_seqs (empty: not kept)

 public:
  SpecCostFit* fit = nullptr;  // receives (tokens, seconds) of every draft round
};

template <class RowsOf>
void SpecDraft::propose(const SchedulerOutput& step, RowsOf&& rows_of) {
  SchedulerOutput round;
  std::vector<RowSampling> rows;
  std::vector<Sequence*> spec;
  std::vector<size_t> spec_row;  // row of each spec sequence in round 1
  int k_max = 0;
  for (const ScheduledSeq& ss : step.seqs) {
    Sequence* s = ss.seq;
    ScheduledSeq d;
    d.seq = s;
    d.pos0 = s->n_computed - s->draft_lag;
    // Spec seqs stop at the last committed token (its logits propose d_1); the others
    // follow the target's range so both pools hold K/V for the same tokens.
    d.n_new = s->draft_lag + (s->n_spec > 0 ? 1 : ss.n_new);
    d.sample = ss.sample;
    if (d.sample) {
      if (s->n_spec > 0) {
        spec.push_back(s);
        spec_row.push_back(rows.size());
        k_max = std::max(k_max, s->n_spec);
      }
      rows.push_back(rows_of(*s, 0));
    }
    round.seqs.push_back(d);
    round.n_tokens += d.n_new;
    round.n_sampled += d.sample ? 1 : 0;
  }
  run_round(round, rows, 0);
  for (size_t i = 0; i < spec.size(); ++i) {
    Sequence* s = spec[i];
    s->tokens[size_t(s->n_total() - s->n_spec)] = sampled_[spec_row[i]].token;
    s->spec_q_rows.assign(1, int(spec_row[i]));
  }
  for (int j = 1; j < k_max; ++j) {
    round = SchedulerOutput{};
    rows.clear();
    std::vector<Sequence*> live;
    for (Sequence* s : spec) {
      if (s->n_spec <= j) continue;
      const int committed = s->n_total() - s->n_spec;
      ScheduledSeq d;
      d.seq = s;
      d.pos0 = committed + j - 1;  // d_j's position: its logits propose d_{j+1}
      d.n_new = 1;
      d.sample = true;
      round.seqs.push_back(d);
      ++round.n_tokens;
      ++round.n_sampled;
      rows.push_back(rows_of(*s, j));
      live.push_back(s);
    }
    if (live.empty()) break;
    run_round(round, rows, j);
    for (size_t i = 0; i < live.size(); ++i) {
      Sequence* s = live[i];
      s->tokens[size_t(s->n_total() - s->n_spec + j)] = sampled_[i].token;
      s->spec_q_rows.push_back(j * max_seqs_ + int(i));
    }
  }
}

}  // namespace grpo
