// Trainer side of the GRPO loop: one optimizer step over a slice of a rollout
// batch, through train/train_step.h (packed micro-batches, GRPO loss against
// the rollout logprobs, backward, clipping, AdamW writing the very weights the
// engine reads). Reference logprobs (β > 0) come from a frozen copy first.
//
// Micro-batches: at most micro_batch sequences (and micro_tokens packed tokens) each,
// and at least grad_accum of them when the slice allows. The loss is
// normalised over the whole slice (S_tot = slice size; dapo: the slice's
// unmasked completion tokens — TRL's num_items_in_batch when one generation
// batch feeds one step), so the micro-batch split does not change the step.
#pragma once
#include <cstddef>
#include <memory>

#include "core/context.h"
#include "model/train_model.h"
#include "model/weights.h"
#include "train/grpo_loss.h"
#include "train/loop_rollout.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/train_step.h"

namespace grpo {

struct DataParallel;

struct PolicyTrainer {
  Context* ctx = nullptr;
  ModelWeights* w = nullptr;                 // the weights the engine reads (written in place)
  std::unique_ptr<ModelWeights> ref;         // frozen reference when β > 0
  // LoRA: the adapters trained (model.lora points at them; the engine reads them in
  // place). With β > 0 the reference is the base, i.e. *w without the adapters.
  std::unique_ptr<LoraWeights> lora;
  TrainModel model;
  Optimizer opt;
  GrpoLossConfig loss;
  LrSchedule sched;
  int micro_batch = 8;
  int micro_tokens = 8192;  // packed tokens per micro-batch at most
  int grad_accum = 1;
  const DataParallel* dp = nullptr;  // data-parallel ranks (train/data_parallel.h); nullptr = one rank
};

// Whether the loss needs reference logprobs: a frozen copy (ref), or with LoRA and
// β > 0 the base weights with the adapters off.
bool policy_has_reference(const PolicyTrainer& t);
// The reference policy's logprobs of `samples` (policy_has_reference must hold).
Result<std::vector<std::vector<float>>> policy_reference_logprobs(PolicyTrainer& t, const std::vector<GrpoSample>& samples,
                                                                  const MicroBatchOptions& mb);

// The trainer's logprobs of every completion of `batch` under `w`, computed on `ctx`
// with `m` (no gradients) in the micro-batches policy_train_step would use for the
// whole batch: TRL's old_per_token_logps. The asynchronous loop calls it on the
// rollout side with the weights that sampled the batch (train/loop_async.h).
Result<std::vector<std::vector<float>>> policy_batch_logprobs(const PolicyTrainer& t, Context& ctx, TrainModel& m,
                                                              const ModelWeights& w, const RolloutBatch& batch);

// One optimizer step over completions [begin, end) of `batch`, as TRL's
// GRPOTrainer: with use_old_logp (μ > 1 or several optimizer steps per
// generation: the weights move between sampling and some of these steps) the
// ratio is taken against the trainer's own logprobs under the weights that
// generated the batch (batch.old_logp, computed by the first call on the
// batch, which must come before any optimizer step since generation, unless
// the batch arrives with them: asynchronous rollouts);
// otherwise against the detached current logprobs, which are then the same
// numbers. The importance-sampling correction (loss.is_mode) compares those
// generation-time trainer logprobs with the sampler's (the completions'
// logprobs), so it sees the rollout/trainer mismatch in either case.
// Metrics: loss, kl, entropy, clip_ratio{,/low,/high}, grad_norm, lr,
// logprob_mismatch/{max,mean}, rollout_kl, is_ratio/{mean,min,max,capped_frac}
// (when is_mode ≠ none), time/train, train/tokens_per_s.
Result<MetricList> policy_train_step(PolicyTrainer& t, RolloutBatch& batch, size_t begin, size_t end,
                                     bool use_old_logp);

}  // namespace grpo
