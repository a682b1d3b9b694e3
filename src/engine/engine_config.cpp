// Engine configuration -> EngineOptions, and the KV pool's memory budget (see engine_config.h).
#include "engine/engine_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/model_runner.h"
#include "engine/speculative.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo {

namespace {

std::string mib(size_t bytes) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << double(bytes) / double(1 << 20) << " MiB";
  return s.str();
}

}  // namespace

std::span<const EnumName<CudaGraphsMode>> cuda_graphs_names() {
  static constexpr EnumName<CudaGraphsMode> names[] = {
      {"auto", CudaGraphsMode::automatic}, {"on", CudaGraphsMode::on}, {"off", CudaGraphsMode::off}};
  return names;
}

Status EngineConfig::validate(const std::string& prefix) const {
  auto bad = [&](const char* key, const std::string& value, const std::string& why) {
    return error_status(prefix + key + " = " + value + ": " + why);
  };
  auto n = [](int64_t v) { return std::to_string(v); };
  if (block_size < 1 || block_size > 1024) return bad("block_size", n(block_size), "must be in 1..1024");
  if (max_num_seqs < 0 || max_num_seqs > 65536)
    return bad("max_num_seqs", n(max_num_seqs), "must be in 0..65536 (0 = the default)");
  if (max_num_batched_tokens < 1 || max_num_batched_tokens > (int64_t(1) << 24))
    return bad("max_num_batched_tokens", n(max_num_batched_tokens), "must be in 1..16777216");
  if (max_num_seqs > max_num_batched_tokens)
    return bad("max_num_seqs", n(max_num_seqs),
               "must be <= max_num_batched_tokens (" + n(max_num_batched_tokens) +
                   "), or running sequences could miss their decode steps");
  if (max_model_len < 0 || max_model_len > (int64_t(1) << 24))
    return bad("max_model_len", n(max_model_len), "must be in 0..16777216 (0 = the model's)");
  if (cuda_graph_max_context < 0)
    return bad("cuda_graph_max_context", n(cuda_graph_max_context), "must be >= 0 (0 = min(max_model_len, 2048))");
  std::ostringstream u;
  u << gpu_memory_utilization;
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
    return bad("gpu_memory_utilization", u.str(), "must be in (0, 1] (a fraction of the device's total memory)");
  if (kv_cache_mib < 0 || kv_cache_mib > (int64_t(1) << 30))
    return bad("kv_cache_mib", n(kv_cache_mib), "must be >= 0 (0 = from gpu_memory_utilization)");
  const SpeculativeConfig& sp = speculative;
  if (sp.method == SpecMethod::draft && sp.draft_model.empty())
    return bad("speculative.draft_model", "\"\"",
               "required with speculative.method = \"draft\" (a model with the same vocabulary), or use method "
               "\"ngram\"");
  if (sp.method != SpecMethod::draft && !sp.draft_model.empty())
    return bad("speculative.draft_model", "\"" + sp.draft_model + "\"",
               std::string("is set but speculative.method = \"") + spec_method_name(sp.method) +
                   "\"; set method = \"draft\"");
  auto in_int = [](int64_t v) { return v >= -(int64_t(1) << 30) && v <= (int64_t(1) << 30); };
  if (sp.method != SpecMethod::draft && !sp.draft_vocab.empty())
    return bad("speculative.draft_vocab", "\"" + sp.draft_vocab + "\"",
               std::string("is set but speculative.method = \"") + spec_method_name(sp.method) +
                   "\"; a draft vocabulary is for a draft model (method = \"draft\")");
  if (sp.draft_vocab_size < 0 || sp.draft_vocab_size > (int64_t(1) << 30))
    return bad("speculative.draft_vocab_size", n(sp.draft_vocab_size), "must be >= 0 (0 = every id of draft_vocab)");
  if (sp.draft_vocab_size > 0 && sp.draft_vocab.empty())
    return bad("speculative.draft_vocab_size", n(sp.draft_vocab_size),
               "needs speculative.draft_vocab (a JSON file of token ids, e.g. from `grpo draft-vocab`)");
  if (!in_int(sp.num_speculative_tokens) || !in_int(sp.ngram_min) || !in_int(sp.ngram_max) || !in_int(sp.probe_every))
    return bad("speculative", "{...}", "a count is out of range");
  return sp.options().validate(prefix + "speculative.");
}

SpeculativeOptions SpeculativeConfig::options() const {
  SpeculativeOptions o;
  o.method = method;
  o.draft_model = draft_model;
  o.num_speculative_tokens = int(num_speculative_tokens);
  o.ngram_min = int(ngram_min);
  o.ngram_max = int(ngram_max);
  o.adaptive = adaptive;
  o.probe_every = int(probe_every);
  o.acceptance = acceptance;
  o.draft_vocab = draft_vocab;
  o.draft_vocab_size = int(draft_vocab_size);
  return o;
}

Result<size_t> engine_kv_budget(const EngineConfig& c, Device dev, const MemoryUse& mem, size_t block_bytes) {
  size_t budget = 0;
  if (c.kv_cache_mib > 0) {
    budget = size_t(c.kv_cache_mib) << 20;
  } else if (dev == Device::cpu || mem.total == 0) {
    budget = size_t(kCpuKvCacheMib) << 20;
  } else {
    const double allowed = std::floor(double(mem.total) * c.gpu_memory_utilization);
    const double left = allowed - double(mem.sum());
    if (left < double(block_bytes)) {
      std::ostringstream s;
      s << "engine.gpu_memory_utilization = " << c.gpu_memory_utilization << ": the process may use "
        << mib(size_t(allowed)) << " of " << mib(mem.total) << ", but weights " << mib(mem.weights)
        << " + optimizer " << mib(mem.optimizer) << " + reference " << mib(mem.reference) << " + activations "
        << mib(mem.activations) << " + engine buffers " << mib(mem.engine_buffers) << " + other in use "
        << mib(mem.other) << " leave " << (left > 0 ? mib(size_t(left)) : std::string("nothing"))
        << " for the KV cache (one block is " << mib(block_bytes)
        << "); raise engine.gpu_memory_utilization, set engine.kv_cache_mib, or lower train.micro_batch / "
           "engine.max_num_seqs";
      return error_status(s.str());
    }
    budget = size_t(left);
  }
  if (budget < block_bytes)
    return error_status("engine.kv_cache_mib = " + std::to_string(c.kv_cache_mib) + ": smaller than one KV block (" +
                        mib(block_bytes) + "); raise it");
  return budget;
}

