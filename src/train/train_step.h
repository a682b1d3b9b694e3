// One optimizer step of GRPO or SFT over a list of samples: micro-batches
// (gradient accumulation) of packed sequences through the training forward,
// the loss normalised over the whole step (train/grpo_loss.h), backward into
// the optimizer's gradient arena, then clipping + AdamW. Also the no-grad
// logprob pass used for reference logprobs (β > 0) and stored old logprobs
// (num_iterations > 1).
#pragma once
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/train_model.h"
#include "train/grpo_loss.h"
#include "train/optimizer.h"

namespace grpo {

// One completion and everything the loss needs about it. Per-token vectors
// have one entry per completion token or are empty (= not given).
struct GrpoSample {
  std::vector<int32_t> prompt;      // >= 1 token
  std::vector<int32_t> completion;  // >= 1 token
  float advantage = 0.f;            // train/advantages.h
  bool truncated = false;           // hit max_completion_length without EOS
  std::vector<float> rollout_logp;  // sampling logprobs from the engine (IS correction, mismatch metrics)
  std::vector<float> old_logp;      // policy at generation time (num_iterations > 1); empty = on-policy
  std::vector<float> ref_logp;      // reference model (required when β ≠ 0)
  std::vector<float> weights;       // per-token loss weights (tandem training)
  std::vector<float> mask;          // 0/1 completion mask (e.g. tool output tokens)
};

struct MicroBatchOptions {
  int max_tokens = 8192;  // packed tokens per micro-batch (a longer sequence gets one of its own)
  int max_seqs = 0;       // sequences per micro-batch; 0 = no limit
};

// Splits sequences (kept in order) into micro-batches under the limits:
// returns [begin, end) ranges of sequence indices.
std::vector<std::pair<int, int>> plan_micro_batches(const std::vector<int>& seq_tokens, const MicroBatchOptions& mb);

// Completion logprobs of every sample under `w` (no activations kept).
Result<std::vector<std::vector<float>>> compute_logprobs(Context& ctx, TrainModel& m, const ModelWeights& w,
                                                         const std::vector<GrpoSample>& samples,
                                                         const MicroBatchOptions& mb);

struct DataParallel;  // train/data_parallel.h

// Σ_t m_t·w_t over the completion tokens (after truncation masking): dapo/cispo's N_items.
double grpo_count_loss_tokens(const std::vector<GrpoSample>& samples, bool mask_truncated_completions);

struct GrpoStepOptions {
  GrpoLossConfig loss;
  MicroBatchOptions micro;
  // dapo's N_items: completion tokens (after truncation masking) of the whole
  // generation batch / number of processes; 0 = counted over `samples`.
  double dapo_num_items = 0;
  // Sequences of the whole step for grpo / dr_grpo; 0 = samples.size().
  int n_seqs_total = 0;
  // Data parallel: gradients are summed over ranks (and ZeRO-1 applied) before
  // the optimizer step; the two normalisers above must then be the global ones.
  const DataParallel* dp = nullptr;
};

struct StepStats {
  GrpoMetrics metrics;    // merged over micro-batches (loss = the step's loss)
  OptimStepStats optim;
  int n_micro = 0;
  int64_t n_tokens = 0;   // packed tokens processed
  // Data parallel: seconds inside the gradient all-reduce, and the part of them
  // the step waited for after the backward (all of it without overlap).
  double allreduce_s = 0, allreduce_exposed_s = 0;
};

// Zeroes the gradients, accumulates all micro-batches, steps the optimizer with `lr`.
Result<StepStats> grpo_train_step(Context& ctx, TrainModel& m, ModelWeights& w, Optimizer& opt, double lr,
                                  const std::vector<GrpoSample>& samples, const GrpoStepOptions& opt_step);

// Supervised step: cross-entropy on completion tokens (mask honoured), mean
// over all masked completion tokens of the step. Only prompt/completion/mask are read.
Result<StepStats> sft_train_step(Context& ctx, TrainModel& m, ModelWeights& w, Optimizer& opt, double lr,
                                 const std::vector<GrpoSample>& samples, const MicroBatchOptions& mb);

}  // namespace grpo
