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
#include <cstdint>
#include <string>

#include "train/loop_options.h"
#include "train/metrics_writer.h"
#include "train/run_config.h"

namespace grpo {

struct TrainLoopResult {
  int64_t steps = 0;              // optimizer steps completed in total
  bool stopped_early = false;
  int stop_signal = 0;            // the *stop_signal value that ended the run; 0 = it ran to its end
  std::string last_checkpoint;    // "" when none was written (on a stop: the resumed one, if any)
  MetricList last_eval;
  std::string out_dir;
};

Result<TrainLoopResult> grpo_train(const RunConfig& cfg, const TrainLoopOptions& opt);

}  // namespace grpo
