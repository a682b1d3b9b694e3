// Data-parallel training over a Communicator (dist/communicator.h): the
// gradient all-reduce in buckets, ZeRO-1 (fp32 master weights and AdamW
// moments sharded by flat ranges of the parameter arena, each rank updating
// its range, the updated compute-dtype weights all-gathered), the gathering
// of sharded state for checkpoints, and the reduction of step and eval
// metrics. docs/distributed.md is the user's view.
//
// Equal-to-one-rank contract: ranks sum their gradients (not average) and
// every loss normaliser (sequence and token counts of the step) is the global
// one, so N ranks take the step one rank takes on the same global batch, up
// to the order of the floating-point sums. The gradient norm for clipping is
// taken over the full reduced gradient, which every rank holds.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "train/grad_reducer.h"
#include "train/metrics_writer.h"
#include "train/optimizer.h"

namespace grpo {

struct DataParallel {
  Communicator* comm = nullptr;
  int zero_stage = 0;
  int64_t bucket_elems = int64_t(25) << 18;  // 25 MiB of f32 per all-reduce call
  std::vector<int64_t> shard;                // ZeRO-1: size()+1 element bounds over the arena
  // dist.overlap_backward: buckets all-reduced during the backward (full-model
  // training; LoRA's small adapter gradients are reduced after it).
  std::shared_ptr<GradReducer> reducer;
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  int64_t shard_begin() const { return shard[size_t(rank())]; }
  int64_t shard_end() const { return shard[size_t(rank()) + 1]; }
};

// Sums opt.grad_arena over ranks, bucket by bucket.
Status dp_all_reduce_grads(Context& ctx, Optimizer& opt, const DataParallel& dp);

// Gradient all-reduce, then the AdamW step: the full step on every rank
// (zero_stage 0), or this rank's shard followed by the all-gather of the
// updated weights (zero_stage 1; opt must have been sharded). grads_reduced:
// the caller has all-reduced them already (GradReducer, or timed by itself).
Result<OptimStepStats> dp_optimizer_step(Context& ctx, Optimizer& opt, ModelWeights& params, double lr,
                                         const DataParallel& dp, bool grads_reduced = false);

// ZeRO-1: the element bounds (world+1) of each rank's shard of an n-element
// arena; optimizer_create(..., b[rank], b[rank+1]) allocates only that shard.
std::vector<int64_t> zero1_shards(int64_t n, int world);
// ZeRO-1: sets dp.shard from an optimizer created over this rank's shard.
void dp_adopt_shard(const Optimizer& opt, DataParallel& dp);

// ZeRO-1, collective: the full master / m / v assembled from every rank's
// shard as host tensors on rank 0 (other ranks get empty tensors), for the
// checkpoint writer. Moves through one bounded device buffer.
Optimizer optimizer_gather_for_checkpoint(Context& ctx, const Optimizer& opt, const ModelWeights& params,
                                          const DataParallel& dp, Status* st);

// Step metrics over ranks: sums for totals ("loss", token counts,
// throughputs, "train/micro_batches"), max for maxima and times, min for
// minima, the mean otherwise (ranks hold equal numbers of prompts).
Status dp_reduce_step_metrics(Communicator& comm, MetricList& m);
// Eval metrics over ranks, weighted by each rank's "eval/n".
Status dp_reduce_eval_metrics(Communicator& comm, MetricList& m);

}  // namespace grpo
