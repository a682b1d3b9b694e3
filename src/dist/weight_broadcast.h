// NCCL weight bridge (TRL's vLLM server mode; docs/serve.md, "Weight bridges"):
// after each optimizer step the trainer rank broadcasts its weights (full bf16
// arena, or the LoRA adapters' arena) to server ranks over a Communicator (NCCL
// between GPUs; MPI between CPU ranks, which is how it is tested).
//
// Transfer plan: the parameters in arena order (aliases such as a tied lm_head
// skipped), packed into buckets of at most bucket_bytes of consecutive arena bytes
// (a tensor larger than a bucket is split over several). Every bucket is one
// in-place broadcast of a byte range of the arena: no packing copies on either
// side, and the transient memory is nil. The plan's layout hash covers dtype,
// names, shapes and offsets; both sides compare it once (handshake) before any
// weights move, so a server of another model is refused on both sides.
//
// One update: a header (magic, version, kind, bucket count, total bytes; the
// version is the optimizer step, -1 = the trainer is done) reduced from the root,
// then the buckets in plan order. The receiver applies the header's version only
// after its last bucket arrived; callers pause serving around receive().
//
// Failure: a collective that fails (a server process lost: MPI aborts the job;
// NCCL's watchdog aborts the communicator after [dist] timeout_s) is reported with
// the version and bucket. on_failure = "error" returns it (the trainer stops);
// "continue" logs it once, marks the bridge down and lets training go on.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "dist/bootstrap.h"
#include "dist/communicator.h"
#include "model/lora.h"
#include "model/weights.h"

namespace grpo {

struct BroadcastTensor {
  std::string name;
  int64_t byte_offset = 0, nbytes = 0;  // in the arena
};

struct BroadcastBucket {
  int64_t byte_offset = 0, nbytes = 0;  // a range of the arena
  int first_tensor = 0, last_tensor = 0;  // tensors it touches (inclusive; a split tensor spans buckets)
};

enum class BroadcastKind { full = 0, adapter = 1 };

struct TransferPlan {
  BroadcastKind kind = BroadcastKind::full;
  DType dtype = DType::f32;
  int64_t total_bytes = 0;
  std::vector<BroadcastTensor> tensors;
  std::vector<BroadcastBucket> buckets;
  uint64_t layout_hash = 0;
  std::string summary() const;  // "N tensors, X MiB bf16 in B buckets of <= Y MiB"
};

// Precondition: bucket_bytes >= 1 and the tensors are views of the arena.
TransferPlan transfer_plan(const ModelWeights& w, int64_t bucket_bytes);
TransferPlan transfer_plan(const LoraWeights& l, int64_t bucket_bytes);

struct BroadcastOptions {
  int root = 0;                            // the trainer's rank
  int64_t bucket_bytes = int64_t(64) << 20;
  std::string on_failure = "error";        // "error" | "continue"
  Status validate() const;
};

struct BroadcastStats {
  int64_t n_updates = 0, bytes = 0;
  int64_t version = -1;       // last version sent / received
  double last_s = 0;          // last update's wall time (header + buckets)
  bool down = false;          // a failure took the bridge down (on_failure = "continue")
  std::string last_error;
};

// The bridge's own communicator between the trainer (rank 0) and n_servers server
// processes (ranks 1..n_servers, one GPU each): NCCL, its id handed out by the
// trainer over a TCP rendezvous at addr:port (dist/bootstrap.h). timeout_s bounds
// the rendezvous and every collective (a server waits for the trainer's next step
// inside one: give it more than a step takes). CUDA builds only; else an error.
Result<std::unique_ptr<Communicator>> bridge_connect_trainer(const std::string& addr, int port, int n_servers,
                                                             double timeout_s);
Result<std::unique_ptr<Communicator>> bridge_connect_server(const std::string& addr, int port, int rank,
                                                            double timeout_s);
// After the bridge went down (on_failure = "continue"): listens at the bridge's
// address again so that restarted servers (the same `grpo serve --receive`
// command) can rejoin. A thread waits until all n_servers have connected; then
// take() builds the new communicator, on which the caller makes a new
// WeightBroadcaster, handshakes and publishes the current version. CUDA builds
// only (else take() returns an error). The destructor cancels a wait in progress.
class BridgeRejoin {
 public:
  BridgeRejoin(std::string host, int port, int n_servers, double timeout_s);
  ~BridgeRejoin();
  BridgeRejoin(const BridgeRejoin&) = delete;
  BridgeRejoin& operator=(const BridgeRejoin&) = delete;
  // Every server has connected, or the wait failed (take() then returns why).
  bool ready() const { return ready_.load(); }
  // Precondition: ready(). Blocks in NCCL's set-up until the servers have joined.
  Result<std::unique_ptr<Communicator>> take();

 private:
  std::string host_;
  int port_, n_servers_;
  double timeout_s_;
  std::atomic<bool> cancel_{false}, ready_{false};
  Status status_;
  std::string id_;
  KeptLinks links_;
  std::thread thread_;
};

// "host:port" -> (host, port); the error names the flag or key `what`.
Status bridge_parse_addr(const std::string& s, const std::string& what, std::string* host, int* port);

// Both sides: checks that every rank holds the same plan. Collective.
Status broadcast_handshake(Communicator& comm, const TransferPlan& plan, const BroadcastOptions& opt);

class WeightBroadcaster {
 public:
  // arena: the trainer's (the plan's) arena; it must outlive the broadcaster.
  WeightBroadcaster(Communicator& comm, Tensor arena, TransferPlan plan, BroadcastOptions opt);
  // Collective with every receiver's handshake().
  Status handshake() { return broadcast_handshake(comm_, plan_, opt_); }
  // Sends the weights as `version`. Precondition: the step that wrote them has
  // completed on ctx's device. No-op once the bridge is down.
  Status publish(Context& ctx, int64_t version);
  // Tells the receivers the run is over (version -1).
  Status finish();
  const BroadcastStats& stats() const { return stats_; }
  const TransferPlan& plan() const { return plan_; }

 private:
  Status fail(Status st);
  Communicator& comm_;
  Tensor arena_;
  TransferPlan plan_;
  BroadcastOptions opt_;
  BroadcastStats stats_;
};

class WeightReceiver {
 public:
  // arena: the server's buffers the engine reads (same plan as the trainer's).
  WeightReceiver(Communicator& comm, Tensor arena, TransferPlan plan, BroadcastOptions opt);
  Status handshake() { return broadcast_handshake(comm_, plan_, opt_); }
  // Blocks until the trainer's next header: the version it announces, or -1 when
  // the trainer is done (then no buckets follow).
  Result<int64_t> wait_header();
  // Receives the announced update into the arena (serving paused by the caller).
  Status receive(Context& ctx);
  const BroadcastStats& stats() const { return stats_; }

 private:
  Communicator& comm_;
  Tensor arena_;
  TransferPlan plan_;
  BroadcastOptions opt_;
  BroadcastStats stats_;
  int64_t pending_ = -2;  // the announced version not yet received; -2: none
};

}  // namespace grpo
