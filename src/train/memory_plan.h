// Per-GPU memory of a data-parallel training run, before it starts (`grpo
// plan-memory`): the weights, gradients, fp32 master, AdamW moments and
// activation estimate this codebase allocates for a model config, for ZeRO-0
// (replicated optimizer state) and ZeRO-1 (sharded) at several rank counts,
// and the KV pool the engine would get from what is left (engine_config.h's
// rule: total·gpu_memory_utilization minus everything else).
//
// The byte counts follow the allocations exactly: the parameter arena
// (weights_numel, each tensor padded to 16 elements), f32 gradients over the
// whole arena on every rank, the f32 master only when the weights are not f32,
// m and v (and the master) over the largest rank's shard (split_even: the
// first n % N ranks hold one element more).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace grpo {

struct MemoryPlanInput {
  ModelConfig model;
  DType dtype = DType::bf16;       // weights the engine reads
  int64_t micro_batch_tokens = 0;  // packed tokens of the largest micro-batch (activations)
  bool recompute = false;          // train.activation_recompute
  bool reference = false;          // β > 0: a frozen reference copy of the weights
  size_t engine_buffers = 0;       // the engine's own step buffers (engine_buffer_bytes)
  double device_gib = 80;          // device memory
  double gpu_memory_utilization = 0.9;
  int block_size = 16;             // KV block, to count the tokens the pool holds
};

struct MemoryPlanRow {
  int ranks = 1, zero_stage = 0;
  int64_t n_params = 0;  // arena elements (weights_numel)
  size_t weights = 0, grads = 0, master = 0, adam_m = 0, adam_v = 0, reference = 0, activations = 0,
         engine_buffers = 0;
  size_t fixed() const { return weights + grads + master + adam_m + adam_v + reference + activations + engine_buffers; }
  double kv_pool = 0;        // bytes left for the KV pool; < 0: the rest does not fit the budget
  int64_t kv_tokens = 0;     // tokens the pool holds (0 when it does not fit)
};

std::vector<MemoryPlanRow> memory_plan(const MemoryPlanInput& in, const std::vector<int>& ranks);

// The table as text (MiB/GiB columns), one row per (zero_stage, ranks).
std::string memory_plan_table(const MemoryPlanInput& in, const std::vector<MemoryPlanRow>& rows);

}  // namespace grpo
