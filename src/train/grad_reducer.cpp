// Gradient all-reduce overlapped with the backward (see grad_reducer.h).
#include "train/grad_reducer.h"

#include <algorithm>

#include "core/check.h"
#include "core/timer.h"

namespace grpo {

namespace {

int64_t offset_in(const Tensor& arena, const Tensor& t) {
  return int64_t((static_cast<const char*>(t.data) - static_cast<const char*>(arena.data)) / sizeof(float));
}

}  // namespace

GradReducer::GradReducer(Context& ctx, Communicator& comm, int64_t bucket_elems)
    : ctx_(ctx), comm_(comm), bucket_elems_(std::max<int64_t>(1, bucket_elems)) {
  threaded_ = comm.any_thread();
  if (!threaded_) return;
  if (ctx.device() == Device::cuda) {
    ContextOptions o;
    o.device = Device::cuda;
    ctx.make_current();
    o.cuda_device = device_current_cuda();
    o.n_threads = 1;
    o.workspace_bytes = size_t(1) << 20;  // collectives need no GEMM workspace
    comm_ctx_ = std::make_unique<Context>(o);
  }
  thread_ = std::thread([this] { worker(); });
}

GradReducer::~GradReducer() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradReducer::begin_step(const Optimizer& opt) {
  if (threaded_) {  // a step that failed before finish() may have left buckets in flight
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_ == launched_; });
  }
  GRPO_CHECK_MSG(opt.grad_arena.dtype == DType::f32 && !opt.adapters && !opt.grads.layers.empty(),
                 "GradReducer: full-model f32 gradients expected");
  arena_ = opt.grad_arena;
  grads_ = &opt.grads;
  const int64_t n = arena_.numel();
  next_bucket_ = (n + bucket_elems_ - 1) / bucket_elems_ - 1;
  busy_s_ = exposed_s_ = 0;
  error_ = ok_status();
}

void GradReducer::on_layer_done(int l) {
  const int n_layers = int(grads_->layers.size());
  int64_t from = 0;
  if (l >= n_layers) from = offset_in(arena_, grads_->final_norm);  // an untied lm_head lies above it
  else if (l >= 0) from = offset_in(arena_, grads_->layers[size_t(l)].attn_norm);  // a layer's first tensor
  launch_from(from);
}

void GradReducer::launch_from(int64_t final_from) {
  const int64_t n = arena_.numel();
  while (next_bucket_ >= 0 && next_bucket_ * bucket_elems_ >= final_from) {
    Item it;
    it.off = next_bucket_ * bucket_elems_;
    it.n = std::min(bucket_elems_, n - it.off);
    --next_bucket_;
    if (!threaded_) {
      reduce(it);
      continue;
    }
    it.mark = device_mark(ctx_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(it));
      ++launched_;
    }
    cv_.notify_all();
  }
}

void GradReducer::reduce(const Item& it) {
  device_mark_wait(it.mark);
  if (!error_.ok()) return;  // the communicator failed: later collectives cannot succeed
  Tensor bucket = tensor_borrow(static_cast<float*>(arena_.data) + it.off, DType::f32, arena_.device, {it.n});
  bucket.owner = arena_.owner;
  const double t0 = now_seconds();
  Status st = comm_.all_reduce_sum(comm_ctx_ ? *comm_ctx_ : ctx_, bucket);
  busy_s_ += now_seconds() - t0;
  if (!st.ok()) error_ = st.with_context("gradient all-reduce of elements [" + std::to_string(it.off) + ", " +
                                         std::to_string(it.off + it.n) + ")");
}

void GradReducer::worker() {
  if (comm_ctx_) comm_ctx_->make_current();
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    Item it = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    reduce(it);
    l.lock();
    ++done_;
    cv_.notify_all();
  }
}

Status GradReducer::finish() {
  launch_from(0);
  ctx_.synchronize();  // the backward has ended: what is still waited for below is exposed communication
  const double t0 = now_seconds();
  if (threaded_) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_ == launched_; });
  }
  // Inline reduction (no thread) overlaps nothing: all of it is exposed.
  exposed_s_ = threaded_ ? now_seconds() - t0 : busy_s_;
  return error_;
}

}  // namespace grpo
