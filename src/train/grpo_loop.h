// The end-to-end GRPO loop behind `grpo train` (DESIGN.md §3): load the model
// and tokenizer, build the environment and rewards, then per generation batch
// sample B prompts × G completions with the Engine (which reads the weights the
// trainer updates in place), score them, compute group advantages and take
// μ·steps_per_generation optimizer steps on the batch, resetting the engine's
// prefix cache after every step. Evals, early stopping, metrics (JSONL,
// TensorBoard, console progress, end-of-run HTML plot) and atomic training
// checkpoints (checkpoint_state.h) happen on schedule.
//
// Run directory (out_dir):
//   config.toml        the resolved config (parses back to the same config)
//   run_info.json      derived values: paths, device, model shape, engine sizing
//   metrics.jsonl      one object per optimizer step and one per eval
//   tb/                TensorBoard event files (log.tensorboard)
//   plot.html          the main curves (log.plot), written at the end
//   checkpoint-<step>/ HF model + trainer state
//
// Resume continues exactly: the state restores the optimizer, the data
// cursor and every sampling key, and metrics.jsonl is cut back to the
// checkpoint's step before appending. Scheduled checkpoints are taken at
// generation-batch boundaries (a step inside a batch defers its checkpoint to
// the batch's end) so that no sampled-but-untrained batch is lost.
#pragma once
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

struct TrainLoopOptions {
  std::string out_dir;            // "" = cfg.run.output_dir
  bool resume = false;            // continue from resume_from, or the latest checkpoint in out_dir
  std::string resume_from;        // explicit checkpoint directory
  int n_threads = 0;              // CPU threads; 0 = all
  std::FILE* console = stderr;    // progress and summaries; nullptr = silent
  int64_t stop_after_steps = 0;   // > 0: end this process after this many steps (tests: a killed run)
  // With [server] enabled: starts the HTTP front on the loop's engine service (the
  // CLI links src/server, which sits above train/). The returned handle is released,
  // stopping the server, before the service and the engine go away.
  std::function<Result<std::shared_ptr<void>>(EngineService&, const Tokenizer*, const ServerSection&)> start_server;
  // data.env = "remote": the source of batches of scored groups (train/loop_remote.h),
  // made by the CLI: the trajectory API hosted in this process, or a client of remote.url.
  std::function<Result<std::shared_ptr<TrajectorySource>>(const RunConfig&)> make_trajectory_source;
};

struct TrainLoopResult {
  int64_t steps = 0;              // optimizer steps completed in total
  bool stopped_early = false;
  std::string last_checkpoint;    // "" when none was written
  MetricList last_eval;
  std::string out_dir;
};

Result<TrainLoopResult> grpo_train(const RunConfig& cfg, const TrainLoopOptions& opt);

// Keeps the records of metrics.jsonl whose step is <= `step` (rewritten
// atomically); a missing file is fine. Used when resuming.
Status metrics_jsonl_truncate(const std::string& path, int64_t step);

}  // namespace grpo
