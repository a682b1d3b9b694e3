// A fixed pool of worker threads for CPU kernels. run(n_tasks, fn) calls
// fn(i) for i in [0, n_tasks) and returns when all are done; the calling
// thread takes part. Not re-entrant: a task must not call run() again.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace grpo {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }
  void run(int n_tasks, const std::function<void(int)>& fn);

 private:
  void worker_loop();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex run_mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int)>* fn_ = nullptr;
  int n_tasks_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace grpo
