// The server side of the CUDA IPC bridge (dist/ipc_bridge.h): a thread that
// watches the trainer's version page and, when the version moves, resets the
// engine's prefix cache (its KV was computed by older weights) and reports the new
// policy version, with the service paused so that the engine loop is not inside a
// step meanwhile. The weights themselves need nothing: the engine reads the
// trainer's buffers.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_service.h"

namespace grpo {

class IpcFollower {
 public:
  // read_version: the mapped page's load (cheap); alive: false once the trainer exited.
  IpcFollower(EngineService& svc, Engine& eng, std::function<int64_t()> read_version, std::function<bool()> alive,
              double poll_interval_s);
  ~IpcFollower();  // stop()
  // Applies a moved version now; returns true when it did (tests, and the start).
  bool poll();
  void start();
  void stop();
  // The trainer's process ended: its memory is gone and the server must stop serving.
  bool trainer_gone() const { return gone_; }
  int64_t n_updates() const { return n_updates_; }

 private:
  EngineService& svc_;
  Engine& eng_;
  std::function<int64_t()> read_version_;
  std::function<bool()> alive_;
  double interval_s_;
  std::atomic<bool> stop_{false}, gone_{false};
  std::atomic<int64_t> n_updates_{0};
  std::thread thread_;
};

}  // namespace grpo
