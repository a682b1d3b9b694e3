// The end-to-end GRPO loop behind `grpo train` (DESIGN.md §3): load the model
// and tokenizer, build the environment and rewards, then per generation batch
// sample B prompts × G completions with the Engine (which reads the weights the
// trainer updates in place), score them, compute group advantages and take
// μ·steps_per_generation optimizer steps on the batch, resetting the engine's
// prefix cache after every step ([async] max_staleness > 0: the engine samples
// ahead from its own weight copy while the trainer steps, train/loop_async.h). Evals, early stopping, metrics (JSONL,
// TensorBoard, console progress, end-of-run HTML plot) and atomic training
// checkpoints (checkpoint_state.h) happen on schedule. docs/train-runs.md is
// the user's view of locking, stopping and resuming.
//
// Run directory (out_dir):
//   config.toml        the resolved config (parses back to the same config)
//   run_info.json      derived values: paths, device, model shape, engine sizing
//   metrics.jsonl      one object per optimizer step and one per eval
//   tb/                the run's TensorBoard event file (log.tensorboard)
//   plot.html          the main curves (log.plot), written at the end
//   checkpoint-<step>/ HF model + trainer state
//   .lock              flock of the process that owns the directory (its pid inside)
//
// Resume continues exactly: the state restores the optimizer, the data
// cursor and every sampling key, and metrics.jsonl and the TensorBoard file
// are cut back to the checkpoint's step before appending. A config that
// differs from the directory's config.toml is refused unless
// resume_with_changes. Scheduled checkpoints are taken at
// generation-batch boundaries (a step inside a batch defers its checkpoint to
// the batch's end) so that no sampled-but-untrained batch is lost.
//
// Stopping: a run directory is locked for the whole run (run_dir.h). When
// *stop_signal turns non-zero (the CLI's SIGINT/SIGTERM handler sets it) the
// loop finishes the step in progress, skips that step's eval, writes a
// checkpoint (inside a generation batch when μ·steps_per_generation > 1: the
// resume then starts a new batch, as after a final checkpoint there) and
// returns with TrainLoopResult::stop_signal set. A run whose
// optimizer skips train.max_consecutive_skipped_steps steps in a row
// (non-finite gradients) ends with an error.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "train/metrics_writer.h"
#include "train/run_config.h"

namespace grpo {
class EngineService;
class Tokenizer;
class TrajectorySource;
}  // namespace grpo

namespace grpo {

class Communicator;
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
  // Data-parallel ranks (dist/communicator.h, docs/distributed.md); nullptr = one rank. Rank 0
  // owns the run directory (lock, metrics, checkpoints); every rank loads the same config.
  Communicator* comm = nullptr;
};

struct TrainLoopResult {
  int64_t steps = 0;              // optimizer steps completed in total
  bool stopped_early = false;
  int stop_signal = 0;            // the *stop_signal value that ended the run; 0 = it ran to its end
  std::string last_checkpoint;    // "" when none was written (on a stop: the resumed one, if any)
  MetricList last_eval;
  std::string out_dir;
};

Result<TrainLoopResult> grpo_train(const RunConfig& cfg, const TrainLoopOptions& opt);

// Keeps the records of metrics.jsonl whose step is <= `step` (rewritten
// atomically); a missing file is fine. Used when resuming.
Status metrics_jsonl_truncate(const std::string& path, int64_t step);

}  // namespace grpo
