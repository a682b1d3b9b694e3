// rollout.server_on_failure = "local" (docs/serve.md, "When the rollout server is lost"):
// whether the rollout server is up or lost. A failed RolloutServer::generate() (refused
// connection, timeout, HTTP error, malformed answer) marks it lost with one warning; while it
// is lost the in-process engine samples every batch exactly as the colocated loop does (same
// seeds and weights, so the same completions). At the start of each step that samples, the
// loop asks once whether it is back: a probe of GET /health with a short timeout, and with an
// NCCL bridge only once the bridge has rejoined (the server then holds the trainer's weights).
//
// Threads: lost() may run on the asynchronous producer thread (train/loop_async.h); the loop
// calls try_return() only while no batch is in flight at the server.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace grpo {

class RolloutServer;

class RolloutFailover {
 public:
  // A probe waits at most this long for /health (a refused connection fails at once).
  static constexpr double kProbeTimeoutS = 2.0;

  explicit RolloutFailover(RolloutServer& server, double probe_timeout_s = kProbeTimeoutS);

  bool down() const { return down_.load(); }
  // generate() of `generation` failed with `why`: warns once for this loss (the URL, the
  // reason, that the in-process engine samples from now on) and marks the server lost.
  void lost(const Status& why, int64_t generation);
  // While lost, at most once per step that samples (`step`: the optimizer step about to be
  // taken): when `bridge_ready` (no NCCL bridge, or it has rejoined), probes the server; an
  // answer marks it up again (logged once). Returns whether the server is up.
  bool try_return(bool bridge_ready, int64_t step);

  int64_t n_lost() const { return n_lost_.load(); }  // losses so far
  int64_t n_probes() const { return n_probes_; }      // probes sent so far

 private:
  RolloutServer& server_;
  double probe_timeout_s_;
  std::atomic<bool> down_{false};
  std::atomic<int64_t> n_lost_{0};
  int64_t n_probes_ = 0;
  int64_t last_probe_step_ = -1;
};

}  // namespace grpo
