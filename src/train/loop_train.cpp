// One GRPO optimizer step over a slice of a rollout batch (see loop_train.h).
#include "train/loop_train.h"

#include <algorithm>

#include "core/check.h"
#include "core/timer.h"
#include "train/data_parallel.h"
#include "train/train_step.h"

namespace grpo {

namespace {

GrpoSample sample_of(const PolicyTrainer& t, const RolloutBatch& batch, size_t i) {
  const Completion& c = batch.completions[i];
  GrpoSample s;
  s.prompt = c.out.prompt_ids;
  s.completion = c.out.completion_ids;
  s.advantage = batch.advantages[i];
  s.truncated = c.truncated;
  s.rollout_logp = c.out.logprobs;
  s.weights = c.loss_weights;
  // Tandem rollouts: the loss compares with the trained model's logprobs, not the writer's.
  if (!c.out.model_mask.empty()) s.rollout_logp = c.out.logprobs_trained;
  return s;
}

MicroBatchOptions micro_options(const PolicyTrainer& t, size_t count) {
  const int accum = std::max(1, t.grad_accum);
  const int per_micro = (int(count) + accum - 1) / accum;
  MicroBatchOptions mb;
  mb.max_seqs = std::max(1, std::min(t.micro_batch, per_micro));
  mb.max_tokens = t.micro_tokens;
  return mb;
}

}  // namespace

Result<std::vector<std::vector<float>>> policy_batch_logprobs(const PolicyTrainer& t, Context& ctx, TrainModel& m,
                                                              const ModelWeights& w, const RolloutBatch& batch) {
  std::vector<GrpoSample> all;
  for (size_t i = 0; i < batch.completions.size(); ++i) all.push_back(sample_of(t, batch, i));
  return compute_logprobs(ctx, m, w, all, micro_options(t, batch.completions.size()));
}

bool policy_has_reference(const PolicyTrainer& t) { return t.ref || (t.lora && t.loss.beta != 0); }

Result<std::vector<std::vector<float>>> policy_reference_logprobs(PolicyTrainer& t, const std::vector<GrpoSample>& samples,
                                                                  const MicroBatchOptions& mb) {
  if (t.ref) return compute_logprobs(*t.ctx, t.model, *t.ref, samples, mb);
  GRPO_CHECK(t.lora);
  const LoraWeights* adapters = t.model.lora;
  t.model.lora = nullptr;  // the LoRA reference policy: the frozen base alone
  auto ref = compute_logprobs(*t.ctx, t.model, *t.w, samples, mb);
  t.model.lora = adapters;
  return ref;
}

Result<MetricList> policy_train_step(PolicyTrainer& t, RolloutBatch& batch, size_t begin, size_t end,
                                     bool use_old_logp) {
  GRPO_CHECK(t.ctx && t.w && begin < end && end <= batch.completions.size());
  Context& ctx = *t.ctx;
  const double t0 = now_seconds();
  if (use_old_logp && batch.old_logp.empty()) {
    // TRL's old_per_token_logps: one no-grad pass over the whole generation
    // batch while the weights are still those that sampled it.
    std::vector<GrpoSample> all;
    for (size_t i = 0; i < batch.completions.size(); ++i) all.push_back(sample_of(t, batch, i));
    auto old = compute_logprobs(ctx, t.model, *t.w, all, micro_options(t, end - begin));
    if (!old.ok()) return old.status().with_context("old logprobs of the generation batch");
    batch.old_logp = std::move(old).value();
  }
  std::vector<GrpoSample> samples;
  for (size_t i = begin; i < end; ++i) {
    samples.push_back(sample_of(t, batch, i));
    if (use_old_logp) samples.back().old_logp = batch.old_logp[i];
  }
  GrpoStepOptions so;
  so.loss = t.loss;
  so.micro = micro_options(t, samples.size());
  if (t.dp && t.dp->size() > 1) {
    // The loss normalisers of the global batch, so that N ranks take the one-rank step.
    std::vector<double> counts = {double(samples.size()),
                                  grpo_count_loss_tokens(samples, t.loss.mask_truncated_completions)};
    GRPO_TRY(t.dp->comm->all_reduce_host(counts, HostReduce::sum).with_context("loss normalisers"));
    so.n_seqs_total = int(counts[0]);
    if (t.loss.loss_type == LossType::dapo || t.loss.loss_type == LossType::cispo)
      so.dapo_num_items = std::max(1.0, counts[1]);
  }
  so.dp = t.dp;
  if (policy_has_reference(t)) {
    auto ref = policy_reference_logprobs(t, samples, so.micro);
    if (!ref.ok()) return ref.status().with_context("reference logprobs");
    for (size_t i = 0; i < samples.size(); ++i) samples[i].ref_logp = std::move(ref.value()[i]);
  }
  const double lr = lr_at(t.sched, t.opt.step);
  auto step = grpo_train_step(ctx, t.model, *t.w, t.opt, lr, samples, so);
  if (!step.ok()) return step.status();
  ctx.synchronize();
  const double t1 = now_seconds();
  const GrpoMetrics& g = step.value().metrics;
  const OptimStepStats& os = step.value().optim;

  MetricList m;
  m.emplace_back("loss", g.loss);
  m.emplace_back("kl", g.kl_mean());
  m.emplace_back("entropy", g.entropy_mean());
  m.emplace_back("clip_ratio", g.clip_region_frac());
  m.emplace_back("clip_ratio/low", g.clip_low_frac());
  m.emplace_back("clip_ratio/high", g.clip_high_frac());
  m.emplace_back("grad_norm", os.grad_norm);
  m.emplace_back("grad_clip_scale", os.clip_scale);
  m.emplace_back("lr", lr);
  m.emplace_back("optimizer/skipped", os.skipped ? 1.0 : 0.0);
  m.emplace_back("logprob_mismatch/max", g.roll_abs_max);
  m.emplace_back("logprob_mismatch/mean", g.rollout_abs_diff_mean());
  m.emplace_back("rollout_kl", g.rollout_kl());
  if (t.loss.is_mode != IsMode::none) {
    m.emplace_back("is_ratio/mean", g.is_mean());
    m.emplace_back("is_ratio/min", g.is_min_value());
    m.emplace_back("is_ratio/max", g.is_max);
    m.emplace_back("is_ratio/capped_frac", g.is_capped_frac());
  }
  m.emplace_back("train/micro_batches", double(step.value().n_micro));
  if (t.dp) {
    m.emplace_back("time/allreduce", step.value().allreduce_s);
    m.emplace_back("time/allreduce_exposed", step.value().allreduce_exposed_s);
  }
  m.emplace_back("time/train", t1 - t0);
  m.emplace_back("train/tokens_per_s", t1 > t0 ? double(step.value().n_tokens) / (t1 - t0) : 0.0);
  return m;
}

}  // namespace grpo
