// The data-parallel gradient all-reduce overlapped with the backward pass.
// The gradient arena is cut into the buckets of dist.bucket_mb (the same
// bounds as dp_all_reduce_grads). The training backward runs from the top of
// the model down and reports each finished layer (train_model_backward's
// layer hook); during the step's last micro-batch a bucket's gradients are
// final once every layer it touches has reported, and the bucket goes to a
// communication thread that all-reduces it while the backward continues
// (GPU: on the thread's own stream after the layer's kernels have run).
// finish() launches what is left and waits, before the optimizer step.
//
// Buckets are all-reduced in the same order on every rank (top of the arena
// first), as every collective must be. The MPI backend sums each element in
// rank order whatever the bucket, so the result is bitwise that of the
// all-reduce after the backward. A communicator whose collectives must stay
// on the main thread (MPI below THREAD_SERIALIZED) gets the buckets reduced
// inline at the same points instead, without overlap.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "core/context.h"
#include "dist/communicator.h"
#include "dist/device_mark.h"
#include "train/optimizer.h"

namespace grpo {

class GradReducer {
 public:
  // ctx: the trainer's context (its device decides whether the thread needs a stream).
  GradReducer(Context& ctx, Communicator& comm, int64_t bucket_elems);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Starts a step over opt's gradient arena (full-model training: opt.grads bound).
  void begin_step(const Optimizer& opt);
  // Backward hook of the last micro-batch: layer l's gradients are final
  // (l = n_layers: LM head and final norm; l = -1: the embedding, i.e. all).
  void on_layer_done(int l);
  // Launches the remaining buckets and waits for all of them; the first error of the step.
  Status finish();

  double busy_s() const { return busy_s_; }        // time spent inside the all-reduce calls this step
  double exposed_s() const { return exposed_s_; }  // time finish() waited after the backward had ended

 private:
  struct Item {
    int64_t off = 0, n = 0;
    DeviceMark mark;
  };
  void launch_from(int64_t final_from);
  void reduce(const Item& it);
  void worker();

  Context& ctx_;
  Communicator& comm_;
  int64_t bucket_elems_;
  std::unique_ptr<Context> comm_ctx_;  // CUDA: the communication stream
  Tensor arena_;
  const ModelWeights* grads_ = nullptr;
  int64_t next_bucket_ = -1;  // index of the highest bucket not launched yet
  double busy_s_ = 0, exposed_s_ = 0;
  Status error_;

  bool threaded_ = false;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  int64_t launched_ = 0, done_ = 0;
  bool stop_ = false;
};

}  // namespace grpo
