// Memory planner of data-parallel runs (see memory_plan.h).
#include "train/memory_plan.h"

#include <cstdio>

#include "dist/communicator.h"
#include "engine/model_runner.h"
#include "model/train_model.h"
#include "model/weights.h"

namespace grpo {

std::vector<MemoryPlanRow> memory_plan(const MemoryPlanInput& in, const std::vector<int>& ranks) {
  std::vector<MemoryPlanRow> out;
  const int64_t n = weights_numel(in.model);
  const size_t es = dtype_size(in.dtype);
  const size_t block = kv_block_bytes(in.model, in.dtype, in.block_size);
  const double budget = in.device_gib * 1073741824.0 * in.gpu_memory_utilization;
  for (int zero : {0, 1})
    for (int nr : ranks) {
      MemoryPlanRow r;
      r.ranks = nr;
      r.zero_stage = zero;
      r.n_params = n;
      const std::vector<int64_t> b = split_even(n, zero == 1 ? nr : 1);
      const size_t state = size_t(b[1] - b[0]) * 4;  // rank 0 holds the largest shard
      r.weights = size_t(n) * es;
      r.grads = size_t(n) * 4;
      r.master = in.dtype == DType::f32 ? 0 : state;
      r.adam_m = r.adam_v = state;
      r.reference = in.reference ? r.weights : 0;
      r.activations = in.micro_batch_tokens > 0
                          ? train_model_activation_bytes(in.model, in.dtype, in.micro_batch_tokens, in.recompute)
                          : 0;
      r.engine_buffers = in.engine_buffers;
      r.kv_pool = budget - double(r.fixed());
      r.kv_tokens = r.kv_pool > 0 && block > 0 ? int64_t(r.kv_pool / double(block)) * in.block_size : 0;
      out.push_back(r);
    }
  return out;
}

std::string memory_plan_table(const MemoryPlanInput& in, const std::vector<MemoryPlanRow>& rows) {
  auto gib = [](double b) { return b / 1073741824.0; };
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "%lld parameters (arena), weights %s, device %.0f GiB x %.2f utilisation; GiB per GPU:\n",
                rows.empty() ? 0LL : (long long)rows[0].n_params, dtype_name(in.dtype), in.device_gib,
                in.gpu_memory_utilization);
  s += line;
  s += "| ZeRO | ranks | weights | grads f32 | master f32 | Adam m | Adam v | reference | activations | engine | "
       "total w/o KV | KV pool left | KV tokens |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    char kv[64];
    if (r.kv_pool > 0) std::snprintf(kv, sizeof kv, "%.2f", gib(r.kv_pool));
    else std::snprintf(kv, sizeof kv, "does not fit (%.2f over)", gib(-r.kv_pool));
    std::snprintf(line, sizeof line,
                  "| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %lld |\n",
                  r.zero_stage, r.ranks, gib(double(r.weights)), gib(double(r.grads)), gib(double(r.master)),
                  gib(double(r.adam_m)), gib(double(r.adam_v)), gib(double(r.reference)), gib(double(r.activations)),
                  gib(double(r.engine_buffers)), gib(double(r.fixed())), kv, (long long)r.kv_tokens);
    s += line;
  }
  return s;
}

}  // namespace grpo
