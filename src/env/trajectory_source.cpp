// The in-process trajectory source (see trajectory_source.h).
#include "env/trajectory_source.h"

#include <chrono>
#include <cstdio>

namespace grpo {

Status TrajectorySource::restore_checkpoint_state(const nlohmann::json& state) {
  if (state.is_null()) return ok_status();
  return error_status("the checkpoint holds a trajectory queue hosted by the trainer, but this run pulls batches from "
                      "an external API ([remote] url); resume without [remote] url to get the queue back, or remove "
                      "\"trajectory_queue\" from the checkpoint's trainer_state.json to start from the external queue");
}

Status StoreTrajectorySource::register_trainer(const nlohmann::json& registration) {
  ApiReply r = store_.register_trainer(registration);
  if (r.status != 200) return error_status("registering the trainer: " + r.body.value("message", r.body.dump()));
  return ok_status();
}

Result<std::optional<nlohmann::json>> StoreTrajectorySource::next_batch() {
  ApiReply r = store_.batch();
  if (r.body.contains("status") && r.body["status"] == "error")
    return error_status("trajectory API: " + r.body.value("message", std::string("error")));
  const nlohmann::json& b = r.body["batch"];
  if (b.is_null()) return std::optional<nlohmann::json>();
  return std::optional<nlohmann::json>(b);
}

std::string StoreTrajectorySource::wait_status() {
  const TrajectoryCounters c = store_.counters();
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char buf[256];
  if (c.envs_connected == 0)
    std::snprintf(buf, sizeof(buf), "no environment connected (%lld registered so far); %lld sequences queued",
                  (long long)c.envs_registered, (long long)c.queued_sequences);
  else
    std::snprintf(buf, sizeof(buf), "%lld environment(s) connected; %lld sequences queued, %lld buffered; last post %s",
                  (long long)c.envs_connected, (long long)c.queued_sequences, (long long)c.buffered_sequences,
                  c.last_post_time > 0 ? (std::to_string(int(now - c.last_post_time)) + " s ago").c_str() : "never");
  return buf;
}

}  // namespace grpo
