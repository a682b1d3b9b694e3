// Waiting for a rollout server (see rollout_server.h).
#include "train/rollout_server.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/timer.h"

namespace grpo {

Status rollout_server_wait(RolloutServer& s, double timeout_s, double poll_s) {
  const double t0 = now_seconds();
  for (;;) {
    auto h = s.health();
    if (h.ok()) return ok_status();
    const double waited = now_seconds() - t0;
    if (waited >= timeout_s) {
      char w[64];
      std::snprintf(w, sizeof w, "waited %.1f s (rollout.server_timeout_s)", waited);
      return h.status().with_context(w);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
}

}  // namespace grpo
