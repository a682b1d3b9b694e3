// Engine service (see engine_service.h).
#include "engine/engine_service.h"

#include <algorithm>
#include <unordered_map>

#include "core/check.h"
#include "core/timer.h"

namespace grpo {

bool RequestChannel::wait(std::vector<TokenEvent>* events, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !events_.empty(); });
  if (events)
    while (!events_.empty()) {
      events->push_back(std::move(events_.front()));
      events_.pop_front();
    }
  return done_ && events_.empty();
}

std::vector<RequestOutput> RequestChannel::take_outputs() {
  std::lock_guard<std::mutex> lk(mu_);
  std::sort(outputs_.begin(), outputs_.end(),
            [](const RequestOutput& a, const RequestOutput& b) { return a.sample_index < b.sample_index; });
  return std::move(outputs_);
}

Status RequestChannel::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void RequestChannel::deliver(std::vector<TokenEvent>& evs, std::vector<RequestOutput>& outs) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (want_events_)
      for (auto& e : evs) events_.push_back(std::move(e));
    for (auto& o : outs) outputs_.push_back(std::move(o));
    done_ = int(outputs_.size()) >= n_expected_;
  }
  cv_.notify_all();
}

bool RequestChannel::wait_admitted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || request_id_ >= 0; });
  return request_id_ >= 0 && error_.ok();
}

void RequestChannel::mark_admitted(int64_t request_id, int64_t policy_version) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    request_id_ = request_id;
    policy_version_ = policy_version;
  }
  cv_.notify_all();
}

void RequestChannel::fail(Status st) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = std::move(st);
    done_ = true;
  }
  cv_.notify_all();
}

EngineService::EngineService(Engine& engine, ServiceOptions opt) : engine_(engine), opt_(opt) {
  GRPO_CHECK(opt_.max_queued_requests >= 1);
  publish_gauges();
  deliver_thread_ = std::thread([this] { deliver_loop(); });
  thread_ = std::thread([this] { loop(); });
}

void EngineService::deliver_loop() {
  std::unique_lock<std::mutex> lk(dmu_);
  for (;;) {
    dcv_.wait(lk, [&] { return delivery_stop_ || !delivery_.empty(); });
    if (delivery_.empty()) return;  // stopping, and everything handed over is delivered
    std::vector<Handoff> batch = std::move(delivery_.front());
    delivery_.pop_front();
    delivering_ = true;
    lk.unlock();
    for (auto& h : batch) h.ch->deliver(h.events, h.outputs);
    batch.clear();
    lk.lock();
    delivering_ = false;
    if (delivery_.empty()) dcv_.notify_all();
  }
}

EngineService::~EngineService() { stop(); }

Status EngineService::enqueue(Pending p, SubmitError* why) {
  SubmitError dummy;
  if (!why) why = &dummy;
  *why = SubmitError::none;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      *why = SubmitError::stopping;
      return error_status("the server is shutting down; retry against another instance");
    }
    if (p.counted && n_counted_ >= opt_.max_queued_requests) {
      *why = SubmitError::queue_full;
      return error_status("queue full: " + std::to_string(n_counted_) +
                          " requests are in flight (max_queued_requests); retry later");
    }
    if (p.counted) ++n_counted_;
    p.t_submit = now_seconds();
    pending_.push_back(std::move(p));
    gauges_.n_pending = int(pending_.size());
  }
  cv_.notify_all();
  return ok_status();
}

Result<std::shared_ptr<RequestChannel>> EngineService::submit(std::vector<int32_t> prompt, const SamplingParams& params,
                                                              bool want_events, SubmitError* why) {
  auto ch = std::make_shared<RequestChannel>(params.n, want_events);
  Pending p{std::move(prompt), params, ch, 0, true};
  GRPO_TRY(enqueue(std::move(p), why));
  return ch;
}

Result<std::vector<RequestOutput>> EngineService::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                           const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params));
}

