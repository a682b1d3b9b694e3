// Rollout engine: requests in, completions with logprobs and telemetry out.
// Continuous batching over a paged KV cache with prefix caching (see
// scheduler.h, block_manager.h, model_runner.h).
//
// Determinism: a sample's tokens depend only on the weights, its prompt, its
// SamplingParams and its RNG key — (seed, sample index) when a seed is given,
// else (engine seed, request id) — never on which other requests share a step,
// on preemption or on prefix-cache hits, provided the kernels are batch-invariant
// (the CPU fp32 backend is; tests/engine checks it).
//
// Not thread-safe: one thread drives add_request / step / generate.
//
// Completion ids include the token that ended the sample (EOS, a stop id, or
// the token that completed a stop string) with its logprobs: the trainer must
// see it. `text` excludes EOS/special tokens and is cut before a stop string.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/context.h"
#include "engine/engine_options.h"
#include "engine/model_runner.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculative.h"
#include "engine/tandem.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace grpo {

// The KV cache dtype the options give for a model of dtype model_dtype (see
// EngineOptions::kv_cache_dtype). Errors name the option and what is allowed.
Result<DType> engine_kv_cache_dtype(const ModelConfig& cfg, DType model_dtype, const EngineOptions& opt);

// KV blocks the options give for this model (weights of dtype model_dtype):
// n_kv_blocks, or the memory budget divided by the bytes of one block in the
// KV cache dtype. Errors name the option to change.
Result<int> engine_kv_blocks(const ModelConfig& cfg, DType model_dtype, const EngineOptions& opt);

struct RequestTelemetry {
  double queue_s = 0;         // arrival -> first scheduled
  double ttft_s = 0;          // arrival -> first completion token
  double e2e_s = 0;           // arrival -> finished
  int prompt_tokens = 0;
  int generated_tokens = 0;
  int prefix_hit_tokens = 0;  // prompt tokens served by the prefix cache at admission
  int n_preemptions = 0;
  size_t peak_kv_bytes = 0;   // most KV bytes referenced at once (shared blocks included)
  // Speculative decoding (engine/speculative.h); zeros without it. spec_accepted counts
  // emitted drafts; by_pos[j] counts draft position j (0-based) proposed / accepted.
  int64_t spec_proposed = 0;
  int64_t spec_accepted = 0;
  double spec_acceptance_rate = 0;  // spec_accepted / spec_proposed (0 when nothing was proposed)
  std::vector<int64_t> spec_accepted_by_pos, spec_proposed_by_pos;
  int64_t engine_steps = 0;   // engine steps that emitted tokens of this sample (plain decoding: one per token)
};

struct RequestOutput {
  int64_t request_id = 0;
  int sample_index = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion_ids;
  std::string text;                        // empty without a tokenizer
  std::vector<float> logprobs;             // per completion token, in params.logprobs_mode
  std::vector<float> logprobs_raw;         // log_softmax of the logits (what the trainer recomputes)
  std::vector<float> logprobs_processed;   // under the distribution actually sampled from
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;  // when params.top_logprobs > 0
  // Tandem decoding only (empty otherwise): per completion token, 1 = the trained model
  // wrote it, 0 = the partner (logprobs* above are then the partner's); and the trained
  // model's log_softmax(z / temperature) of the token (what the trainer recomputes).
  std::vector<uint8_t> model_mask;
  std::vector<float> logprobs_trained;
  FinishReason finish_reason = FinishReason::none;
  RequestTelemetry telemetry;
};

// One completion token as it is produced (Engine::step's optional event list),
// for streaming. text_delta is the text that became final with this token: while
// stop strings are set, the last (longest stop - 1) bytes are held back until no
// stop match can cut them, so the concatenated deltas of a sample always equal
// the final RequestOutput::text.
struct TokenEvent {
  int64_t request_id = 0;
  int sample_index = 0;
  int32_t token = 0;
  float logprob = 0;            // in params.logprobs_mode
  float logprob_raw = 0;
  float logprob_processed = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when params.top_logprobs > 0
  std::string text_delta;
  FinishReason finish_reason = FinishReason::none;  // set on the sample's last token
};

struct EngineStats {
  int64_t steps = 0;
  int64_t tokens_computed = 0;    // prompt + recomputed tokens run through the model
  int64_t tokens_generated = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t graph_replays = 0;
  int64_t tandem_trained_tokens = 0;  // tandem: completion tokens the trained model wrote
  int64_t tandem_partner_tokens = 0;  // tandem: completion tokens the partner wrote
  int64_t spec_steps = 0;             // speculative: steps that verified drafts
  int64_t spec_plain_steps = 0;       // speculative: steps run as plain decoding (k = 0 everywhere)
  int64_t spec_proposed = 0, spec_accepted = 0;
};

// A frozen partner for tandem decoding (engine/tandem.h). The partner's weights must
// outlive the engine; tandem_check_partner and opt.validate must have passed.
struct EngineTandem {
  const ModelWeights* partner = nullptr;
  TandemOptions opt;
};

class Engine {
 public:
  // Precondition: opt.validate() is ok (checked). `tok` may be null (no text, no stop strings).
  // With `tandem`, both pools share the KV budget (tandem_kv_blocks) and tandem decoding is on.
  // With opt.speculative.method == draft, `draft` is the draft model (same vocabulary; it
  // must outlive the engine); both pools then share the KV budget. Not with tandem.
  Engine(Context& ctx, ModelWeights& w, const Tokenizer* tok, EngineOptions opt, const EngineTandem* tandem = nullptr,
         const ModelWeights* draft = nullptr);
  ~Engine();

