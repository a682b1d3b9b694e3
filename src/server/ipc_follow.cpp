// Follows the IPC bridge's version page (see ipc_follow.h).
#include "server/ipc_follow.h"

#include <chrono>

namespace grpo {

IpcFollower::IpcFollower(EngineService& svc, Engine& eng, std::function<int64_t()> read_version,
                         std::function<bool()> alive, double poll_interval_s)
    : svc_(svc), eng_(eng), read_version_(std::move(read_version)), alive_(std::move(alive)),
      interval_s_(poll_interval_s) {}

IpcFollower::~IpcFollower() { stop(); }

bool IpcFollower::poll() {
  const int64_t v = read_version_();
  if (v == svc_.policy_version()) return false;
  svc_.pause_and_drain();
  eng_.reset_prefix_cache();
  svc_.set_policy_version(v);
  svc_.resume();
  ++n_updates_;
  return true;
}

void IpcFollower::start() {
  stop_ = false;
  thread_ = std::thread([this] {
    int64_t n = 0;
    while (!stop_) {
      poll();
      // The liveness check is a syscall: about every 100 ms is enough.
      if (++n % std::max<int64_t>(1, int64_t(0.1 / interval_s_)) == 0 && !alive_()) {
        gone_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(interval_s_));
    }
  });
}

void IpcFollower::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace grpo
