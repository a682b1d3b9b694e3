// Where `grpo train` (data.env = "remote") gets its batches of scored groups:
// the TrajectoryStore it hosts itself, or an external Atropos API server it
// polls over HTTP (server/trajectory_client.h). Either way a batch is Atropos's
// GET /batch "batch" value: a list of groups (scored_data_normalize's shape)
// totalling the registered batch_size sequences.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "env/trajectory_store.h"

namespace grpo {

class TrajectorySource {
 public:
  virtual ~TrajectorySource() = default;
  // POST /register with this body (Atropos's Registration fields).
  virtual Status register_trainer(const nlohmann::json& registration) = 0;
  // The next batch, or nullopt while not enough groups are queued. Errors: the
  // source cannot be reached or answered something that is not a batch.
  virtual Result<std::optional<nlohmann::json>> next_batch() = 0;
  // One line for the trainer's "waiting for groups" log.
  virtual std::string wait_status() = 0;
  // The queue state a checkpoint keeps (TrajectoryStore::snapshot), or null when the
  // queue lives elsewhere (an external API server keeps its own).
  virtual nlohmann::json checkpoint_state() { return nlohmann::json(); }
  // Puts a checkpoint_state() back, after register_trainer. A source that holds no
  // queue says so instead.
  virtual Status restore_checkpoint_state(const nlohmann::json& state);
};

// The hosted case: reads the store directly (no HTTP between trainer and queue).
class StoreTrajectorySource : public TrajectorySource {
 public:
  explicit StoreTrajectorySource(TrajectoryStore& store) : store_(store) {}
  Status register_trainer(const nlohmann::json& registration) override;
  Result<std::optional<nlohmann::json>> next_batch() override;
  std::string wait_status() override;
  nlohmann::json checkpoint_state() override { return store_.snapshot(); }
  Status restore_checkpoint_state(const nlohmann::json& state) override { return store_.restore(state); }

 private:
  TrajectoryStore& store_;
};

}  // namespace grpo