size_t engine_buffer_bytes(const ModelConfig& mc, DType model_dtype, int max_num_seqs, int max_num_batched_tokens,
                           int max_model_len, int block_size) {
  const size_t T = size_t(std::max(max_num_batched_tokens, max_num_seqs)), N = size_t(max_num_seqs);
  const size_t C = size_t(mc.hidden_size), F = size_t(mc.intermediate_size), D = size_t(mc.head_dim);
  const size_t Hq = size_t(mc.n_heads), V = size_t(mc.vocab_size), es = dtype_size(model_dtype);
  // Forward scratch (transformer.h): x, xn, qkv, q, attn, gate_up, act, logit rows.
  const size_t scratch = es * (T * (2 * C + size_t(mc.qkv_dim()) + 2 * Hq * D + 3 * F) + N * C);
  const size_t step_inputs = 4 * T * (5 + 4);  // tokens, positions, seq, slots, prefill tiles
  const size_t blocks_per_seq = (size_t(max_model_len) + size_t(block_size) - 1) / size_t(block_size);
  const size_t block_table = 4 * N * blocks_per_seq;
  const size_t logits = 4 * N * V;
  const size_t sampling = N * 64;
  const size_t rope = 2 * 4 * size_t(max_model_len) * D;
  return scratch + step_inputs + block_table + logits + sampling + rope;
}

Result<EngineOptions> engine_options_from_config(const EngineConfig& c, Device dev, const ModelConfig& mc,
                                                 DType model_dtype, MemoryUse mem, int default_max_num_seqs) {
  GRPO_TRY(c.validate());
  EngineOptions eo;
  eo.block_size = int(c.block_size);
  eo.max_num_seqs = int(c.max_num_seqs > 0 ? c.max_num_seqs : default_max_num_seqs);
  eo.max_num_batched_tokens = int(c.max_num_batched_tokens);
  if (eo.max_num_seqs > eo.max_num_batched_tokens)
    return error_status("engine.max_num_batched_tokens = " + std::to_string(eo.max_num_batched_tokens) +
                        ": smaller than the " + std::to_string(eo.max_num_seqs) +
                        " sequences a step may run (engine.max_num_seqs, 0 = the rollout batch); raise it or set "
                        "engine.max_num_seqs");
  eo.max_model_len = int(c.max_model_len);
  eo.enable_prefix_caching = c.enable_prefix_caching;
  eo.enable_chunked_prefill = c.enable_chunked_prefill;
  eo.use_cuda_graphs = dev == Device::cuda && c.cuda_graphs != CudaGraphsMode::off;
  if (c.cuda_graphs == CudaGraphsMode::on && dev != Device::cuda)
    return error_status("engine.cuda_graphs = \"on\": CUDA graphs need a CUDA device; use \"auto\" or \"off\"");
  eo.cuda_graph_max_context = int(c.cuda_graph_max_context);
  eo.kv_cache_dtype = c.kv_cache_dtype;
  eo.speculative = c.speculative.options();
  GRPO_TRY(spec_resolve_draft_vocab(eo.speculative, mc.vocab_size));
  GRPO_TRY(eo.validate());
  auto kv_dtype = engine_kv_cache_dtype(mc, model_dtype, eo);
  if (!kv_dtype.ok()) return kv_dtype.status().with_context("engine.kv_cache_dtype");
  const int max_len = eo.max_model_len > 0 ? eo.max_model_len : mc.max_position_embeddings;
  mem.engine_buffers =
      engine_buffer_bytes(mc, model_dtype, eo.max_num_seqs, eo.max_num_batched_tokens, max_len, eo.block_size);
  if (eo.speculative.enabled()) {
    // f32 (rows, V) buffers of speculative decoding: the verify's k extra logits rows per
    // sequence; with speculative sampling the target's dense p (k + 1 rows) and, with a draft
    // model, its q (k rows) and its own logits rows.
    const size_t N = size_t(eo.max_num_seqs), k = size_t(eo.speculative.num_speculative_tokens);
    const size_t row = 4 * size_t(mc.vocab_size);
    size_t rows = N * k;
    if (eo.speculative.acceptance == SpecAcceptance::rejection) {
      rows += N * (k + 1);
      if (eo.speculative.method == SpecMethod::draft) rows += N * k + N;
    }
    mem.engine_buffers += rows * row;
  }
  GRPO_ASSIGN_OR_RETURN(eo.kv_cache_bytes,
                        engine_kv_budget(c, dev, mem, kv_block_bytes(mc, kv_dtype.value(), eo.block_size)));
  GRPO_TRY(engine_kv_blocks(mc, model_dtype, eo).status());
  return eo;
}

void device_memory_in_use(size_t* used, size_t* total) {
  *used = 0;
  *total = 0;
#ifdef GRPO_HAVE_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return;
  *used = total_b - free_b;
  *total = total_b;
#endif
}

}  // namespace grpo
