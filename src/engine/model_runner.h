// Model runner: turns a scheduled step into a ForwardBatch on the device, runs
// transformer_forward over the paged KV cache and samples one token for every
// sequence whose step reaches the end of its known tokens.
//
// All step inputs live in persistent device buffers allocated once (sized by
// max_num_batched_tokens / max_num_seqs of EngineOptions, max_model_len of the
// EngineGeometry), so their addresses never
// change: a decode step (one token per sequence) can be captured once per padded
// batch size as a CUDA graph and replayed by refilling the buffers; the same graphs
// run speculative verify steps (every row of a sequence's k + 1 wants logits, so
// T rows fit a graph of B >= T rows with several rows per sequence). Padding rows of
// a graph batch use slot -1 (nothing written) and position 0 of block 0 (a harmless
// read); their logits are ignored. Graphs are captured with max_context =
// cuda_graph_max_context (attention's split count is baked into the graph), so longer
// decode steps run eagerly. Sampling runs eagerly after the forward.
// Eager steps that are mostly prefill also get a list of query tiles (up to 64 rows of
// one sequence each, PagedAttnMeta::prefill_tiles), which lets the CUDA backend run its
// tensor-core prefill attention; decode-heavy steps and graph batches never carry one.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/context.h"
#include "engine/engine_options.h"
#include "engine/scheduler.h"
#include "kernels/sampling.h"
#include "kernels/spec_verify.h"
#include "model/transformer.h"

namespace grpo {

class DecodeGraphs;

// Sampling settings of one logits row (host side).
struct RowSampling {
  float temperature = 1.f, top_p = 1.f, min_p = 0.f;
  int top_k = 0;
  uint64_t rng_key = 0, rng_pos = 0;
  std::vector<int32_t> banned;
  int n_top = 0;                       // top-n logprobs wanted
  bool top_processed = false;          // top-n under the processed distribution
};

struct SampledRow {
  int32_t token = -1;
  float logprob_raw = 0, logprob_processed = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), best first
  // Tandem decoding (engine/tandem.h): whether the trained model wrote the token (the
  // logprobs above are then the writer's), and the trained model's logprob of it.
  bool by_trained = true;
  float logprob_trained = 0;
};

// One draft position for speculative sampling (kernels/spec_verify.h): rows of the target's
// and the draft's processed distributions (q_row < 0: point mass at the draft token).
struct SpecVerifyRow {
  int p_row = 0, q_row = -1;
  int32_t draft = 0;
  uint64_t rng_key = 0, rng_pos = 0;
};
struct SpecVerifyResult {
  int32_t token = -1;
  bool accepted = false;
  float logprob_raw = 0, logprob_processed = 0;
};

// Bytes of one KV block over all layers (K and V).
size_t kv_block_bytes(const ModelConfig& cfg, DType kv_dtype, int block_size);

class ModelRunner {
 public:
  // opt.validate() is ok; geo as engine_kv_blocks / engine_kv_cache_dtype give it. The runner
  // keeps its own copy of opt with the graph defaults filled in.
  ModelRunner(Context& ctx, const ModelWeights& w, const EngineOptions& opt, const EngineGeometry& geo);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the step. rows has one entry per scheduled sequence with sample == true,
  // in step order; out receives one SampledRow each. With probs ((>= R, V) f32 on the device),
  // its first R rows receive each row's processed distribution (SamplingOutputs::probs).
  void execute(const SchedulerOutput& step, const std::vector<RowSampling>& rows, std::vector<SampledRow>& out,
               const Tensor* probs = nullptr);
  // After execute() with probs = P: speculative sampling's test of each row (kernels/spec_verify.h),
  // raw logprobs from this step's logits. Q: the draft's distributions (empty: every q_row < 0);
  // q_index: Q's column of every token id when the draft has its own vocabulary (SpecDraft::q_index).
  void spec_verify_rows(const Tensor& P, const Tensor& Q, const std::vector<SpecVerifyRow>& rows,
                        std::vector<SpecVerifyResult>& out, const Tensor& q_index = {});
  Device device() const { return ctx_.device(); }
  // The largest LoRA rank the forward's scratch holds (adapters set into slots later must fit).
  int lora_rank_capacity() const { return scratch_.lora_r; }
  int vocab_size() const { return w_.config.vocab_size; }
  // Steps whose sequences each bring at most kShortChunk tokens, only the last sampled, replay
  // the decode graphs too (logits for every row; a draft model's catch-up rounds). Off by default.
  static constexpr int kShortChunk = 8;
  void set_graph_short_chunks(bool on) { graph_short_chunks_ = on; }

  size_t kv_bytes_per_block() const { return cache_.bytes_per_block(); }
  const EngineOptions& options() const { return opt_; }
  const EngineGeometry& geometry() const { return geo_; }
  int64_t n_graph_replays() const { return n_graph_replays_; }

  // execute() in two halves, for a second model in the same block tables (engine/tandem.h):
  // forward() leaves the step's sampled rows' logits in place; sample_rows() samples them.
  void forward(const SchedulerOutput& step) { run_forward(step); }
  void sample_rows(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out, const Tensor* probs = nullptr) {
    sample(rows, out, probs);
  }
  // After forward(): log_softmax(logits_r / temps[r])[ids[r]] of the first ids.size() rows
  // (kernels/row_logprob.h).
  void row_logprobs(const std::vector<int32_t>& ids, const std::vector<float>& temps, std::vector<float>& out);

