// The data.env = "remote" training loop (see loop_remote.h).
#include "train/loop_remote.h"

#include <chrono>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "engine/engine_service.h"
#include "train/remote_batch.h"
#include "train/train_step.h"

namespace grpo {

using json = nlohmann::json;

json remote_registration(const LoopRun& r) {
  const RunConfig& c = r.cfg;
  return json{{"wandb_group", c.remote.wandb_group},
              {"wandb_project", c.remote.wandb_project},
              {"batch_size", c.rollout.prompts_per_step * c.rollout.num_generations},
              {"max_token_len", int64_t(r.weights->config.max_position_embeddings)},
              {"checkpoint_dir", r.out_dir},
              {"save_checkpoint_interval", c.checkpoint.every > 0 ? c.checkpoint.every : c.train.steps},
              {"starting_step", r.state.step},
              {"num_steps", c.train.steps}};
}

namespace {

double find(const MetricList& m, const std::string& k, double d) {
  for (const auto& [n, v] : m)
    if (n == k) return v;
  return d;
}

// Waits for the next batch, logging why it waits; errors only past remote.max_wait.
// Returns null when a stop was requested (opt.stop_signal) while waiting.
Result<json> wait_batch(const RunConfig& cfg, const TrainLoopOptions& opt, TrajectorySource& src, std::FILE* con,
                        int64_t* n_source_errors) {
  const double t0 = now_seconds();
  double next_log = t0 + cfg.remote.wait_log_every;
  std::string last_error;
  for (;;) {
    if (opt.stop_signal && opt.stop_signal->load() != 0) return json();
    auto b = src.next_batch();
    if (b.ok() && b.value()) return std::move(*b.value());
    if (!b.ok()) {
      ++*n_source_errors;
      last_error = b.status().message();
    }
    const double now = now_seconds();
    if (cfg.remote.max_wait > 0 && now - t0 > cfg.remote.max_wait)
      return error_status("no batch of scored groups within remote.max_wait = " + std::to_string(cfg.remote.max_wait) +
                          " s (" + (last_error.empty() ? src.wait_status() : last_error) +
                          "); start an environment that posts to the trajectory API (docs/environments.md)");
    if (now >= next_log) {
      const std::string why = last_error.empty() ? src.wait_status() : "source error: " + last_error;
      if (con) std::fprintf(con, "\ngrpo train: waiting %.0f s for groups: %s\n", now - t0, why.c_str());
      GRPO_LOG_INFO("waiting for groups: %s", why.c_str());
      next_log = now + cfg.remote.wait_log_every;
      last_error.clear();
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.remote.poll_interval));
  }
}

}  // namespace

