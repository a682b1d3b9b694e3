// Engine service: the one thread that drives an Engine on behalf of many callers
// (HTTP worker threads, and the training loop when it serves its live policy).
//
// Callers submit() a prompt with SamplingParams and get a RequestChannel; the
// loop thread admits queued submissions into the engine, steps it, and delivers
// every produced token (TokenEvent) and every finished sample (RequestOutput) to
// the request's channel. A caller that goes away cancels its channel; the loop
// then aborts the request in the engine, which frees its KV blocks.
//
// Weights change only while the service is paused: pause_and_drain() stops
// admissions, waits until the engine has no unfinished request and stops stepping;
// the caller may then use the engine and the weights (optimizer step, prefix cache
// reset) and bump the policy version before resume(). A request is answered under
// exactly one policy version: the one current when it was admitted.
//
// The Engine is used only by the loop thread while the service runs (unpaused), and
// only by the pausing thread while it is paused.
//
// It lives in engine/ (not server/) so that the training loop, which sits below the
// HTTP layer, can route its rollouts through the same queue as outside requests.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/service_metrics.h"

namespace grpo {

struct ServiceOptions {
  int max_queued_requests = 256;  // submitted and not yet finished, at most (more: submit says "queue full")
};

// What one request's caller sees. Thread-safe: written by the loop thread, read
// by the caller's thread.
class RequestChannel {
 public:
  RequestChannel(int n_samples, bool want_events) : n_expected_(n_samples), want_events_(want_events) {}

  // Waits up to `timeout` for news; moves the token events delivered so far into
  // `events` (when the request asked for them). Returns true once the request is
  // over (every sample finished, or it failed, or was cancelled).
  bool wait(std::vector<TokenEvent>* events, std::chrono::milliseconds timeout);
  // After wait() returned true: the finished samples ordered by sample index (empty
  // on error) and the error, if any.
  std::vector<RequestOutput> take_outputs();
  Status error() const;
  // The caller is gone: the loop aborts the request at its next iteration.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Waits until the loop has admitted the request into the engine (true) or the
  // request is over (false: see error()).
  bool wait_admitted(std::chrono::milliseconds timeout);
  int64_t policy_version() const { return policy_version_; }
  int64_t request_id() const { return request_id_; }

 private:
  friend class EngineService;
  void deliver(std::vector<TokenEvent>& evs, std::vector<RequestOutput>& outs);
  void fail(Status st);
  void mark_admitted(int64_t request_id, int64_t policy_version);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  std::vector<RequestOutput> outputs_;
  const int n_expected_;
  const bool want_events_;
  Status error_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> policy_version_{0};
  std::atomic<int64_t> request_id_{-1};
};

// Gauges the loop publishes after every iteration (read by /metrics and /health).
struct ServiceGauges {
  int n_pending = 0;        // submitted, not yet in the engine
  int n_waiting_seqs = 0;   // in the engine, waiting for admission
  int n_running_seqs = 0;
  int n_kv_blocks = 0, n_free_kv_blocks = 0;
  int n_active_requests = 0;
  int64_t engine_steps = 0, prefix_hit_tokens = 0, preemptions = 0;
  bool paused = false;
};

class EngineService {
 public:
  // The engine must outlive the service. Starts the loop thread.
  EngineService(Engine& engine, ServiceOptions opt);
  ~EngineService();  // stop()
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // Queues a request. Errors: the queue is full ("queue full: ..."; the caller may
  // retry later), or the service is stopping. Engine-side request errors (prompt too
  // long for the context or the KV pool, ids outside the vocabulary) arrive through
  // the channel. want_events: also deliver one TokenEvent per token (streaming).
  enum class SubmitError { none, queue_full, stopping };
  Result<std::shared_ptr<RequestChannel>> submit(std::vector<int32_t> prompt, const SamplingParams& params,
                                                 bool want_events, SubmitError* why = nullptr);

  // Blocking batch generation through the queue (the training loop's rollouts while
  // it serves): same contract and output order as Engine::generate. Not limited by
  // max_queued_requests.
  Result<std::vector<RequestOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                              const SamplingParams& params);
  // As above with one SamplingParams per prompt (per-prompt seeds).
  Result<std::vector<RequestOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<SamplingParams>& params);

  // Stops admitting, waits until every admitted request has finished, and parks the
  // loop; the calling thread may then use the engine. Submissions still queue up.
  void pause_and_drain();
  void resume();
  // Drains admitted and queued requests and ends the loop thread. Idempotent.
  void stop();

  // Runs fn(engine) on the loop thread between two steps, without draining: after the
  // requests whose callers left have been aborted, before queued ones are admitted (so a
  // request queued after this returns sees what fn did). Blocks until fn has run and
  // returns its status; while the service is paused it runs after resume(). Error when
  // the service is stopping. For small changes of engine state that the running requests
  // do not depend on (an adapter put into a free slot).
  Status run_on_loop(std::function<Status(Engine&)> fn);

  int64_t policy_version() const { return policy_version_; }
  // Call only while paused (the weights changed): later admissions carry `v`.
  void set_policy_version(int64_t v) { policy_version_ = v; }
  bool stopping() const { return stopping_; }

  ServiceGauges gauges() const;
  ServiceMetrics& metrics() { return metrics_; }
  const Engine& engine() const { return engine_; }

 private:
  struct Pending {
    std::vector<int32_t> prompt;
    SamplingParams params;
    std::shared_ptr<RequestChannel> ch;
    double t_submit = 0;
    bool counted = true;  // counts against max_queued_requests
  };
  struct Active {
    std::shared_ptr<RequestChannel> ch;
    std::vector<RequestOutput> outs;
    std::vector<double> t_last_token;  // per sample; < 0 before the first token
    double t_submit = 0;
    int n_finished = 0;
    bool counted = true;
  };
  Status enqueue(Pending p, SubmitError* why);
  void loop();
  void admit(Pending& p);
  void deliver_step(std::vector<TokenEvent>& evs, std::vector<RequestOutput>& outs);
  void publish_gauges();
  void deliver_loop();

  Engine& engine_;
  ServiceOptions opt_;
  ServiceMetrics metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the loop
  std::condition_variable idle_cv_;  // wakes pause_and_drain / stop
  std::deque<Pending> pending_;
  struct Task {
    std::function<Status(Engine&)> fn;
    std::shared_ptr<std::promise<Status>> done;
  };
  std::deque<Task> tasks_;           // run_on_loop's, run by the loop thread
  int n_counted_ = 0;                // requests counting against max_queued_requests
  bool paused_ = false, parked_ = false;
  std::atomic<bool> stopping_{false};
  bool loop_exited_ = false;
  std::atomic<int64_t> policy_version_{0};
  ServiceGauges gauges_;
  std::unordered_map<int64_t, Active> active_;  // loop thread only
  // Answers of one engine step, handed to the delivery thread: waking one caller per
  // request costs a few microseconds each, which the loop would otherwise spend between
  // two GPU steps. One thread, so every caller gets its steps in order.
  struct Handoff {
    std::shared_ptr<RequestChannel> ch;
    std::vector<TokenEvent> events;
    std::vector<RequestOutput> outputs;
  };
  std::mutex dmu_;
  std::condition_variable dcv_;       // wakes the delivery thread, and waiters for an empty queue
  std::deque<std::vector<Handoff>> delivery_;
  bool delivering_ = false, delivery_stop_ = false;
  std::thread deliver_thread_;
  std::thread thread_;
};

}  // namespace grpo
