// CUDA IPC bridge (docs/serve.md, "Weight bridges"): one GPU, one copy of the
// weights. `grpo train` with [server] bridge = "ipc" exports its weight arena;
// `grpo serve --attach RUN_DIR` maps it and serves from the trainer's buffers.
//
// Channel, under the run directory:
//   weights.ipc.json     written atomically (temporary file + rename) once the arena
//                        exists: format, trainer pid, CUDA device, the
//                        cudaIpcMemHandle_t of the arena's allocation (hex), the
//                        arena's byte offset in it and size, dtype, the model's
//                        config.json, the model directory (tokenizer files)
//   weights.ipc.version  one page, mapped by both: bytes 0..7 the policy version
//                        (int64, the optimizer step). The trainer stores it after
//                        the step's kernels have completed (context synchronised),
//                        with release order; the server loads it with acquire.
//
// The server does not copy: its ModelWeights are views of the mapped arena. The
// trainer rewrites the weights in place during its optimizer step, and no lock
// spans the two processes, so a server request that is decoding while a step runs
// reads weights changing under it (as in every shared-tensor bridge). Requests
// admitted after the version moves run on the new weights; the server resets its
// prefix cache and reports the new version (server/ipc_follow.h).
//
// Built without CUDA, export and attach return errors saying so.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/weights.h"

namespace grpo {

constexpr const char* kIpcChannelFile = "weights.ipc.json";
constexpr const char* kIpcVersionFile = "weights.ipc.version";

// The mapped version page (both sides).
class IpcVersionPage {
 public:
  // create: makes the file (truncating an old one) and stores 0.
  static Result<std::unique_ptr<IpcVersionPage>> open(const std::string& path, bool create);
  ~IpcVersionPage();
  void store(int64_t v);
  int64_t load() const;

 private:
  IpcVersionPage() = default;
  int64_t* p_ = nullptr;
  int fd_ = -1;
};

class IpcExporter {
 public:
  // Exports w.arena (a CUDA allocation of this process) under run_dir. model_dir:
  // where the server finds tokenizer files. Publishes version `step`.
  static Result<std::unique_ptr<IpcExporter>> create(const std::string& run_dir, const ModelWeights& w,
                                                     const std::string& model_dir, int64_t step);
  ~IpcExporter();  // removes the channel file: an attached server then sees the trainer gone
  // Precondition: the kernels that wrote the weights have completed.
  void publish(int64_t step) { page_->store(step); }

 private:
  IpcExporter() = default;
  std::string channel_path_;
  std::unique_ptr<IpcVersionPage> page_;
};

class IpcAttachment {
 public:
  // Opens run_dir's channel and maps the arena on the current CUDA device. Errors:
  // no channel (the trainer is not running with bridge = "ipc"), another device,
  // a build without CUDA.
  static Result<std::unique_ptr<IpcAttachment>> open(const std::string& run_dir);
  ~IpcAttachment();  // cudaIpcCloseMemHandle
  ModelWeights& weights() { return w_; }
  const std::string& model_dir() const { return model_dir_; }
  int64_t version() const { return page_->load(); }
  int trainer_pid() const { return pid_; }
  // False once the trainer's process is gone (its memory is then freed under us).
  bool trainer_alive() const;

 private:
  IpcAttachment() = default;
  ModelWeights w_;
  std::string model_dir_;
  std::unique_ptr<IpcVersionPage> page_;
  void* base_ = nullptr;  // the mapped allocation
  int pid_ = 0;
};

}  // namespace grpo
