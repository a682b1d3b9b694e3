#include "core/thread_pool.h"

namespace grpo {

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(int n_tasks, const std::function<void(int)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> run_lk(run_mu_);
  std::unique_lock<std::mutex> lk(mu_);
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_ = 0;
  done_ = 0;
  ++generation_;
  cv_work_.notify_all();
  while (next_ < n_tasks_) {
    int i = next_++;
    lk.unlock();
    fn(i);
    lk.lock();
    ++done_;
  }
  cv_done_.wait(lk, [&] { return done_ == n_tasks_; });
  fn_ = nullptr;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return stop_ || (generation_ != seen && fn_ && next_ < n_tasks_); });
    if (stop_) return;
    seen = generation_;
    while (fn_ && next_ < n_tasks_) {
      int i = next_++;
      const auto* fn = fn_;
      lk.unlock();
      (*fn)(i);
      lk.lock();
      if (++done_ == n_tasks_) cv_done_.notify_all();
    }
  }
}

}  // namespace grpo