Result<std::vector<RequestOutput>> EngineService::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<SamplingParams>& params) {
  GRPO_CHECK(params.size() == prompts.size());
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ch = std::make_shared<RequestChannel>(params[i].n, false);
    Status st = enqueue(Pending{prompts[i], params[i], ch, 0, false}, nullptr);
    if (!st.ok()) {
      for (auto& c : chans) c->cancel();
      return st.with_context("prompt " + std::to_string(i));
    }
    chans.push_back(ch);
  }
  std::vector<RequestOutput> result;
  for (size_t i = 0; i < chans.size(); ++i) {
    while (!chans[i]->wait(nullptr, std::chrono::milliseconds(100))) {
    }
    Status st = chans[i]->error();
    if (!st.ok()) {
      for (auto& c : chans) c->cancel();
      return st.with_context("prompt " + std::to_string(i));
    }
    for (auto& o : chans[i]->take_outputs()) result.push_back(std::move(o));
  }
  return result;
}

Status EngineService::run_on_loop(std::function<Status(Engine&)> fn) {
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> f = done->get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || loop_exited_) return error_status("the engine service is stopping");
    tasks_.push_back(Task{std::move(fn), done});
  }
  cv_.notify_all();
  return f.get();
}

void EngineService::pause_and_drain() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    paused_ = true;
    cv_.notify_all();
    idle_cv_.wait(lk, [&] { return parked_ || loop_exited_; });
  }
  // Every answer of the drained requests is in its caller's hands.
  std::unique_lock<std::mutex> dl(dmu_);
  dcv_.wait(dl, [&] { return delivery_.empty() && !delivering_; });
}

void EngineService::resume() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    paused_ = false;  // parked_ is cleared by the loop when it really leaves the park: a
                      // pause that comes before it wakes finds it still parked
  }
  cv_.notify_all();
}

void EngineService::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lk(dmu_);
    delivery_stop_ = true;
  }
  dcv_.notify_all();
  if (deliver_thread_.joinable()) deliver_thread_.join();
}

ServiceGauges EngineService::gauges() const {
  std::lock_guard<std::mutex> lk(mu_);
  return gauges_;
}

void EngineService::publish_gauges() {
  ServiceGauges g;
  g.n_waiting_seqs = engine_.n_waiting();
  g.n_running_seqs = engine_.n_running();
  g.n_kv_blocks = engine_.n_kv_blocks();
  g.n_free_kv_blocks = engine_.n_free_kv_blocks();
  g.n_active_requests = int(active_.size());
  g.engine_steps = engine_.stats().steps;
  g.prefix_hit_tokens = engine_.stats().prefix_hit_tokens;
  g.preemptions = engine_.stats().preemptions;
  std::lock_guard<std::mutex> lk(mu_);
  g.n_pending = int(pending_.size());
  g.paused = paused_;
  gauges_ = g;
}

void EngineService::admit(Pending& p) {
  if (p.ch->cancelled()) {
    p.ch->fail(error_status("request cancelled by the client"));
    std::lock_guard<std::mutex> lk(metrics_.mu);
    ++metrics_.requests_aborted;
    return;
  }
  auto rid = engine_.add_request(std::move(p.prompt), p.params);
  if (!rid.ok()) {
    p.ch->fail(rid.status());
    std::lock_guard<std::mutex> lk(metrics_.mu);
    ++metrics_.requests_failed;
    return;
  }
  p.ch->mark_admitted(rid.value(), policy_version_.load());
  Active a;
  a.ch = p.ch;
  a.t_submit = p.t_submit;
  a.t_last_token.assign(size_t(p.params.n), -1.0);
  a.counted = p.counted;
  active_.emplace(rid.value(), std::move(a));
}

