// The training loop of data.env = "remote" (docs/environments.md): instead of
// sampling its own rollouts, the trainer takes batches of scored groups that
// environment processes post to an Atropos-compatible trajectory API, and takes
// one optimizer step per batch (train/remote_batch.h turns groups into samples).
//
// While it waits for a batch, the [server] engine service (when enabled) runs,
// so environments sample from the live policy; it is paused (drained) for the
// step and its policy version bumped after it. No batch: the loop keeps polling
// and logs, every remote.wait_log_every seconds, why it waits (no environment
// connected, or how much is queued); a source that cannot be reached is retried
// the same way. remote.max_wait > 0 turns a wait that long into an error.
#pragma once
#include <functional>

#include "env/trajectory_source.h"
#include "train/loop_setup.h"

namespace grpo {

class EngineService;

struct RemoteLoopHooks {
  std::function<Status(int64_t step, const MetricList& m)> write;  // metrics of a finished step
  std::function<Status()> save;                                    // checkpoint now
};

// Runs steps until train.steps. Returns true when opt.stop_after_steps ended
// the run early (the caller skips the final checkpoint, as for a killed run).
Result<bool> remote_train_loop(LoopRun& r, const TrainLoopOptions& opt, TrajectorySource& src, EngineService* svc,
                               const RemoteLoopHooks& hooks);

// Atropos's POST /register body for this run.
nlohmann::json remote_registration(const LoopRun& r);

}  // namespace grpo
