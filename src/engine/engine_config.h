// The user-facing engine configuration: the `[engine]` section of a run config
// and the engine flags of `grpo generate` (cli/engine_flags.h) hold this one
// struct, and engine_options_from_config() turns it, with the device, the
// model and the memory the process already holds, into the EngineOptions the
// engine runs with. Enum-like values are parsed once, through one name table
// each (kv_cache_dtype_names(), cuda_graphs_names()).
//
// KV pool size (vLLM's meaning of gpu_memory_utilization): the process may use
// that fraction of the device's total memory; the pool gets what is left after
// the weights, the optimizer state (master weights, moments, gradients), the
// reference model, the trainer's activation workspace, the engine's own step
// buffers and whatever else is in use on the device when the engine is built
// (CUDA context, cuBLAS workspace, other processes). kv_cache_mib > 0 sets the
// budget directly; on the CPU the default budget is kCpuKvCacheMib.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/enum_table.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/engine.h"
#include "model/config.h"

namespace grpo {

enum class CudaGraphsMode { automatic, on, off };  // automatic: on when the device is CUDA
std::span<const EnumName<CudaGraphsMode>> cuda_graphs_names();  // auto, on, off

inline constexpr int64_t kCpuKvCacheMib = 256;

// [engine.speculative] (engine/speculative.h; flags --spec, --draft-model, ... in cli/engine_flags.h).
struct SpeculativeConfig {
  SpecMethod method = SpecMethod::off;     // off | draft | ngram (spec_method_names())
  std::string draft_model;                 // HF directory of the draft model (method draft)
  int64_t num_speculative_tokens = 4;      // k: drafts per step at most
  int64_t ngram_min = 1, ngram_max = 4;    // prompt-lookup suffix lengths tried (longest first)
  bool adaptive = true;                    // pick k per step from a run-time cost model (0 = plain decoding)
  int64_t probe_every = 32;                // adaptive: steps between probe steps while drafting is off
  SpecAcceptance acceptance = SpecAcceptance::rejection;  // rejection | match (spec_acceptance_names())
  std::string draft_vocab;                 // JSON file of the draft's token ids (FR-Spec; "" = full vocabulary)
  int64_t draft_vocab_size = 0;            // first N ids of draft_vocab (0: all)
  SpeculativeOptions options() const;      // the engine's copy (ranges unchecked; see validate)
};

struct EngineConfig {
  int64_t block_size = 16;                 // tokens per KV block
  int64_t max_num_seqs = 0;                // running sequences at most; 0: the caller's default (train: B·G up to 256)
  int64_t max_num_batched_tokens = 8192;   // tokens per forward at most
  int64_t max_model_len = 0;               // context length; 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  CudaGraphsMode cuda_graphs = CudaGraphsMode::automatic;
  int64_t cuda_graph_max_context = 0;      // decode graphs serve contexts up to this; 0: min(max_model_len, 2048)
  KvCacheDtype kv_cache_dtype = KvCacheDtype::automatic;
  double gpu_memory_utilization = 0.9;     // fraction of the device's total memory the process may use
  int64_t kv_cache_mib = 0;                // > 0: KV budget in MiB (overrides gpu_memory_utilization)
  SpeculativeConfig speculative;           // [engine.speculative]

  // Range checks; messages name "<prefix><key>" (prefix "engine." in a run config, "--" style for flags is
  // the CLI's business) and the allowed values.
  Status validate(const std::string& prefix = "engine.") const;
};

// Bytes on the engine's device besides the KV pool. Fill what is known; the
// budget is total·utilization − sum().
struct MemoryUse {
  size_t total = 0;           // device memory (0: unknown, e.g. the CPU)
  size_t weights = 0;         // the weights the engine reads (shared with the trainer)
  size_t optimizer = 0;       // master weights, moments, gradients
  size_t reference = 0;       // frozen reference model (β > 0)
  size_t activations = 0;     // the trainer's workspace at its largest micro-batch
  size_t engine_buffers = 0;  // the engine's step inputs, forward scratch and logits
  size_t other = 0;           // anything else in use (context, workspaces, other processes)
  size_t sum() const { return weights + optimizer + reference + activations + engine_buffers + other; }
};

// The KV budget in bytes: kv_cache_mib if set; else on the CPU kCpuKvCacheMib;
// else total·gpu_memory_utilization − mem.sum(). An error names the key, shows
// the breakdown and what to change when nothing (or not one block of
// `block_bytes`) is left.
Result<size_t> engine_kv_budget(const EngineConfig& c, Device dev, const MemoryUse& mem, size_t block_bytes);

// Device bytes of the engine's own buffers for these options (forward scratch,
// step inputs, logits, rope table): what MemoryUse::engine_buffers should hold.
size_t engine_buffer_bytes(const ModelConfig& mc, DType model_dtype, int max_num_seqs, int max_num_batched_tokens,
                           int max_model_len, int block_size);

// EngineOptions for a model of dtype model_dtype on `dev`. default_max_num_seqs
// is used when c.max_num_seqs == 0. mem.engine_buffers is computed here (the
// caller leaves it 0). The seed and EOS ids are the caller's. A draft model's
// (engine.speculative) weights belong in mem.weights; its KV pool shares the budget
// (the engine divides it by the bytes of one block of both pools).
Result<EngineOptions> engine_options_from_config(const EngineConfig& c, Device dev, const ModelConfig& mc,
                                                 DType model_dtype, MemoryUse mem, int default_max_num_seqs);

// Bytes in use on the current CUDA device and its total (both 0 without CUDA).
void device_memory_in_use(size_t* used, size_t* total);

}  // namespace grpo