void EngineService::deliver_step(std::vector<TokenEvent>& evs, std::vector<RequestOutput>& outs) {
  const double now = now_seconds();
  std::unordered_map<int64_t, std::pair<std::vector<TokenEvent>, std::vector<RequestOutput>>> per;
  per.reserve(active_.size());
  for (auto& e : evs) {
    auto it = active_.find(e.request_id);
    if (it == active_.end()) continue;  // a request run by someone else through the engine
    double& last = it->second.t_last_token[size_t(e.sample_index)];
    if (last < 0) metrics_.ttft_s.observe(now - it->second.t_submit);
    else metrics_.inter_token_s.observe(now - last);
    last = now;
    per[e.request_id].first.push_back(std::move(e));
  }
  for (auto& o : outs) per[o.request_id].second.push_back(std::move(o));
  // Bookkeeping and gauges first, so that a caller woken by its answer already sees
  // them (the metrics page, the KV pool, the queue limit).
  std::vector<Handoff> handoff;
  handoff.reserve(per.size());
  for (auto& [rid, v] : per) {
    auto it = active_.find(rid);
    if (it == active_.end()) continue;
    Active& a = it->second;
    {
      std::lock_guard<std::mutex> lk(metrics_.mu);
      metrics_.generation_tokens += v.first.size();
      for (const auto& o : v.second) {
        ++metrics_.finish_reasons[finish_reason_name(o.finish_reason)];
        if (o.sample_index == 0) metrics_.prompt_tokens += o.prompt_ids.size();
      }
    }
    a.n_finished += int(v.second.size());
    handoff.push_back(Handoff{a.ch, std::move(v.first), std::move(v.second)});
    if (a.n_finished >= int(a.t_last_token.size())) {
      metrics_.e2e_s.observe(now - a.t_submit);
      {
        std::lock_guard<std::mutex> lk(metrics_.mu);
        ++metrics_.requests_finished;
      }
      if (a.counted) {
        std::lock_guard<std::mutex> lk(mu_);
        --n_counted_;
      }
      active_.erase(it);
    }
  }
  publish_gauges();
  if (handoff.empty()) return;
  {
    std::lock_guard<std::mutex> lk(dmu_);
    delivery_.push_back(std::move(handoff));
  }
  dcv_.notify_all();  // the delivery thread (pause_and_drain may wait on the same variable)
}

void EngineService::loop() {
  engine_.context().make_current();
  std::vector<TokenEvent> evs;
  for (;;) {
    std::deque<Pending> take;
    std::deque<Task> tasks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(50), [&] {
        return stopping_.load() || (!paused_ && !pending_.empty()) || !active_.empty() || paused_ || !tasks_.empty();
      });
      if (paused_ && active_.empty()) {
        parked_ = true;
        gauges_.paused = true;
        idle_cv_.notify_all();
        cv_.wait(lk, [&] { return !paused_ || stopping_.load(); });
        parked_ = false;
        continue;
      }
      if (stopping_ && pending_.empty() && active_.empty() && tasks_.empty()) break;
      if (!paused_) {
        take.swap(pending_);
        gauges_.n_pending = 0;
      }
      tasks.swap(tasks_);
    }
    // Callers that left: abort their requests (frees their KV blocks).
    for (auto it = active_.begin(); it != active_.end();) {
      if (!it->second.ch->cancelled()) {
        ++it;
        continue;
      }
      engine_.abort_request(it->first);
      it->second.ch->fail(error_status("request cancelled by the client"));
      {
        std::lock_guard<std::mutex> lk(metrics_.mu);
        ++metrics_.requests_aborted;
      }
      if (it->second.counted) {
        std::lock_guard<std::mutex> lk(mu_);
        --n_counted_;
      }
      it = active_.erase(it);
    }
    // Tasks see the engine without the requests just aborted, and before the new ones.
    for (auto& t : tasks) t.done->set_value(t.fn(engine_));
    tasks.clear();
    // Queued requests whose caller left are dropped; the rest join the engine's batch.
    for (auto& p : take) {
      const bool counted = p.counted;
      admit(p);
      if (counted && !active_.count(p.ch->request_id())) {
        std::lock_guard<std::mutex> lk(mu_);
        --n_counted_;
      }
    }
    if (engine_.has_unfinished()) {
      evs.clear();
      std::vector<RequestOutput> outs = engine_.step(&evs);
      deliver_step(evs, outs);  // publishes the gauges
    } else {
      publish_gauges();
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  loop_exited_ = true;
  idle_cv_.notify_all();
}

}  // namespace grpo
