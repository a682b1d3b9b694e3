// How a caller runs the GRPO loop (grpo_train in grpo_loop.h): the run directory, resume,
// console, stop signal and the hooks the CLI supplies for the layers above train/ (the HTTP
// server, the trajectory API). Its own header so that the loop's pieces (loop_setup.h,
// loop_remote.h) take the options without including the loop's entry point.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "train/run_config.h"

namespace grpo {

class Communicator;
class EngineService;
class RolloutServer;
class Tokenizer;
class TrajectorySource;
struct RolloutBatch;

struct TrainLoopOptions {
  std::string out_dir;            // "" = cfg.run.output_dir
  bool resume = false;            // continue from resume_from, or the latest checkpoint in out_dir
  std::string resume_from;        // explicit checkpoint directory
  int n_threads = 0;              // CPU threads; 0 = all
  std::FILE* console = stderr;    // progress and summaries; nullptr = silent
  int64_t stop_after_steps = 0;   // > 0: end this process after this many steps (tests: a killed run)
  bool resume_with_changes = false;  // resume although the config differs from the run's config.toml
  // Polled between steps; non-zero (a signal number) = stop after the current step with a checkpoint.
  const std::atomic<int>* stop_signal = nullptr;
  std::function<void(int64_t step)> on_step;  // after each optimizer step, its metrics written
  // Before the first optimizer step on each generation batch, with the step it feeds (tests).
  std::function<void(int64_t step, const RolloutBatch&)> on_batch;
  // With [server] enabled: starts the HTTP front on the loop's engine service (the
  // CLI links src/server, which sits above train/). The returned handle is released,
  // stopping the server, before the service and the engine go away.
  std::function<Result<std::shared_ptr<void>>(EngineService&, const Tokenizer*, const ServerSection&)> start_server;
  // data.env = "remote": the source of batches of scored groups (train/loop_remote.h),
  // made by the CLI: the trajectory API hosted in this process, or a client of remote.url.
  std::function<Result<std::shared_ptr<TrajectorySource>>(const RunConfig&)> make_trajectory_source;
  // rollout.server_url set: the client that sends each generation batch to that server
  // (train/rollout_server.h), made by the CLI (src/server links cpp-httplib, train/ does not).
  std::function<Result<std::unique_ptr<RolloutServer>>(const RunConfig&)> make_rollout_server;
  // Data-parallel ranks (dist/communicator.h, docs/distributed.md); nullptr = one rank. Rank 0
  // owns the run directory (lock, metrics, checkpoints); every rank loads the same config.
  Communicator* comm = nullptr;
};

}  // namespace grpo