Result<bool> remote_train_loop(LoopRun& r, const TrainLoopOptions& opt, TrajectorySource& src, EngineService* svc,
                               const RemoteLoopHooks& hooks) {
  const RunConfig& cfg = r.cfg;
  TrainerState& st = r.state;
  PolicyTrainer& t = r.trainer;
  GRPO_TRY(src.register_trainer(remote_registration(r)).with_context("[remote]"));
  if (r.resumed && !st.trajectory_queue.is_null()) {
    // Groups posted before the checkpoint come back, and environments keep their ids.
    GRPO_TRY(src.restore_checkpoint_state(st.trajectory_queue).with_context("resuming the trajectory queue"));
    GRPO_LOG_INFO("resumed the trajectory queue of the checkpoint at step %lld", (long long)st.step);
  }
  RemoteBatchOptions bo;
  bo.scale = r.rollout_cfg.scale;
  bo.max_staleness = cfg.remote.max_staleness;
  bo.stale_drop = cfg.remote.stale == StalePolicy::drop;
  bo.stale_weight = cfg.remote.stale_weight;
  bo.vocab_size = r.weights->config.vocab_size;
  bo.max_seq_len = r.weights->config.max_position_embeddings;
  int64_t steps_this_run = 0, source_errors = 0, empty_batches = 0;
  bool ckpt_due = false;
  while (st.step < cfg.train.steps && !(opt.stop_signal && opt.stop_signal->load() != 0)) {
    const double t_wait = now_seconds();
    json raw;
    auto ready = src.next_batch();
    if (ready.ok() && ready.value()) {
      raw = std::move(*ready.value());  // formed already: the service stays paused
    } else {
      if (svc) svc->resume();  // environments sample from the live policy while we wait
      GRPO_ASSIGN_OR_RETURN(raw, wait_batch(cfg, opt, src, opt.console, &source_errors));
      if (svc) svc->pause_and_drain();
      if (raw.is_null()) break;  // stop requested while waiting
    }
    const double waited = now_seconds() - t_wait;
    const double t_step = now_seconds();
    bo.current_version = st.step;
    GRPO_ASSIGN_OR_RETURN(RemoteBatch rb, remote_batch_build(raw, bo));
    for (const auto& w : rb.warnings) GRPO_LOG_WARN("remote batch for step %lld: %s", (long long)(st.step + 1), w.c_str());
    if (rb.samples.empty()) {
      ++empty_batches;
      GRPO_LOG_WARN("remote batch for step %lld had nothing to train on (all groups dropped or untrained); waiting for the next",
                    (long long)(st.step + 1));
      continue;
    }
    MicroBatchOptions mb;
    mb.max_seqs = std::max(1, std::min(t.micro_batch, (int(rb.samples.size()) + std::max(1, t.grad_accum) - 1) /
                                                          std::max(1, t.grad_accum)));
    // Sequences posted without inference_logprobs under an IS mode: the trainer's own
    // logprobs stand in (ratio 1: no correction for them), counted below.
    int64_t n_no_roll = 0;
    std::vector<size_t> need_roll, need_ref;
    for (size_t i = 0; i < rb.samples.size(); ++i) {
      if (t.loss.is_mode != IsMode::none && !rb.has_rollout_logp[i]) need_roll.push_back(i);
      if (policy_has_reference(t) && !rb.has_ref_logp[i]) need_ref.push_back(i);
      n_no_roll += !rb.has_rollout_logp[i];
    }
    auto fill = [&](const std::vector<size_t>& idx, bool ref) -> Status {
      if (idx.empty()) return ok_status();
      std::vector<GrpoSample> sub;
      for (size_t i : idx) sub.push_back(rb.samples[i]);
      auto lp = ref ? policy_reference_logprobs(t, sub, mb) : compute_logprobs(*t.ctx, t.model, *t.w, sub, mb);
      if (!lp.ok()) return lp.status().with_context(ref ? "reference logprobs" : "stand-in rollout logprobs");
      for (size_t k = 0; k < idx.size(); ++k)
        (ref ? rb.samples[idx[k]].ref_logp : rb.samples[idx[k]].rollout_logp) = std::move(lp.value()[k]);
      return ok_status();
    };
    GRPO_TRY(fill(need_roll, false));
    if (policy_has_reference(t)) GRPO_TRY(fill(need_ref, true));
    if (!policy_has_reference(t))
      for (auto& s : rb.samples) s.ref_logp.clear();  // β = 0: posted ref_logprobs are not needed
    GrpoStepOptions so;
    so.loss = t.loss;
    so.micro = mb;
    const double lr = lr_at(t.sched, t.opt.step);
    auto step = grpo_train_step(*t.ctx, t.model, *t.w, t.opt, lr, rb.samples, so);
    if (!step.ok()) return step.status().with_context("train step " + std::to_string(st.step + 1) + " (remote batch)");
    r.engine->reset_prefix_cache();
    r.ctx->synchronize();
    ++st.step;
    ++st.generation;
    ++steps_this_run;
    if (svc) svc->set_policy_version(st.step);
    if (r.ipc) r.ipc->publish(st.step);  // after r.ctx->synchronize(): the new weights are complete
    if (r.broadcaster) GRPO_TRY(loop_bridge_publish(r, st.step));
    const GrpoMetrics& g = step.value().metrics;
    MetricList rec = rb.metrics;
    rec.emplace_back("loss", g.loss);
    rec.emplace_back("kl", g.kl_mean());
    rec.emplace_back("entropy", g.entropy_mean());
    rec.emplace_back("clip_ratio", g.clip_region_frac());
    rec.emplace_back("grad_norm", step.value().optim.grad_norm);
    rec.emplace_back("lr", lr);
    rec.emplace_back("logprob_mismatch/mean", g.rollout_abs_diff_mean());
    rec.emplace_back("rollout_kl", g.rollout_kl());
    if (t.loss.is_mode != IsMode::none) {
      rec.emplace_back("is_ratio/mean", g.is_mean());
      rec.emplace_back("is_ratio/capped_frac", g.is_capped_frac());
    }
    rec.emplace_back("remote/sequences_without_inference_logprobs", double(n_no_roll));
    rec.emplace_back("remote/source_errors", double(source_errors));
    rec.emplace_back("remote/empty_batches", double(empty_batches));
    rec.emplace_back("time/wait", waited);
    rec.emplace_back("time/step", now_seconds() - t_step);
    if (st.step % cfg.log.every == 0 || st.step == cfg.train.steps) GRPO_TRY(hooks.write(st.step, rec));
    if (r.progress)
      r.progress->update(st.step, {{"reward", find(rec, "reward/mean", 0)},
                                   {"loss", g.loss},
                                   {"len", find(rec, "completion/mean_length", 0)},
                                   {"wait", waited}});
    if (cfg.checkpoint.every > 0 && st.step % cfg.checkpoint.every == 0) ckpt_due = true;
    const bool last = st.step == cfg.train.steps;
    if (ckpt_due && (!last || !cfg.checkpoint.save_final)) {  // the caller saves the final one
      GRPO_TRY(hooks.save());
      ckpt_due = false;
    }
    if (opt.stop_after_steps > 0 && steps_this_run >= opt.stop_after_steps && !last) return true;
  }
  return false;
}

}  // namespace grpo
