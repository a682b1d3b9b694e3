// Reload bridge of `grpo serve --watch DIR` (docs/serve.md, "Weight bridges"):
// a thread polls DIR for a newer complete checkpoint and swaps its weights into
// the running engine.
//
// DIR is either a run's output directory, whose complete checkpoints are the
// "checkpoint-<step>" children holding trainer_state.json (the trainer builds each
// in a ".partial-<pid>" directory and renames it into place after fsync, so a
// name that matches is complete), or one model / adapter directory that its
// writer replaces in one rename (model_save, checkpoint_save). A checkpoint is
// new when its identity (directory inode and the weight file's mtime and size)
// differs from the one loaded last.
//
// The slow part runs beside the serving engine: full weights are read (parallel
// preads, model_read_into) into a host staging arena in page-locked memory and
// copied up into a device staging arena; only the device-to-device copy into the
// engine's buffers runs with the service paused: EngineService::pause_and_drain
// lets admitted requests finish on the old weights, new ones queue, and every
// request is answered under exactly one policy version (the checkpoint's
// optimizer step). Both staging arenas are allocated at the first reload and
// kept (page-locking 1 GB costs about as much as reading it): one more set of
// weights in host memory and one on the device for the server's lifetime.
// Adapters are small and load through lora_load into a fresh staging copy.
//
// It sits in server/ rather than dist/ because it drives the EngineService and
// reads the trainer's checkpoint layout (engine/ and train/ are above dist/).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/context.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/engine_service.h"
#include "model/lora.h"
#include "model/weights.h"

namespace grpo {

struct WatchedCheckpoint {
  std::string path;
  int64_t step = -1;         // trainer_state.json "step", else the "checkpoint-<step>" name; -1: unknown
  bool adapter = false;      // a PEFT adapter directory (adapter_config.json) rather than full weights
  std::string identity;      // changes whenever the directory is replaced or rewritten
};

// The newest complete checkpoint under `dir` (see the file comment); nullopt when
// there is none yet. Error when `dir` does not exist or is not a directory.
Result<std::optional<WatchedCheckpoint>> watch_find_latest(const std::string& dir);

// Checks that `other` has the architecture and shapes of `running`: every
// model-config field the forward or the engine reads (torch_dtype and the init
// range aside). The error names the first field that differs and both values.
Status watch_check_same_model(const ModelConfig& running, const ModelConfig& other, const std::string& source);

struct WatchOptions {
  std::string dir;
  double poll_interval_s = 1.0;
};

struct WatchStats {
  int64_t n_loaded = 0, n_refused = 0;
  int64_t version = 0;          // the policy version of the weights served now
  std::string loaded_path;      // "" until a checkpoint was loaded
  double last_stage_s = 0;      // reading + converting + copying up, beside the serving engine
  double last_upload_s = 0;     // of which the host-to-device staging copy
  double last_pause_s = 0;      // waiting for in-flight requests to finish
  double last_swap_s = 0;       // copying into the engine's buffers (service paused)
  std::string last_error;
};

class WeightWatcher {
 public:
  // w (and lora, when the engine applies an adapter to every request; else null) are
  // the buffers `eng` reads; all must outlive the watcher. ctx is the engine's
  // context; staging does not use it (the engine loop may be using it), the swap does.
  WeightWatcher(EngineService& svc, Engine& eng, Context& ctx, ModelWeights& w, LoraWeights* lora, WatchOptions opt);
  ~WeightWatcher();  // stop()
  WeightWatcher(const WeightWatcher&) = delete;
  WeightWatcher& operator=(const WeightWatcher&) = delete;

  // One scan. Returns true when new weights went live; false when nothing new
  // appeared (or a checkpoint vanished or changed while being read: the next poll
  // retries it). Error when a new checkpoint was refused (other architecture or
  // shapes, adapter vs full weights, unreadable files): the old weights keep
  // serving and that checkpoint is not tried again unless it changes.
  Result<bool> poll();
  // Polls every poll_interval_s on a background thread, logging loads and refusals.
  void start();
  void stop();
  WatchStats stats() const;

 private:
  Result<bool> load(const WatchedCheckpoint& c);

  EngineService& svc_;
  Engine& eng_;
  Context& ctx_;
  ModelWeights& w_;
  LoraWeights* lora_;
  WatchOptions opt_;
  std::string done_identity_;  // loaded or refused last (not retried)
  std::optional<ModelWeights> host_stage_;  // full weights: page-locked host staging, the engine's layout
  Tensor dev_stage_;                        // full weights on CUDA: device staging arena
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  WatchStats stats_;
  std::thread thread_;
};

}  // namespace grpo
