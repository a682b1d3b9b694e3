// Asynchronous rollouts for the GRPO loop ([async] max_staleness = k > 0;
// docs/async.md is the user's view). The engine samples from its own copy of
// the weights (LoopRun::snapshot) on its own context (CPU threads / CUDA
// stream), so the trainer may write its weights while a batch is sampled.
//
// Versions: version v = the weights after v optimizer steps. After a prime at
// version s0 (the run's start, a resume, a checkpoint), generations
// s0 .. s0+k−1 are sampled from version s0 one after the other while the
// trainer waits; from then on, while the trainer takes step s+1 on the batch of
// generation s, the engine samples generation s+k from version s. So the batch
// of generation g always comes from version max(s0, g − k), whatever the
// timing. Both sides meet after every step: the trainer's new weights are
// copied into the snapshot there (one bf16 copy per step; the snapshot costs
// one extra copy of the weights in memory). With k ≥ 2 the engine is further
// ahead, but at most one batch is sampled while a step trains.
//
// The batch's old logprobs (TRL's old_per_token_logps, the "π_old" of the
// ratio) are computed on the engine side from the version that sampled it,
// so the clipped ratio and the importance-sampling correction see that
// version; RolloutBatch::policy_version tags every group of the batch.
//
// Checkpoints: the queued batches are discarded (drain) and the data cursor
// and generation counter rewound to the first of them, so a checkpoint holds
// no sampled-but-untrained data; the loop primes again from the checkpoint's
// weights, exactly as a resume from it does. Resume is therefore exact, and a
// checkpoint restarts the staleness at 0 for the next k batches.
//
// With rollout.server_url the separate server samples ahead instead (docs/async.md): no
// snapshot and no engine context; the launched requests are in flight at the server while
// the trainer steps, the weights reach the server through its bridge after the join (the
// loop publishes them), and each batch is tagged with the version the server answered
// from. There are no engine-side old logprobs: the trainer's logprobs before its step
// stand in (ratio 1) and train.importance_sampling (recommended) corrects for the lag
// against the sampler's logprobs.
//
// A lost server under rollout.server_on_failure = "local" (train/rollout_failover.h): the
// in-process engine shares the trainer's weights and context, so it never samples beside a
// step. The producer thread hands the loss back (the batch is not sampled; its prompts go back
// to the cursor), and join() samples that generation on the calling thread after the step,
// from the new weights; while the server stays lost, launch() starts nothing and join()
// samples each next generation the same way. Every such batch is at staleness 0, sampled from
// the weights a synchronous run would use (the same completions). Once the loop has found the
// server back (before launch()), the producer thread asks it again.
//
// Requires train.num_iterations = 1, train.steps_per_generation = 1, one rank,
// no [lora] (allowed with a server), no [server], no curriculum, data.env ≠ "remote"
// (checked at setup).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "core/status.h"
#include "train/loop_rollout.h"
#include "train/metrics_writer.h"

namespace grpo {

struct LoopRun;
struct RunConfig;

// Why `cfg` cannot run with asynchronous rollouts, or ok (also ok when async is off).
Status async_check_config(const RunConfig& cfg, int n_ranks);

class AsyncRollouts {
 public:
  explicit AsyncRollouts(LoopRun& r);
  ~AsyncRollouts();  // waits for a batch in flight
  AsyncRollouts(const AsyncRollouts&) = delete;
  AsyncRollouts& operator=(const AsyncRollouts&) = delete;

  bool primed() const { return primed_; }
  // Copies the trainer's weights into the snapshot and samples the next k generations
  // from them (on the engine's context, the calling thread waiting).
  Status prime();
  // The batch for the next optimizer step, with its version lag in `rec` (async/*).
  RolloutBatch pop(MetricList* rec);
  // Starts sampling the next generation on the engine side, unless the run needs no more.
  void launch();
  // After the trainer's step (which ended at t_train_end and made version `new_version`):
  // waits for the launched batch, copies the new weights into the snapshot, and adds
  // time/trainer_wait, time/engine_idle and time/snapshot_copy to `rec`.
  Status join(double t_train_end, int64_t new_version, MetricList* rec);
  // Discards the queued batches and rewinds the cursor and state.generation to the first
  // of them; the next pop primes again. No batch may be in flight.
  void drain();

 private:
  struct Queued {
    RolloutBatch batch;
    int64_t generation = 0;
    int64_t data_epoch = 0, data_index = 0;  // the cursor before the batch's prompts
    bool server_lost = false;  // on the producer thread: the server was lost, nothing was sampled
  };
  // The next generation; on_worker: on the producer thread (the engine may not sample).
  Result<Queued> produce(bool on_worker);
  Status refresh_snapshot(int64_t version);

  LoopRun& r_;
  int64_t k_ = 0;
  bool server_ = false;  // rollout.server_url: a server samples; no snapshot, no engine context
  int64_t version_ = 0;  // the snapshot's version
  bool primed_ = false;
  std::deque<Queued> queue_;
  std::thread worker_;
  std::unique_ptr<Result<Queued>> in_flight_;  // written by worker_
  double t_launch_ = 0, t_done_ = 0;           // of the batch in flight
  double prime_wait_ = 0;                      // reported with the next step
  bool launched_ = false;
  bool sample_at_join_ = false;  // the server is lost: join() samples the next generation on the engine
};

}  // namespace grpo
