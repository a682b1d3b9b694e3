// A rollout server that may be lost and come back (see rollout_failover.h).
#include "train/rollout_failover.h"

#include "core/log.h"
#include "train/rollout_server.h"

namespace grpo {

RolloutFailover::RolloutFailover(RolloutServer& server, double probe_timeout_s)
    : server_(server), probe_timeout_s_(probe_timeout_s) {}

void RolloutFailover::lost(const Status& why, int64_t generation) {
  if (down_.exchange(true)) return;  // already lost: warned
  n_lost_.fetch_add(1);
  GRPO_LOG_WARN("rollout server %s lost at generation %lld: %s; rollouts now come from the in-process engine "
                "(rollout.server_on_failure = \"local\"), sampled as a run without a server would, until the "
                "server answers GET /health again (asked at the start of each step)",
                server_.url().c_str(), (long long)generation, why.message().c_str());
}

bool RolloutFailover::try_return(bool bridge_ready, int64_t step) {
  if (!down_.load()) return true;
  if (!bridge_ready || step == last_probe_step_) return false;
  last_probe_step_ = step;
  ++n_probes_;
  auto h = server_.probe(probe_timeout_s_);
  if (!h.ok()) {
    GRPO_LOG_DEBUG("rollout server %s still lost before step %lld: %s", server_.url().c_str(), (long long)step,
                   h.status().message().c_str());
    return false;
  }
  down_ = false;
  GRPO_LOG_INFO("rollout server %s answers again (policy version %lld): rollouts come from it again from step %lld",
                server_.url().c_str(), (long long)h.value(), (long long)step);
  return true;
}

}  // namespace grpo
