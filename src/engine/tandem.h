// Tandem decoding: a frozen partner model writes part of every completion
// (tandem training, arXiv 2510.13551). Both models decode each sequence in
// lockstep: the partner has its own paged KV pool indexed by the SAME block
// tables (its bytes per block from its own layers and heads), every scheduled
// token — prompt, recompute after preemption, or new token, whoever wrote it —
// goes through both forwards, so both caches always hold K/V for the same
// tokens; prefix-cache hits share blocks whose slots in both pools were written
// from the same tokens. Per sampled row both models sample with the row's RNG
// key and counter, and a seeded per-sequence decision picks whose token is
// emitted (the owner). The row records the owner, the owner's logprobs and the
// trained model's logprob of the emitted token under log_softmax(z / T) (what
// the trainer recomputes).
// On CUDA the partner runs on a context of its own (its own stream, handles and a
// smaller workspace), so its forward and sampler overlap the trained model's on the GPU;
// the trained stream then waits for the partner's, scores both candidate tokens and
// reads everything back with one copy, so a step waits for the GPU once;
// each runner captures its own decode graphs, so CUDA graphs cover both forwards.
//
// Owner of completion token i (u_i = uniform draws from tandem_key(seed, rng_key),
// "draw(x)" = [u(x) < p_trained], so p_trained = 1 always picks the trained model
// and 0 always the partner):
//   token : draw(i).
//   chunk : the completion is cut into chunks of k tokens starting at a random
//           offset o in [0, k) (chunk c = (i + o) / k); chunk c's owner is draw(c),
//           so the owner can change only every k tokens (first chunk: k − o tokens).
//   word  : i = 0: draw(i). Else c = draw(i); if c is the previous owner, c; else the
//           switch happens only if c's own sampled token begins a word after the
//           previous token (tandem_word_start), otherwise the previous owner keeps
//           writing. So the owner changes only at word starts, decided by the
//           token that is actually emitted.
// A token begins a word (tandem_word_start(prev, t)) when its text starts with
// whitespace (byte-level BPE 'Ġ'/'Ċ'..., SentencePiece '▁' decode to ' '/'\n'),
// when it is a special/added token, or when the previous token's text ends in a
// newline.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <span>

#include "core/enum_table.h"
#include "core/status.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace grpo {

class Tokenizer;
struct EngineOptions;

enum class TandemStrategy { token, chunk, word };
std::span<const EnumName<TandemStrategy>> tandem_strategy_names();  // token, chunk, word
Result<TandemStrategy> tandem_strategy_from_string(const std::string& s);  // through tandem_strategy_names()
const char* tandem_strategy_name(TandemStrategy s);

// Per-token bits of tandem_word_flags.
inline constexpr uint8_t kTokSpaceStart = 1;   // text starts with whitespace
inline constexpr uint8_t kTokNewlineEnd = 2;   // text ends with '\n'
inline constexpr uint8_t kTokSpecial = 4;      // special / added token

struct TandemOptions {
  TandemStrategy strategy = TandemStrategy::word;
  double p_trained = 0.5;   // probability that a draw picks the trained model
  int chunk_size = 16;      // k of the chunk strategy
  uint64_t seed = 0;        // mixed with each sequence's RNG key
  std::vector<uint8_t> token_flags;  // (V) from tandem_word_flags; required by the word strategy
  // Errors name the [tandem] key.
  Status validate(int vocab_size) const;
};

// Word-boundary flags of every id in [0, vocab_size) from the tokenizer's token bytes.
std::vector<uint8_t> tandem_word_flags(const Tokenizer& tok, int vocab_size);
bool tandem_word_start(const std::vector<uint8_t>& flags, int32_t prev, int32_t tok);

// The key of a sequence's decisions (from the sequence's sampling RNG key).
uint64_t tandem_key(uint64_t seed, uint64_t rng_key);
// Whether the trained model writes completion token i (see the header comment).
// prev_owner: -1 for i = 0, else 1 (trained) / 0 (partner) of token i − 1;
// prev_token: the token before i; tok_trained / tok_partner: what each model sampled.
bool tandem_pick(const TandemOptions& o, uint64_t key, int i, int prev_owner, int32_t prev_token,
                 int32_t tok_trained, int32_t tok_partner);

// KV blocks for both pools from one budget: n_kv_blocks, or kv_cache_bytes divided by
// the bytes of one block in the trained pool plus one in the partner's.
Result<int> tandem_kv_blocks(const ModelConfig& cfg, DType dtype, const ModelConfig& partner_cfg,
                             DType partner_dtype, const EngineOptions& opt);

// Checks that a partner can decode with the trained model (same vocabulary size and
// special ids, same device and dtype family, long enough context). Errors say what differs.
Status tandem_check_partner(const ModelConfig& trained, const ModelConfig& partner, int max_model_len);

class TandemDecoder {
 public:
  // eo, geo: the trained runner's options and geometry (the partner gets the same pool
  // shape in its own KV dtype: kv_dtype == the trained weights' dtype means the partner's dtype).
  TandemDecoder(Context& ctx, const ModelWeights& partner, const EngineOptions& eo, EngineGeometry geo,
                TandemOptions opt);
  ~TandemDecoder();

  // One engine step through both models; out as ModelRunner::execute, with each row's
  // owner, the owner's logprobs and the trained model's logprob filled in.
  void execute(ModelRunner& trained, const SchedulerOutput& step, const std::vector<RowSampling>& rows,
               std::vector<SampledRow>& out);

  const TandemOptions& options() const { return opt_; }
  size_t kv_bytes_per_block() const { return partner_->kv_bytes_per_block(); }
  int64_t n_graph_replays() const { return partner_->n_graph_replays(); }

 private:
  const ModelWeights& w_;
  TandemOptions opt_;
  std::unique_ptr<Context> own_ctx_;  // CUDA: the partner's stream; null on the CPU (shares the caller's)
  std::unique_ptr<ModelRunner> partner_;
  std::vector<SampledRow> rows_partner_;
  std::vector<int32_t> ids_;
  std::vector<float> temps_, lp_trained_, lp_partner_;
};

}  // namespace grpo
