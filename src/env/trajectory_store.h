// The state behind the Atropos-compatible trajectory API (docs/environments.md):
// the trainer's registration, the registered environments, the queue of scored
// groups that environment processes post, and the batcher that hands the trainer
// whole groups totalling exactly batch_size sequences. Field names and semantics
// follow NousResearch/atropos atroposlib/api/server.py; the HTTP layer
// (server/trajectory_api.h) only maps routes onto these methods, so everything
// here is testable without sockets.
//
// Where we differ from Atropos, on purpose:
//   - malformed posts get 400 with a message naming the field (Atropos: 422 from
//     pydantic for type errors, and it accepts tokens/masks/scores of mismatched
//     lengths); nothing of a rejected post is enqueued (a list is all or nothing);
//   - the queue is bounded (max_queued_sequences): a post that does not fit gets
//     503 with Retry-After and is not enqueued (Atropos grows without bound);
//   - /batch before POST /register answers {"status": "error", "message": ...},
//     the shape Atropos's example trainer checks for (Atropos raises a 500).
// Thread-safe: every method takes the one lock.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace grpo {

// What an endpoint answers: a status code and a JSON body, or plain text when
// `text` is set (GET /reset_data). retry_after_s > 0 adds a Retry-After header.
struct ApiReply {
  int status = 200;
  nlohmann::json body;
  std::string text;
  int retry_after_s = 0;
};

// Checks one posted group (ScoredData) and returns it with all twelve keys of
// Atropos's stored dict (absent optional fields as null). Errors name the field
// and the sequence: tokens, masks and scores are required; tokens[i] and
// masks[i] have equal lengths; scores has one number per sequence; the
// per-token optional lists (advantages, ref_logprobs, inference_logprobs) have
// one list per sequence, each as long as tokens[i]; overrides one object per
// sequence; messages entries carry role and content.
Result<nlohmann::json> scored_data_normalize(const nlohmann::json& in);

// Atropos's find_groups_summing_to_target: indices (ascending) of groups whose
// sizes sum exactly to `target`, preferring the FIFO prefix, else any subset
// (preferring earlier groups); empty when impossible.
std::vector<size_t> groups_summing_to(const std::vector<int64_t>& sizes, int64_t target);

struct BatchEnv {  // what the batcher needs of an environment
  int64_t id = 0;
  bool connected = true;
  std::optional<double> min_batch_allocation;
};

// Atropos's batch selection over group sizes (and their env ids, -1 = none):
// groups of the largest size stand alone; smaller groups of one size are taken
// only in packs that add up to the largest size, in queue order. With minimum
// allocations (connected environments only) each such environment first gets
// at least floor(batch_size·min) sequences (scaled down when they overflow the
// batch). Returns the chosen queue indices, or empty when no exact batch exists.
std::vector<size_t> batch_select(const std::vector<int64_t>& sizes, const std::vector<int64_t>& env_ids,
                                 int64_t batch_size, const std::vector<BatchEnv>& envs);

struct TrajectoryStoreOptions {
  int64_t max_queued_sequences = 0;  // queued + buffered sequences at most; 0 = unbounded
  int retry_after_s = 1;             // Retry-After of a refused post
};

struct TrajectoryCounters {
  int64_t groups_received = 0, sequences_received = 0;  // accepted posts (queued or buffered)
  int64_t posts_rejected = 0;                           // 400s
  int64_t posts_refused_full = 0;                       // 503s
  int64_t batches_formed = 0;
  int64_t queued_groups = 0, queued_sequences = 0, buffered_sequences = 0;
  int64_t envs_registered = 0, envs_connected = 0;
  double last_post_time = 0;                            // unix seconds; 0 = none yet
};

class TrajectoryStore {
 public:
  explicit TrajectoryStore(TrajectoryStoreOptions opt = {});

  ApiReply register_trainer(const nlohmann::json& body);   // POST /register
  ApiReply register_env(const nlohmann::json& body);       // POST /register-env
  ApiReply disconnect_env(const nlohmann::json& body);     // POST /disconnect-env
  ApiReply info() const;                                   // GET /info
  ApiReply wandb_info() const;                             // GET /wandb_info
  ApiReply batch();                                        // GET /batch
  ApiReply scored_data(const nlohmann::json& body);        // POST /scored_data
  ApiReply scored_data_list(const nlohmann::json& body);   // POST /scored_data_list
  ApiReply status() const;                                 // GET /status
  ApiReply status_env(const nlohmann::json& body);         // GET /status-env ({"env_id": n})
  ApiReply latest_example() const;                         // GET /latest_example
  ApiReply reset_data();                                   // GET /reset_data

  TrajectoryCounters counters() const;
  bool trainer_registered() const;

  // What a resumed trainer needs while environments reconnect (saved with each
  // checkpoint of `grpo train` hosting the API): the registered environments (ids,
  // names, weights, minimum allocations, group sizes, connected flags), the queued,
  // buffered and formed-but-unserved groups, the latest example and the cumulative
  // counters. Not the trainer's registration: the resumed trainer registers anew.
  nlohmann::json snapshot() const;
  // Replaces environments, groups and counters with a snapshot(); call it after the
  // resumed trainer's register_trainer. Every group is checked again as a post would
  // be; errors name the part of the snapshot that is wrong, and leave the store as it was.
  Status restore(const nlohmann::json& snap);
  static constexpr int kSnapshotVersion = 1;

 private:
  struct Env {
    int64_t max_context_len = 0;
    double weight = 1.0;
    std::string desired_name, real_name;
    int64_t registered_id = 0;
    double last_update = 0;
    bool connected = true;
    std::optional<double> min_batch_allocation;
    int64_t group_size = 1;
  };
  // Queues (or buffers, for a group whose size differs from its env's) one
  // normalized group. Lock held.
  nlohmann::json accept_locked(nlohmann::json group);
  int64_t pending_sequences_locked() const;
  void clear_locked();

  TrajectoryStoreOptions opt_;
  mutable std::mutex mu_;
  bool registered_ = false;
  bool started_ = false;
  std::string wandb_group_, wandb_project_;
  bool has_wandb_ = false;
  int64_t batch_size_ = -1, max_token_len_ = -1;
  int64_t step_ = 0;
  std::string checkpoint_dir_;
  int64_t save_checkpoint_interval_ = 0, num_steps_ = -1;
  std::vector<uint64_t> requesters_;
  std::vector<Env> envs_;
  std::vector<nlohmann::json> queue_;
  std::vector<std::vector<nlohmann::json>> buffer_;  // per env id: mixed-size groups waiting to add up
  std::vector<nlohmann::json> curr_batch_;           // formed batches not yet handed out (served last-first)
  std::optional<nlohmann::json> latest_;
  TrajectoryCounters ctr_;
};

}  // namespace grpo