  // A tandem step with one wait for the host (engine/tandem.h). After forward() on this runner
  // and on `other` (a second model in the same block tables), each starts its sampler with
  // sample_rows_async (nothing read back; false: these rows need sample_rows, i.e. top-n lists
  // or bitwise logprobs). Then collect_pair, on this runner: after other's stream, this model's
  // log_softmax(logits_r / T_r) of both models' sampled tokens, and everything read back at once.
  // mine / theirs: each model's rows; lp_mine / lp_theirs: this model's logprob of each token.
  // probs: as execute()'s.
  bool sample_rows_async(const std::vector<RowSampling>& rows, const Tensor* probs = nullptr);
  void collect_pair(ModelRunner& other, int64_t R, std::vector<SampledRow>& mine, std::vector<SampledRow>& theirs,
                    std::vector<float>& lp_mine, std::vector<float>& lp_theirs);

  // Chained rounds without a wait (a draft model's one-token rounds, engine/speculative.h):
  // the next forward takes the ids of its first src.numel() token rows from src (i32 on the
  // device) instead of the sequences' host tokens; sampled_tokens() are the last sampler
  // call's ids on the device (valid until the next sampler call).
  void set_next_tokens(const Tensor& src) { next_tokens_ = src; }
  Tensor sampled_tokens(int64_t R) const { return d_tok_out_.slice0(0, R); }
  // i32 copies ordered on this runner's stream: device to device (no wait), device to host (waits).
  void copy_ids(Tensor& dst, const Tensor& src);
  void download_ids(Tensor& host, const Tensor& src);

 private:
  // graph: padded to a graph of padded_T rows, whose logits rows are then padded_T too.
  void fill_inputs(const SchedulerOutput& step, int padded_T, bool allow_prefill_tiles, bool graph = false);
  ForwardBatch batch_view(int T, int S, int R, int max_context);
  void run_forward(const SchedulerOutput& step);
  void sample(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out, const Tensor* probs = nullptr);
  // EngineOptions::bitwise_logprobs: overwrites out's logprobs with the trainer's LM-head
  // logprob of each sampled token (the tokens are in d_tok_out_, the hidden rows in scratch_.xn).
  void trainer_logprobs(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out);
  void capture_graphs();
  // Uploads the rows' sampling settings into d_rows_; returns the view the sampler reads.
  SamplingRows upload_rows(const std::vector<RowSampling>& rows);
  // The sampler's token / logprob outputs for R rows (rows of d_out_).
  SamplingOutputs sampler_outputs(int64_t R) const;
  // Copies rows [0, n) of d_out_ into h_out_ on `stream_ctx`'s stream (this runner's or a
  // tandem partner's, ordered after this runner's work by the caller); the host view after
  // `wait` (CPU: d_out_ itself).
  const float* read_out(Context& stream_ctx, int n, bool wait);
  void rows_from_out(const float* h, int64_t R, std::vector<SampledRow>& out) const;

  Context& ctx_;
  const ModelWeights& w_;
  EngineOptions opt_;
  EngineGeometry geo_;
  int max_blocks_per_seq_ = 0;
  int max_T_ = 0;
  int max_R_ = 0;  // logits / sampling rows per step at most
  KVCache cache_;
  RopeTable rope_;
  ForwardScratch scratch_;
  // Persistent step inputs on the device: (max_T) i32 each, block table (max_seqs, max_blocks_per_seq).
  Tensor d_tokens_, d_positions_, d_token_seq_, d_slots_, d_block_table_, d_logit_rows_;
  Tensor d_prefill_tiles_;   // (max_T, 4) i32: the step's prefill tiles (each has >= 1 row, so <= max_T)
  int n_prefill_tiles_ = 0;  // tiles of the step last filled (0: none)
  Tensor d_logits_;  // (max_seqs, V) f32
  // Persistent sampling buffers (max_seqs rows); banned and top-n are flat and grow on demand.
  SamplingRows d_rows_;
  // The sampler's outputs and collect_pair's logprobs in one block read back by one copy:
  // (kOutRows, max_R) 4-byte words, rows kOutTok (i32), kOutRaw, kOutProc, kOutMine, kOutTheirs (f32);
  // h_out_: its page-locked host copy (CUDA). d_tok_out_, d_lp_raw_, d_lp_proc_ are rows of it.
  Tensor d_out_, h_out_;
  void* pair_event_ = nullptr;  // cudaEvent_t: collect_pair's wait for the other runner's stream
  Tensor d_tok_out_, d_lp_raw_, d_lp_proc_, d_top_ids_, d_top_lps_;
  int banned_cap_ = 0, top_cap_ = 0;
  Tensor d_given_ids_, d_given_temps_, d_given_lp_;  // (max_seqs) row_logprobs buffers, allocated on first use
  Tensor d_lse_;  // (max_R) f32, CPU: trainer_logprobs' log-sum-exp output (unused but required by the kernel)
  SpecVerifyRows d_verify_;                           // (max_R) spec_verify inputs, allocated on first use
  SpecVerifyOutputs d_verify_out_;
  // Host staging.
  std::vector<int32_t> h_tokens_, h_positions_, h_token_seq_, h_slots_, h_block_table_, h_logit_rows_;
  std::vector<std::array<int32_t, 4>> h_tiles_;  // (row0, n_rows, seq, pos0)
  std::vector<int32_t> h_prefill_tiles_;         // h_tiles_ flattened for the upload
  std::unique_ptr<DecodeGraphs> graphs_;
  int64_t n_graph_replays_ = 0;
  bool graph_short_chunks_ = false;
  Tensor next_tokens_;  // set_next_tokens (empty: none)
  void take_next_tokens();  // after fill_inputs: copies next_tokens_ into d_tokens_ and clears it
};

}  // namespace grpo