  // Queues a prompt with params.n samples; returns the request id. Errors name the
  // problem: invalid params, empty/too long prompt, ids outside the vocabulary, a
  // request that cannot fit the KV pool, stop strings without a tokenizer.
  Result<int64_t> add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params);
  // Runs one scheduled step; returns the samples that finished in it. With `events`,
  // also appends one TokenEvent per token sampled in the step (finished ones included).
  std::vector<RequestOutput> step(std::vector<TokenEvent>* events = nullptr);
  // Ends every sample of a queued or running request and frees its KV blocks; its
  // output is dropped. Returns false (and changes nothing) when the id is unknown
  // or already finished.
  bool abort_request(int64_t request_id);
  bool has_unfinished() const { return scheduler_->has_work(); }
  // Blocking: runs until every prompt's samples are done. Output k = prompt k / n,
  // sample k % n. Requests already queued are run too (their outputs are dropped).
  Result<std::vector<RequestOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                              const SamplingParams& params);
  // As above with one SamplingParams per prompt (per-prompt seeds and n): the outputs are
  // prompt-major, params[i].n samples of prompt i in sample order.
  Result<std::vector<RequestOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<SamplingParams>& params);
  // Drops every cached prefix (call after the weights change).
  void reset_prefix_cache() { blocks_->reset_prefix_cache(); }
  // Puts adapter `w` (null: none) into LoRA slot `slot` (EngineOptions::lora_slots), for
  // requests added from now on; the slot's prefix-cache namespace starts afresh, so K/V
  // cached under the previous adapter is never matched again. Call between steps from the
  // thread that drives the engine. Errors: slot out of range, an unfinished request still
  // runs on the slot, or `w` does not fit (dtype, device, layers, rank above
  // EngineOptions::max_lora_rank's capacity). `w` must outlive its use by the engine.
  Status set_lora_slot(int slot, const LoraWeights* w);
  // Tandem engines: turns the partner on or off (off = the trained model alone, e.g. for
  // solo eval; the partner's pool is then not written, so the prefix cache is dropped).
  // Error when requests are unfinished or the engine has no partner.
  Status set_tandem_active(bool on);
  bool tandem_active() const { return tandem_ && tandem_on_; }
  bool has_tandem() const { return tandem_ != nullptr; }

  const EngineStats& stats() const { return stats_; }
  // Speculative engines with adaptive k: the measured step costs the plan uses (else null).
  const SpecAdaptive* spec_adaptive() const { return adapt_.get(); }
  const Context& context() const { return ctx_; }
  const EngineOptions& options() const { return opt_; }
  int n_kv_blocks() const { return blocks_->n_blocks(); }
  int n_free_kv_blocks() const { return blocks_->n_free(); }
  int n_waiting() const { return int(scheduler_->waiting().size()); }   // sequences, not requests
  int n_running() const { return int(scheduler_->running().size()); }
  // All layers, K and V, real bytes (tandem: the trained pool's plus the partner's; speculative: plus the draft's).
  size_t kv_bytes_per_block() const {
    return runner_->kv_bytes_per_block() + (tandem_ ? tandem_->kv_bytes_per_block() : 0) +
           (draft_ ? draft_->kv_bytes_per_block() : 0);
  }
  DType kv_cache_dtype() const { return runner_->geometry().kv_dtype; }
  int max_model_len() const { return max_model_len_; }
  int vocab_size() const { return w_.config.vocab_size; }
  const std::vector<int>& eos_token_ids() const { return eos_; }

 private:
  struct Decoder;
  Status check_request(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const;
  void on_token(Sequence& s, const SampledRow& row, double now);
  // at: the completion index being sampled (-1: the next one).
  RowSampling row_sampling(const Sequence& s, int at = -1) const;
  std::vector<RequestOutput> step_speculative(std::vector<TokenEvent>* events);  // engine/speculative_engine.cpp
  std::vector<RequestOutput> step_plain(std::vector<TokenEvent>* events);
  // The TokenEvent of a token just given to on_token (nullptr without events).
  TokenEvent* add_event(const Sequence& s, const SampledRow& row, std::vector<TokenEvent>* events);
  // After on_token: a finished sample's output goes to done (ev gets the rest of its
  // text); a running one moves the text no stop string can cut any more into ev.
  void after_token(Sequence& s, TokenEvent* ev, double now, std::vector<RequestOutput>& done);
  RequestOutput finish_output(Sequence& s, FinishReason reason, double now);

  Context& ctx_;
  ModelWeights& w_;
  const Tokenizer* tok_;
  EngineOptions opt_;
  int max_model_len_ = 0;
  std::vector<int> eos_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<TandemDecoder> tandem_;
  bool tandem_on_ = false;
  std::unique_ptr<SpecDraft> draft_;
  std::unique_ptr<SpecAdaptive> adapt_;
  int ngram_skip_ = 0, ngram_backoff_ = 0;  // prompt lookup: plain steps left without lookups, and the next such run
  Tensor spec_p_;  // (max logit rows, V) f32: the target's processed distributions (speculative sampling)
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::unordered_map<int64_t, std::unique_ptr<Decoder>> decoders_;
  std::vector<uint64_t> lora_salt_;  // per LoRA slot: the prefix-cache namespace of its current adapter
  uint64_t next_lora_salt_ = 0;
  int64_t next_request_ = 0, next_seq_ = 0;
  EngineStats stats_;
};

}  // namespace grpo
