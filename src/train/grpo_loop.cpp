// The end-to-end GRPO loop (see grpo_loop.h). Setup: loop_setup.cpp.
#include "train/grpo_loop.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/log.h"
#include "core/timer.h"
#include "model/safetensors.h"
#include "train/loop_async.h"
#include "train/loop_curriculum.h"
#include "train/loop_remote.h"
#include "dist/communicator.h"
#include "train/data_parallel.h"
#include "train/loop_setup.h"
#include "train/metrics_jsonl.h"
#include "train/metrics_progress.h"
#include "train/plot.h"
#include "train/rollout_failover.h"
#include "train/rollout_server.h"
#include "train/run_dir.h"
#include "train/tensorboard.h"

namespace grpo {

namespace fs = std::filesystem;

namespace {

MetricList concat(MetricList a, const MetricList& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double find_metric(const MetricList& m, const std::string& name, double dflt) {
  for (const auto& [k, v] : m)
    if (k == name) return v;
  return dflt;
}

MetricList progress_fields(const MetricList& m, const MetricList& last_eval) {
  MetricList shown = {{"reward", find_metric(m, "reward/mean", 0.0)},
                      {"acc", find_metric(m, "accuracy", 0.0)},
                      {"loss", find_metric(m, "loss", 0.0)},
                      {"len", find_metric(m, "completion/mean_length", 0.0)}};
  if (!last_eval.empty()) shown.emplace_back("eval_acc", find_metric(last_eval, "eval/accuracy", 0.0));
  return shown;
}

class Writers {
 public:
  Status open(const RunConfig& cfg, const std::string& out_dir, bool resume, int64_t resume_step) {
    const std::string jl = (fs::path(out_dir) / "metrics.jsonl").string();
    if (resume) {
      GRPO_TRY(metrics_jsonl_truncate(jl, resume_step));
      if (fs::exists(jl)) {
        GRPO_ASSIGN_OR_RETURN(MetricHistory h, metrics_jsonl_load(jl));
        for (const auto& [name, pts] : h.series())
          for (const auto& p : pts) history_.add(name, p.step, p.value);
      }
    }
    if (cfg.log.jsonl) {
      GRPO_ASSIGN_OR_RETURN(auto w, JsonlMetricWriter::open(jl, resume));
      multi_.add(std::move(w));
    }
    if (cfg.log.tensorboard) {
      GRPO_ASSIGN_OR_RETURN(auto w, TensorBoardWriter::open_run((fs::path(out_dir) / "tb").string(),
                                                                resume ? resume_step : -1));
      multi_.add(std::move(w));
    }
    return ok_status();
  }
  Status write(int64_t step, const MetricList& m) {
    GRPO_TRY(history_.write(step, 0, m));
    return multi_.write(step, unix_time_now(), m);
  }
  const MetricHistory& history() const { return history_; }

 private:
  MultiMetricWriter multi_;
  MetricHistory history_;
};

// Early stopping bookkeeping; returns true when patience ran out.
bool early_stop_update(const RunConfig& cfg, const MetricList& ev, int64_t step, TrainerState& st) {
  const double v = find_metric(ev, enum_name(early_stopping_metric_names(), cfg.eval.early_stopping_metric), NAN);
  if (!std::isfinite(v)) return false;
  if (!st.has_best || v > st.best_metric + cfg.eval.early_stopping_min_delta) {
    st.has_best = true;
    st.best_metric = v;
    st.best_step = step;
    st.evals_without_improvement = 0;
  } else {
    ++st.evals_without_improvement;
  }
  return cfg.eval.early_stopping_patience > 0 && st.evals_without_improvement >= cfg.eval.early_stopping_patience;
}

}  // namespace

Result<TrainLoopResult> grpo_train(const RunConfig& cfg_in, const TrainLoopOptions& opt) {
  // Config errors first, so that a bad config leaves no run directory behind.
  GRPO_TRY(cfg_in.validate());
  GRPO_TRY(run_config_resolve_paths(cfg_in).status());
  Communicator* comm = opt.comm;
  const int n_ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const bool lead = rank == 0;  // owns the run directory: lock, metrics, checkpoints
  if (cfg_in.rollout.prompts_per_step % n_ranks != 0)
    return error_status("rollout.prompts_per_step = " + std::to_string(cfg_in.rollout.prompts_per_step) +
                        " does not split over " + std::to_string(n_ranks) +
                        " ranks: it is the global batch; make it a multiple of the number of ranks");
  // rollout.server_url: without a weight bridge the server must answer before anything else
  // starts (no run directory, no model load for a run that cannot sample). A bridged server
  // (grpo serve --receive / --attach) listens only after it joined the bridge, which the
  // trainer sets up below: it is waited for there.
  std::unique_ptr<RolloutServer> rollout_server;
  if (!cfg_in.rollout.server_url.empty()) {
    if (!opt.make_rollout_server)
      return error_status("rollout.server_url = \"" + cfg_in.rollout.server_url +
                          "\", but this program has no HTTP client for it; run it with `grpo train`");
    GRPO_ASSIGN_OR_RETURN(rollout_server, opt.make_rollout_server(cfg_in));
    if (cfg_in.server.bridge == "none") GRPO_TRY(rollout_server->health().status());
  }
  const std::string out_dir = opt.out_dir.empty() ? cfg_in.run.output_dir : opt.out_dir;
  std::optional<RunDirLock> lock;
  if (lead) {
    GRPO_ASSIGN_OR_RETURN(RunDirLock l, RunDirLock::acquire(out_dir));
    lock.emplace(std::move(l));
    if (opt.resume) GRPO_TRY(run_dir_check_resume_config(out_dir, cfg_in, opt.resume_with_changes, opt.console));
  }
  GRPO_ASSIGN_OR_RETURN(std::unique_ptr<LoopRun> run, loop_setup(cfg_in, opt));
  LoopRun& r = *run;
  const RunConfig& cfg = r.cfg;
  TrainerState& st = r.state;
  std::FILE* con = opt.console;
  r.rollout_cfg.server = rollout_server.get();
  // rollout.server_on_failure = "local": a lost server hands the rollouts to the in-process engine.
  std::unique_ptr<RolloutFailover> failover;
  if (rollout_server && cfg.rollout.server_on_failure == ServerOnFailure::local)
    failover = std::make_unique<RolloutFailover>(*rollout_server);
  r.rollout_cfg.failover = failover.get();
  if (rollout_server && con)
    std::fprintf(con, "grpo train: rollouts from %s (evals on the in-process engine%s)\n", rollout_server->url().c_str(),
                 failover ? "; rollouts too while the server is lost" : "");

  // [server]: outside requests share the engine through the service, which runs only
  // while the loop generates; weights change while it is paused (drained), so every
  // answer comes from one policy version (the optimizer step).
  std::unique_ptr<EngineService> svc;
  std::shared_ptr<void> http;  // declared after svc: released first
  // Released before http: lets the requests still queued finish, so that stopping the
  // HTTP workers never waits on a paused service.
  struct Resume {
    EngineService* s = nullptr;
    ~Resume() {
      if (s) s->resume();
    }
  } resume_at_exit;
  if (cfg.server.enabled) {
    if (!opt.start_server)
      return error_status("server.enabled = true, but this program cannot start the HTTP server; run it with `grpo train`");
    svc = std::make_unique<EngineService>(*r.engine, ServiceOptions{int(cfg.server.max_queued_requests)});
    svc->pause_and_drain();
    svc->set_policy_version(st.step);
    GRPO_ASSIGN_OR_RETURN(http, opt.start_server(*svc, r.tok.get(), cfg.server));
    resume_at_exit.s = svc.get();
  }
  if (cfg.server.bridge == "ipc" && lead) {
    if (cfg.lora.enabled)
      return error_status("server.bridge = \"ipc\" shares the full weight arena, but [lora] trains adapters beside a "
                          "frozen base; follow a LoRA run with grpo serve --watch " + out_dir + " (adapter reloads)");
    GRPO_ASSIGN_OR_RETURN(r.ipc, IpcExporter::create(out_dir, *r.weights, cfg.model.path, st.step));
    if (con) std::fprintf(con, "grpo train: CUDA IPC bridge: grpo serve --attach %s --device cuda\n", out_dir.c_str());
  }
  if (cfg.server.bridge == "nccl" && lead) {
    std::string host;
    int port = 0;
    GRPO_TRY(bridge_parse_addr(cfg.server.bridge_addr, "server.bridge_addr", &host, &port));
    BroadcastOptions bo;
    bo.bucket_bytes = cfg.server.bridge_bucket_mib << 20;
    bo.on_failure = cfg.server.bridge_on_failure;
    if (con)
      std::fprintf(con, "grpo train: NCCL weight bridge: waiting for %lld grpo serve --receive %s\n",
                   (long long)cfg.server.bridge_servers, cfg.server.bridge_addr.c_str());
    GRPO_ASSIGN_OR_RETURN(r.bridge_comm, bridge_connect_trainer(host, port, int(cfg.server.bridge_servers),
                                                                cfg.server.bridge_timeout_s));
    // LoRA: the servers hold the same frozen base; only the adapters move.
    Tensor arena = r.trainer.lora ? r.trainer.lora->arena : r.weights->arena;
    TransferPlan plan = r.trainer.lora ? transfer_plan(*r.trainer.lora, bo.bucket_bytes) : transfer_plan(*r.weights, bo.bucket_bytes);
    if (con) std::fprintf(con, "grpo train: NCCL weight bridge: %s\n", plan.summary().c_str());
    r.broadcaster = std::make_unique<WeightBroadcaster>(*r.bridge_comm, arena, std::move(plan), bo);
    GRPO_TRY(r.broadcaster->handshake());
    GRPO_TRY(r.broadcaster->publish(*r.ctx, st.step));  // the servers start from the trainer's weights
  }
  if (rollout_server && cfg.server.bridge != "none") {
    if (con) std::fprintf(con, "grpo train: waiting for the rollout server at %s\n", rollout_server->url().c_str());
    GRPO_TRY(rollout_server_wait(*rollout_server, cfg.rollout.server_timeout_s));
  }
  DataParallel dp;
  std::vector<int64_t> prompt_split = split_even(cfg.rollout.prompts_per_step, n_ranks);
  if (comm) loop_setup_data_parallel(r, *comm, dp, prompt_split[size_t(rank)]);
  const std::vector<int64_t> eval_split = split_even(int64_t(r.eval_prompts.size()), n_ranks);
  const std::vector<PreparedPrompt> eval_mine(r.eval_prompts.begin() + long(eval_split[size_t(rank)]),
                                              r.eval_prompts.begin() + long(eval_split[size_t(rank) + 1]));

  Writers writers;
  if (lead) GRPO_TRY(writers.open(cfg, r.out_dir, r.resumed, st.step));
  auto write_metrics = [&](int64_t step, const MetricList& m) { return lead ? writers.write(step, m) : ok_status(); };

  TrainLoopResult res;
  res.out_dir = r.out_dir;
  auto do_eval = [&](int64_t step) -> Status {
    if (r.eval_prompts.empty()) return ok_status();
    auto ev = rollout_eval_solo_tandem(*r.engine, *r.env, *r.rewards, eval_mine, r.eval_params,
                                       uint64_t(cfg.rollout.seed), cfg.tandem.eval_tandem, svc.get(),
                                       eval_split[size_t(rank)]);
    if (!ev.ok()) return ev.status().with_context("eval at step " + std::to_string(step));
    r.engine->reset_prefix_cache();
    res.last_eval = ev.value();
    if (comm) GRPO_TRY(dp_reduce_eval_metrics(*comm, res.last_eval).with_context("eval metrics"));
    GRPO_TRY(write_metrics(step, res.last_eval));
    if (con)
      std::fprintf(con, "%seval step %lld: accuracy %.4f reward %.4f (%d prompts, %.1f s)\n",
                   r.progress && r.progress->is_bar() ? "\n" : "", (long long)step,
                   find_metric(res.last_eval, "eval/accuracy", 0), find_metric(res.last_eval, "eval/reward", 0),
                   int(r.eval_prompts.size()), find_metric(res.last_eval, "eval/time", 0));
    if (early_stop_update(cfg, res.last_eval, step, st)) st.stopped_early = true;
    return ok_status();
  };
  int64_t saved_step = -1;
  std::shared_ptr<TrajectorySource> remote_src;  // data.env = "remote": its queue goes into each checkpoint
  // [async]: a checkpoint drains the rollouts queued (train/loop_async.h).
  std::unique_ptr<AsyncRollouts> async;
  auto save = [&](bool mid_generation) -> Status {
    if (saved_step == st.step) return ok_status();
    saved_step = st.step;
    if (async) async->drain();
    st.mid_generation = mid_generation;
    st.trajectory_queue = remote_src ? remote_src->checkpoint_state() : nlohmann::json();
    st.data_epoch = r.cursor->epoch();
    st.data_index = r.cursor->index();
    st.curriculum = r.curriculum ? r.curriculum->to_json() : nlohmann::json();
    st.last_lr = lr_at(r.trainer.sched, std::max<int64_t>(0, r.trainer.opt.step - 1));
    // ZeRO-1: the checkpoint holds the full optimizer state, so a resume may use any number of ranks.
    std::optional<Optimizer> full;
    if (dp.zero_stage == 1) {
      Status gs;
      full.emplace(optimizer_gather_for_checkpoint(*r.ctx, r.trainer.opt, *r.weights, dp, &gs));
      GRPO_TRY(gs.with_context("gathering ZeRO-1 shards for the checkpoint at step " + std::to_string(st.step)));
    }
    if (!lead) return ok_status();
    auto p = checkpoint_save(*r.ctx, r.out_dir, *r.weights, full ? *full : r.trainer.opt, st, r.ckpt_opts);
    if (!p.ok()) return p.status().with_context("checkpoint at step " + std::to_string(st.step));
    res.last_checkpoint = p.value();
    GRPO_LOG_DEBUG("wrote %s", p.value().c_str());
    return ok_status();
  };

  if (!r.resumed && cfg.eval.every > 0 && cfg.eval.at_start) GRPO_TRY(do_eval(0));

  const bool remote = cfg.data.env == EnvKind::remote;
  if (remote) {
    if (!opt.make_trajectory_source)
      return error_status("data.env = \"remote\", but this program cannot host or reach a trajectory API; run it with `grpo train`");
    GRPO_ASSIGN_OR_RETURN(std::shared_ptr<TrajectorySource> src, opt.make_trajectory_source(cfg));
    remote_src = src;
    RemoteLoopHooks hooks{[&](int64_t s, const MetricList& m) { return writers.write(s, m); }, [&] { return save(false); }};
    GRPO_ASSIGN_OR_RETURN(bool killed, remote_train_loop(r, opt, *src, svc.get(), hooks));
    if (killed) {
      if (r.progress) r.progress->finish();
      res.steps = st.step;
      return res;  // simulated kill: no final checkpoint, no plot
    }
    if (opt.stop_signal && opt.stop_signal->load() != 0 && st.step < cfg.train.steps)
      res.stop_signal = opt.stop_signal->load();
  }
  const int64_t mu = cfg.train.num_iterations, spg = cfg.train.steps_per_generation;
  if (cfg.async.max_staleness > 0 && !remote) async = std::make_unique<AsyncRollouts>(r);
  // Asynchronous batches of the engine arrive with the old logprobs of the version that sampled
  // them; those of a server without (train/loop_async.h).
  const bool use_old = mu > 1 || spg > 1 || (async && !rollout_server);
  std::optional<RolloutBatch> batch;
  int64_t batch_pos = 0;  // optimizer steps taken on `batch`
  bool ckpt_due = false;
  int64_t steps_this_run = 0;
  int64_t n_skipped_in_row = 0;
  auto stop_requested = [&] {
    if (opt.stop_signal && opt.stop_signal->load() != 0) res.stop_signal = opt.stop_signal->load();
    if (comm && n_ranks > 1) {
      // Every rank must leave the loop at the same step, or the others would wait in a collective.
      std::vector<double> s = {double(res.stop_signal)};
      if (comm->all_reduce_host(s, HostReduce::max).ok()) res.stop_signal = int(s[0]);
    }
    return res.stop_signal != 0;
  };
  while (!remote && st.step < cfg.train.steps && !st.stopped_early && !stop_requested()) {
    const double t_step = now_seconds();
    MetricList rec;
    // A lost server is asked once per step that samples whether it is back; with an NCCL bridge
    // only once the bridge has rejoined, so that the server holds this step's weights.
    if (failover && !batch) failover->try_return(!r.broadcaster || !r.broadcaster->stats().down, st.step + 1);
    if (!batch && async) {
      if (!async->primed()) GRPO_TRY(async->prime().with_context("asynchronous rollouts after step " + std::to_string(st.step)));
      batch = async->pop(&rec);
      batch_pos = 0;
      async->launch();  // the next batch is sampled while this one trains
      rec = concat(std::move(rec), batch->metrics);
      rec.emplace_back("tokens/generated", double(batch->n_completion_tokens));
    } else if (!batch) {
      std::vector<PreparedPrompt> prompts;
      const std::vector<size_t> global = r.cursor->next(size_t(cfg.rollout.prompts_per_step));
      const size_t mine_begin = size_t(prompt_split[size_t(rank)]), mine_end = size_t(prompt_split[size_t(rank) + 1]);
      for (size_t i : std::vector<size_t>(global.begin() + long(mine_begin), global.begin() + long(mine_end))) {
        auto p = prompt_prepare(r.format, *r.tok, r.env->example(Split::train, i));
        if (!p.ok()) return p.status();
        prompts.push_back(std::move(p).value());
      }
      // The curriculum sizes every prompt of the global batch (its state is the same on every rank).
      std::vector<int> gs;
      if (r.curriculum) {
        const std::vector<int> all = curriculum_group_sizes(*r.curriculum, global);
        gs.assign(all.begin() + long(mine_begin), all.begin() + long(mine_end));
      }
      RolloutConfig rc = r.rollout_cfg;
      rc.server_min_version = rollout_server ? loop_server_min_version(r, st.step) : -1;
      auto b = rollout_generate(*r.engine, *r.env, *r.rewards, std::move(prompts), rc, st.generation, svc.get(), gs);
      if (!b.ok()) return b.status().with_context("rollout of generation " + std::to_string(st.generation));
      ++st.generation;
      batch = std::move(b).value();
      if (batch->from_server) loop_note_server_version(r, batch->policy_version, st.step);
      batch_pos = 0;
      if (r.curriculum)
        batch->metrics = concat(std::move(batch->metrics), curriculum_after_rollout(*r.curriculum, global, *batch));
      rec = batch->metrics;
      rec.emplace_back("tokens/generated", double(batch->n_completion_tokens));
    } else {
      for (const auto& kv : batch->metrics)
        if (kv.first.rfind("time/", 0) != 0 && kv.first.rfind("rollout/", 0) != 0) rec.push_back(kv);
      rec.emplace_back("time/rollout", 0.0);
      rec.emplace_back("time/reward", 0.0);
      rec.emplace_back("tokens/generated", 0.0);
    }
    // 1: the step's batch came from the in-process engine because the server was lost.
    if (rollout_server) rec.emplace_back("rollout/server_down", batch->from_server ? 0.0 : 1.0);
    if (opt.on_batch && batch_pos == 0) opt.on_batch(st.step + 1, *batch);
    const size_t N = batch->completions.size(), chunk = size_t(batch_pos % spg);
    const size_t b0 = N * chunk / size_t(spg), b1 = N * (chunk + 1) / size_t(spg);
    std::optional<StreamScope> train_scope;  // beside the async engine: wait for the trainer's stream only
    if (async && !rollout_server) train_scope.emplace(*r.ctx);
    auto tm = policy_train_step(r.trainer, *batch, b0, b1, use_old);
    train_scope.reset();
    if (async) {
      // Joined even when the step failed, so that no rollout outlives the loop's state.
      const double t_train_end = now_seconds();
      Status js = async->join(t_train_end, st.step + 1, &rec);
      if (tm.ok() && !js.ok()) return js.with_context("asynchronous rollouts during step " + std::to_string(st.step + 1));
    }
    if (!tm.ok()) return tm.status().with_context("train step " + std::to_string(st.step + 1));
    // Weight sync: the engine already reads the updated buffers; only its cached prefixes are stale.
    const double t_sync = now_seconds();
    r.engine->reset_prefix_cache();
    r.ctx->synchronize();
    if (r.ipc) {  // after the synchronize: the published version promises complete weights
      const double t_bridge = now_seconds();
      r.ipc->publish(st.step + 1);
      rec.emplace_back("time/bridge", now_seconds() - t_bridge);
    }
    if (r.broadcaster) {
      const double t_bridge = now_seconds();
      GRPO_TRY(loop_bridge_publish(r, st.step + 1));
      rec.emplace_back("time/bridge", now_seconds() - t_bridge);
    }
    rec = concat(std::move(rec), tm.value());
    if (comm) GRPO_TRY(dp_reduce_step_metrics(*comm, rec).with_context("step metrics"));
    rec.emplace_back("time/sync", now_seconds() - t_sync);
    ++st.step;
    if (svc) svc->set_policy_version(st.step);
    ++steps_this_run;
    if (++batch_pos == mu * spg) batch.reset();
    const double wall = now_seconds() - t_step;
    rec.emplace_back("time/step", wall);
    rec.emplace_back("tokens/s", wall > 0 ? find_metric(rec, "tokens/generated", 0) / wall : 0.0);
    rec.emplace_back("generation", double(st.generation));
    rec.emplace_back("epoch", double(r.cursor->epoch()));
    if (st.step % cfg.log.every == 0 || st.step == cfg.train.steps) GRPO_TRY(write_metrics(st.step, rec));
    if (r.progress) r.progress->update(st.step, progress_fields(rec, res.last_eval));
    if (opt.on_step) opt.on_step(st.step);
    n_skipped_in_row = find_metric(tm.value(), "optimizer/skipped", 0.0) > 0 ? n_skipped_in_row + 1 : 0;
    if (cfg.train.max_consecutive_skipped_steps > 0 && n_skipped_in_row >= cfg.train.max_consecutive_skipped_steps) {
      if (r.progress) r.progress->finish();
      return error_status(
          "step " + std::to_string(st.step) + ": the last " + std::to_string(n_skipped_in_row) +
          " optimizer steps were all skipped because the gradients were not finite (loss " +
          std::to_string(find_metric(tm.value(), "loss", NAN)) + ", grad_norm " +
          std::to_string(find_metric(tm.value(), "grad_norm", NAN)) +
          "); the weights no longer change, so the run stops here. Lower train.lr, check the model and data, or "
          "raise train.max_consecutive_skipped_steps (0 = never stop)");
    }
    // The step is done; its eval and scheduled checkpoint give way to the stop's. After the
    // last step the run simply ends as usual.
    if (st.step < cfg.train.steps && stop_requested()) break;

    if (cfg.eval.every > 0 && (st.step % cfg.eval.every == 0 || st.step == cfg.train.steps)) GRPO_TRY(do_eval(st.step));
    if (r.curriculum && lead && cfg.curriculum.report_every > 0 && st.step % cfg.curriculum.report_every == 0)
      GRPO_TRY(curriculum_write_report(*r.curriculum, r.out_dir, st.step));
    if (cfg.checkpoint.every > 0 && st.step % cfg.checkpoint.every == 0) ckpt_due = true;
    const bool last = st.step == cfg.train.steps || st.stopped_early;
    if (ckpt_due && !batch && !last) {
      GRPO_TRY(save(false));
      ckpt_due = false;
    }
    if (opt.stop_after_steps > 0 && steps_this_run >= opt.stop_after_steps && !last) {
      if (r.progress) r.progress->finish();
      res.steps = st.step;
      return res;  // simulated kill: no final checkpoint, no plot
    }
  }
  if (r.progress) r.progress->finish();
  if (r.broadcaster) GRPO_TRY(r.broadcaster->finish());
  if (st.stopped_early && con)
    std::fprintf(con, "early stopping at step %lld: %s did not improve for %lld evals (best %.4f at step %lld)\n",
                 (long long)st.step, enum_name(early_stopping_metric_names(), cfg.eval.early_stopping_metric), (long long)st.evals_without_improvement,
                 st.best_metric, (long long)st.best_step);
  if (res.stop_signal) {
    if (steps_this_run > 0 || (remote && st.step > 0)) GRPO_TRY(save(batch.has_value()));
    else res.last_checkpoint = r.resumed_from;
  } else if (cfg.checkpoint.save_final || ckpt_due) {
    GRPO_TRY(save(batch.has_value()));
  }
  if (r.curriculum && lead) GRPO_TRY(curriculum_write_report(*r.curriculum, r.out_dir, st.step));
  if (cfg.log.plot && lead) {
    PlotOptions po;
    if (r.curriculum) po.curriculum_report = r.curriculum->report(st.step);
    po.title = cfg.run.name.empty() ? fs::path(r.out_dir).filename().string() : cfg.run.name;
    po.metrics = cfg.log.plot_metrics.empty() ? loop_plot_metrics(writers.history()) : cfg.log.plot_metrics;
    GRPO_TRY(plot_write_html((fs::path(r.out_dir) / "plot.html").string(), writers.history(), po));
  }
  if (con && !res.stop_signal)
    std::fprintf(con, "done: %lld steps in %s%s%s\n", (long long)st.step, r.out_dir.c_str(),
                 res.last_checkpoint.empty() ? "" : ", checkpoint ", res.last_checkpoint.c_str());
  res.steps = st.step;
  res.stopped_early = st.stopped_early;
  return res;
}

}  // namespace grpo
