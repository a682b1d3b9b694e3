// Asynchronous rollouts for the GRPO loop (see loop_async.h).
#include "train/loop_async.h"

#include <algorithm>
#include <optional>

#include "core/check.h"
#include "core/log.h"
#include "core/timer.h"
#include "train/loop_setup.h"
#include "train/rollout_failover.h"

namespace grpo {

Status async_check_config(const RunConfig& cfg, int n_ranks) {
  if (cfg.async.max_staleness == 0) return ok_status();
  const std::string k = "async.max_staleness = " + std::to_string(cfg.async.max_staleness);
  if (cfg.train.num_iterations != 1 || cfg.train.steps_per_generation != 1)
    return error_status(k + " needs one optimizer step per generation batch (train.num_iterations = 1 and "
                            "train.steps_per_generation = 1); set those, or async.max_staleness = 0");
  if (n_ranks > 1)
    return error_status(k + ": asynchronous rollouts run on one rank; set async.max_staleness = 0 for data-parallel runs");
  const bool server = !cfg.rollout.server_url.empty();
  if (cfg.lora.enabled && !server)
    return error_status(k + ": the engine's weight snapshot does not cover LoRA adapters; set async.max_staleness = 0 "
                            "with [lora]");
  if (cfg.server.enabled)
    return error_status(k + ": [server] serves the engine between rollouts, which asynchronous rollouts never leave; "
                            "set server.enabled = false or async.max_staleness = 0");
  if (cfg.curriculum.type != CurriculumType::none)
    return error_status(k + ": the curriculum sizes each batch from the rewards of the batches before it, which are "
                            "not trained yet; set curriculum.type = \"none\" or async.max_staleness = 0");
  if (cfg.data.env == EnvKind::remote)
    return error_status(k + ": data.env = \"remote\" gets its groups from outside environments (see "
                            "remote.max_staleness); set async.max_staleness = 0");
  if (server && cfg.train.importance_sampling == IsMode::none)
    GRPO_LOG_WARN("%s with rollout.server_url: the trainer learns from samples of the previous policy version and "
                  "nothing corrects for it; train.importance_sampling = \"token_truncate\" is recommended "
                  "(docs/async.md)", k.c_str());
  return ok_status();
}

AsyncRollouts::AsyncRollouts(LoopRun& r)
    : r_(r), k_(r.cfg.async.max_staleness), server_(r.rollout_cfg.server != nullptr) {
  GRPO_CHECK(k_ > 0 && (server_ || (r_.snapshot && r_.engine_ctx)));
}

AsyncRollouts::~AsyncRollouts() {
  if (worker_.joinable()) worker_.join();
}

Status AsyncRollouts::refresh_snapshot(int64_t version) {
  if (server_) {  // the server's weights move through the bridge, after the join
    version_ = version;
    return ok_status();
  }
  // Outside any StreamScope tensor_copy orders itself against every stream, so the
  // engine's next kernels see the new weights; both sides are idle here anyway.
  r_.ctx->synchronize();
  r_.engine_ctx->synchronize();
  tensor_copy(r_.snapshot->arena, r_.weights->arena);
  version_ = version;
  r_.engine->reset_prefix_cache();
  return ok_status();
}

Result<AsyncRollouts::Queued> AsyncRollouts::produce(bool on_worker) {
  LoopRun& r = r_;
  Queued q;
  q.generation = r.state.generation;
  q.data_epoch = r.cursor->epoch();
  q.data_index = r.cursor->index();
  std::vector<PreparedPrompt> prompts;
  for (size_t i : r.cursor->next(size_t(r.cfg.rollout.prompts_per_step))) {
    auto p = prompt_prepare(r.format, *r.tok, r.env->example(Split::train, i));
    if (!p.ok()) return p.status();
    prompts.push_back(std::move(p).value());
  }
  RolloutConfig rc = r.rollout_cfg;
  rc.server_min_version = server_ ? loop_server_min_version(r, version_) : -1;
  rc.engine_may_sample = !on_worker || !server_;
  auto b = rollout_generate(*r.engine, *r.env, *r.rewards, std::move(prompts), rc, q.generation);
  if (!b.ok() && on_worker && rc.failover && rc.failover->down()) {
    // Launched while the server was up (launch()): this call lost it. join() samples the
    // generation again, from the same prompts.
    r.cursor->restore(q.data_epoch, q.data_index);
    q.server_lost = true;
    return q;
  }
  if (!b.ok()) return b.status().with_context("rollout of generation " + std::to_string(q.generation));
  q.batch = std::move(b).value();
  if (server_) {
    // No old logprobs: the trainer's own logprobs before its step stand in for them (ratio 1).
    // A batch of the server is tagged with the version it answered from (rollout_generate), and
    // train.importance_sampling compares those with the sampler's, which covers the lag. One of
    // the in-process engine (the server is lost) was sampled on the trainer's thread and weights:
    // the current version.
    if (q.batch.from_server) loop_note_server_version(r, q.batch.policy_version, version_);
    else q.batch.policy_version = version_;
    ++r.state.generation;
    return q;
  }
  q.batch.policy_version = version_;
  const double t0 = now_seconds();
  auto old = policy_batch_logprobs(r.trainer, *r.engine_ctx, r.engine_model, *r.snapshot, q.batch);
  if (!old.ok())
    return old.status().with_context("old logprobs of generation " + std::to_string(q.generation) +
                                     " under the weights of step " + std::to_string(version_));
  q.batch.old_logp = std::move(old).value();
  q.batch.metrics.emplace_back("time/old_logprobs", now_seconds() - t0);
  ++r.state.generation;
  return q;
}

Status AsyncRollouts::prime() {
  GRPO_CHECK(!launched_ && queue_.empty());
  const double t0 = now_seconds();
  GRPO_TRY(refresh_snapshot(r_.state.step));
  if (!server_) r_.engine_ctx->make_current();
  for (int64_t j = 0; j < k_ && r_.state.generation < r_.cfg.train.steps; ++j) {
    std::optional<StreamScope> scope;
    if (!server_) scope.emplace(*r_.engine_ctx);
    auto q = produce(false);
    if (!q.ok()) {
      r_.ctx->make_current();
      return q.status();
    }
    queue_.push_back(std::move(q).value());
  }
  r_.ctx->make_current();
  primed_ = true;
  prime_wait_ += now_seconds() - t0;
  return ok_status();
}

RolloutBatch AsyncRollouts::pop(MetricList* rec) {
  GRPO_CHECK(primed_ && !queue_.empty());
  Queued q = std::move(queue_.front());
  queue_.pop_front();
  const double lag = double(r_.state.step - q.batch.policy_version);
  rec->emplace_back("async/version_lag", lag);
  rec->emplace_back("async/policy_version", double(q.batch.policy_version));
  rec->emplace_back("async/queued", double(queue_.size()));
  return std::move(q.batch);
}

void AsyncRollouts::launch() {
  GRPO_CHECK(primed_ && !launched_);
  t_launch_ = now_seconds();
  if (r_.state.generation >= r_.cfg.train.steps) return;  // every batch the run trains on is sampled
  if (server_ && r_.rollout_cfg.failover && r_.rollout_cfg.failover->down()) {
    sample_at_join_ = true;  // the engine cannot sample beside the step
    return;
  }
  launched_ = true;
  worker_ = std::thread([this] {
    // The engine's allocations, frees and copies wait for its own stream only, never for
    // the training step beside it (core/context.h, StreamScope).
    std::optional<StreamScope> scope;
    if (!server_) {
      r_.engine_ctx->make_current();
      scope.emplace(*r_.engine_ctx);
    }
    in_flight_ = std::make_unique<Result<Queued>>(produce(true));
    t_done_ = now_seconds();
  });
}

Status AsyncRollouts::join(double t_train_end, int64_t new_version, MetricList* rec) {
  double wait = prime_wait_, idle = 0;
  prime_wait_ = 0;
  bool sample_here = sample_at_join_;
  sample_at_join_ = false;
  if (launched_) {
    worker_.join();
    launched_ = false;
    const double t_join = now_seconds();
    wait += std::max(0.0, t_join - t_train_end);
    idle = std::max(0.0, t_train_end - t_done_);
    Result<Queued> q = std::move(*in_flight_);
    in_flight_.reset();
    if (!q.ok()) return q.status();
    if (q.value().server_lost) sample_here = true;
    else queue_.push_back(std::move(q).value());
  } else {
    idle = std::max(0.0, t_train_end - t_launch_);  // nothing left to sample: the engine sat out the step
  }
  const double t0 = now_seconds();
  GRPO_TRY(refresh_snapshot(new_version));
  const double t_copy = now_seconds() - t0;
  if (sample_here) {  // the server is lost: the engine samples now, from the step's new weights
    const double t1 = now_seconds();
    auto q = produce(false);
    if (!q.ok()) return q.status();
    queue_.push_back(std::move(q).value());
    wait += now_seconds() - t1;
  }
  rec->emplace_back("time/trainer_wait", wait);
  rec->emplace_back("time/engine_idle", idle);
  rec->emplace_back("time/snapshot_copy", t_copy);
  return ok_status();
}

void AsyncRollouts::drain() {
  GRPO_CHECK(!launched_);
  if (!queue_.empty()) {
    const Queued& first = queue_.front();
    r_.cursor->restore(first.data_epoch, first.data_index);
    r_.state.generation = first.generation;
  }
  queue_.clear();
  primed_ = false;
}

}  // namespace grpo
