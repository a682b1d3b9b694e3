// Resolved options of the rollout engine, read by the Engine, its Scheduler
// and its ModelRunner (one struct, no field-by-field copies). Users configure
// the engine through engine/engine_config.h, which builds these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/enum_table.h"
#include "core/status.h"
#include "core/tensor.h"

namespace grpo {

struct LoraWeights;  // model/lora.h

// Element type of the KV cache (vLLM's kv_cache_dtype): automatic ("auto") = the
// model's dtype; fp8_e4m3 ("fp8", "fp8_e4m3") = OCP FP8 E4M3, one byte per element,
// K/V rounded to nearest even on write with scale 1.0 (values beyond ±448 saturate).
// Halves (bf16) or quarters (f32) the KV memory and reads; needs head_dim % 16 == 0.
enum class KvCacheDtype { automatic, fp8_e4m3 };
std::span<const EnumName<KvCacheDtype>> kv_cache_dtype_names();  // auto, fp8, fp8_e4m3

// Speculative decoding (engine/speculative.h): off, a draft model, or n-gram prompt lookup.
enum class SpecMethod { off, draft, ngram };
std::span<const EnumName<SpecMethod>> spec_method_names();  // off, draft, ngram
// How a verified draft is kept at temperature > 0 (greedy rows always keep a draft iff it is
// the argmax): rejection = speculative sampling (min(1, p/q), residual resample; outputs follow
// the target's distribution exactly, more drafts kept); match = kept iff it equals the target's
// own seeded sample there (outputs identical to plain decoding token for token, for any k).
enum class SpecAcceptance { rejection, match };
std::span<const EnumName<SpecAcceptance>> spec_acceptance_names();  // rejection, match

// Resolved [engine.speculative] settings (engine/engine_config.h's SpeculativeConfig builds them).
struct SpeculativeOptions {
  SpecMethod method = SpecMethod::off;
  std::string draft_model;         // HF directory of the draft (method draft; the caller loads it and
                                   // checks it is set; the engine takes the weights)
  int num_speculative_tokens = 4;  // k: drafts per step at most
  int ngram_min = 1, ngram_max = 4;  // prompt-lookup suffix lengths tried (longest first)
  bool adaptive = true;            // lower k / stop drafting when the cost model predicts a loss
  int probe_every = 32;            // adaptive: steps between probe steps while drafting is off
  SpecAcceptance acceptance = SpecAcceptance::rejection;
  // A draft vocabulary (FR-Spec): the draft's LM head keeps only these token ids' rows, so a
  // draft step reads and scores a fraction of the vocabulary. Exact whatever the subset: the
  // draft's q is 0 outside it and the target's test and residual draw cover every id.
  std::string draft_vocab;         // JSON file of token ids, most useful first (grpo draft-vocab writes one)
  int draft_vocab_size = 0;        // keep the first N ids of draft_vocab (0: all)
  std::vector<int32_t> draft_vocab_ids;  // resolved (spec_resolve_draft_vocab); empty: the full vocabulary
  // Errors name "<prefix><key>".
  Status validate(const std::string& prefix = "engine.speculative.") const;
  bool enabled() const { return method != SpecMethod::off; }
};

// Resolved engine settings (engine/engine_config.h builds them from the user's
// [engine] section). The scheduler and the model runner read this one struct.
struct EngineOptions {
  int block_size = 16;
  size_t kv_cache_bytes = size_t(256) << 20;  // memory budget of the KV pool
  int n_kv_blocks = 0;                         // > 0: use exactly this many blocks instead
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;                       // 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  bool use_cuda_graphs = false;                // capture decode steps (CUDA only)
  int cuda_graph_max_context = 0;              // graphs serve contexts up to this (0: min(max_model_len, 2048))
  std::vector<int> cuda_graph_batch_sizes;     // empty: 1, 2, 4, 8, then multiples of 8 up to max_num_seqs
                                               // (speculative: up to max_num_seqs · (k + 1) rows, at most 512)
  uint64_t seed = 0;                           // keys of requests without a seed
  std::vector<int> eos_token_ids;              // empty: the tokenizer's, else config.json's
  KvCacheDtype kv_cache_dtype = KvCacheDtype::automatic;
  // LoRA adapters every request runs with (unmerged; e.g. those `grpo train` trains in
  // place), or null. Their buffers are read in place by every step and by the captured
  // graphs: update them in place, never rebind. Must outlive the engine.
  const LoraWeights* lora = nullptr;
  // Resident LoRA adapters a request picks with SamplingParams::lora_slot (each must
  // outlive the engine; same dtype and device as the weights). Rows are grouped by
  // adapter in each step; a slot's tensors may be rewritten in place between steps;
  // steps mixing adapters other than `lora` run eagerly (graphs hold `lora` on every row).
  // A null entry is an empty slot that Engine::set_lora_slot can fill while the engine runs.
  std::vector<const LoraWeights*> lora_slots;
  // The largest LoRA rank any adapter may have, now or loaded later (sizes the forward's
  // scratch). 0: the largest rank among `lora` and `lora_slots`.
  int max_lora_rank = 0;
  SpeculativeOptions speculative;              // [engine.speculative] (engine/speculative.h)
  // Bitwise on-policy logprobs (docs/bitwise.md): every sampled row's logprobs are
  // recomputed from its final hidden row by the trainer's own LM-head logprob kernel
  // (kernels/logprob.h) over the full vocabulary: logprob_raw at temperature 1,
  // logprob_processed at the row's temperature (0 counts as 1; banned ids and the
  // top-k/top-p/min-p filters do not enter it, as the trainer scores neither). With a
  // deterministic Context this equals the trainer's forward bit for bit. CPU only for
  // now; needs kv_cache_dtype auto and no speculative decoding.
  bool bitwise_logprobs = false;
  Status validate() const;
};

// What the engine derives from the options and the model before building its
// parts: KV blocks in the pool, context length and KV element type.
struct EngineGeometry {
  int n_blocks = 0;        // > 0
  int max_model_len = 0;   // > 0
  DType kv_dtype = DType::f32;  // the weights' dtype, or f8e4m3 (head_dim % 16 == 0)
  int max_logit_rows = 0;  // logits rows per step at most (0: max_num_seqs; speculative verify needs more)
};

}  // namespace grpo
