// The NCCL backend for GPU ranks (see communicator.h). Collectives are
// enqueued on the caller's stream; wait() polls them with a watchdog: when a
// peer stops answering for timeout_s, or NCCL reports an async error, the
// communicator is aborted (ncclCommAbort) and the call returns an error
// instead of hanging. Host-side collectives go through a small device buffer.
#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "core/context.h"
#include "core/timer.h"
#include "dist/bootstrap.h"

namespace grpo {

namespace {

Status nccl_status(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess || rc == ncclInProgress) return ok_status();
  return error_status(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(rc));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: return ncclInt8;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t c, int rank, int size, double timeout_s, std::unique_ptr<PeerWatch> watch)
      : comm_(c), rank_(rank), size_(size), timeout_s_(timeout_s), watch_(std::move(watch)) {
    GRPO_CHECK(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~NcclCommunicator() override {
    // Abort, not destroy: ncclCommDestroy finalizes with the peers and blocked the
    // trainer's exit for as long as a `grpo serve --receive` kept its end of the
    // weight bridge open (two-GPU run). By now every collective has completed or
    // failed, so aborting loses nothing.
    if (comm_) ncclCommAbort(comm_);
    if (host_buf_) cudaFree(host_buf_);
    cudaStreamDestroy(host_stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  void finish() override {
    if (watch_) watch_->finish();
  }
  void notify_peers() override {
    if (watch_) watch_->notify();
  }
  Status wait_notice(double timeout_s) override { return watch_ ? watch_->wait_notice(timeout_s) : ok_status(); }

  Status all_reduce_sum(Context& ctx, Tensor& t) override {
    if (t.device != Device::cuda || t.dtype != DType::f32)
      return error_status("NCCL all-reduce takes f32 device tensors");
    cudaStream_t s = static_cast<cudaStream_t>(ctx.stream());
    GRPO_TRY(nccl_status(ncclAllReduce(t.data, t.data, size_t(t.numel()), ncclFloat32, ncclSum, comm_, s), "all-reduce"));
    return wait(s, "all-reduce");
  }

  Status all_reduce_host(std::span<double> v, HostReduce op) override {
    GRPO_TRY(ensure_host_buf(v.size_bytes()));
    cudaMemcpyAsync(host_buf_, v.data(), v.size_bytes(), cudaMemcpyHostToDevice, host_stream_);
    const ncclRedOp_t o = op == HostReduce::sum ? ncclSum : op == HostReduce::max ? ncclMax : ncclMin;
    GRPO_TRY(nccl_status(ncclAllReduce(host_buf_, host_buf_, v.size(), ncclFloat64, o, comm_, host_stream_),
                         "all-reduce of host values"));
    GRPO_TRY(wait(host_stream_, "all-reduce of host values"));
    cudaMemcpy(v.data(), host_buf_, v.size_bytes(), cudaMemcpyDeviceToHost);
    return ok_status();
  }

  Result<std::vector<float>> all_gather_host(std::span<const float> mine) override {
    std::vector<double> counts(size_t(size_), 0.0);
    counts[size_t(rank_)] = double(mine.size());
    GRPO_TRY(all_reduce_host(counts, HostReduce::sum));
    std::vector<int64_t> b(size_t(size_) + 1, 0);
    for (int r = 0; r < size_; ++r) b[size_t(r) + 1] = b[size_t(r)] + int64_t(counts[size_t(r)]);
    GRPO_TRY(ensure_host_buf(size_t(b.back()) * sizeof(float)));
    float* d = static_cast<float*>(host_buf_);
    cudaMemcpyAsync(d + b[size_t(rank_)], mine.data(), mine.size_bytes(), cudaMemcpyHostToDevice, host_stream_);
    GRPO_TRY(broadcast_ranges(d, b, sizeof(float), host_stream_));
    GRPO_TRY(wait(host_stream_, "all-gather of host values"));
    std::vector<float> out(size_t(b.back()));
    cudaMemcpy(out.data(), d, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }

  Status all_gather_ranges(Context& ctx, Tensor& arena, std::span<const int64_t> bounds) override {
    if (arena.device != Device::cuda) return error_status("NCCL all-gather takes device tensors");
    GRPO_CHECK(bounds.size() == size_t(size_) + 1 && bounds.back() <= arena.numel());
    cudaStream_t s = static_cast<cudaStream_t>(ctx.stream());
    GRPO_TRY(broadcast_ranges(arena.data, std::vector<int64_t>(bounds.begin(), bounds.end()),
                              dtype_size(arena.dtype), s));
    return wait(s, "all-gather of ZeRO-1 weights");
  }

  Status broadcast(Context& ctx, Tensor& t, int root) override {
    if (t.device != Device::cuda) return error_status("NCCL broadcast takes device tensors");
    GRPO_CHECK(root >= 0 && root < size_);
    cudaStream_t s = static_cast<cudaStream_t>(ctx.stream());
    GRPO_TRY(nccl_status(ncclBroadcast(t.data, t.data, t.nbytes(), ncclInt8, root, comm_, s), "broadcast"));
    return wait(s, "broadcast");
  }

  Status barrier() override {
    double x = 0;
    return all_reduce_host(std::span<double>(&x, 1), HostReduce::sum);
  }

 private:
  // Shards of unequal length: one broadcast per owner, grouped into one launch.
  Status broadcast_ranges(void* data, const std::vector<int64_t>& b, size_t es, cudaStream_t s) {
    char* base = static_cast<char*>(data);
    GRPO_TRY(nccl_status(ncclGroupStart(), "group start"));
    for (int r = 0; r < size_; ++r) {
      const size_t bytes = size_t(b[size_t(r) + 1] - b[size_t(r)]) * es;
      char* p = base + size_t(b[size_t(r)]) * es;
      ncclResult_t rc = ncclBroadcast(p, p, bytes, ncclInt8, r, comm_, s);
      if (rc != ncclSuccess) {
        ncclGroupEnd();
        return nccl_status(rc, "broadcast");
      }
    }
    return nccl_status(ncclGroupEnd(), "group end");
  }

  // The watchdog: a peer that never joins leaves the stream unfinished.
  Status wait(cudaStream_t s, const char* what) {
    const double deadline = now_seconds() + timeout_s_;
    while (true) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return ok_status();
      if (q != cudaErrorNotReady) return error_status(std::string("CUDA error during NCCL ") + what + ": " +
                                                      cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const bool late = now_seconds() > deadline;
      const std::string lost = watch_ ? watch_->lost() : std::string();
      if (async != ncclSuccess || late || !lost.empty()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        const std::string why = !lost.empty() ? lost
                                : late        ? "no progress for " + std::to_string(int(timeout_s_)) +
                                                    " s (a peer rank died or hangs; [dist] timeout_s)"
                                              : std::string(ncclGetErrorString(async));
        return error_status(std::string("NCCL ") + what + " on rank " + std::to_string(rank_) + ": " + why +
                            "; the communicator was aborted, restart the job from the last checkpoint");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status ensure_host_buf(size_t bytes) {
    if (bytes <= host_cap_) return ok_status();
    if (host_buf_) cudaFree(host_buf_);
    host_buf_ = nullptr;
    if (cudaMalloc(&host_buf_, bytes) != cudaSuccess) return error_status("NCCL staging buffer: out of device memory");
    host_cap_ = bytes;
    return ok_status();
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
  std::unique_ptr<PeerWatch> watch_;  // env launch / weight bridge: the peers' liveness links
  cudaStream_t host_stream_ = nullptr;
  void* host_buf_ = nullptr;
  size_t host_cap_ = 0;
};

}  // namespace

Result<std::string> nccl_make_id() {
  ncclUniqueId id;
  GRPO_TRY(nccl_status(ncclGetUniqueId(&id), "get unique id"));
  return std::string(id.internal, sizeof id.internal);
}

Result<std::unique_ptr<Communicator>> communicator_nccl_create(const std::string& id_bytes, int rank, int world,
                                                               double timeout_s, std::unique_ptr<PeerWatch> watch) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof id.internal) return error_status("NCCL bootstrap: the unique id arrived damaged");
  std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);
  ncclComm_t c = nullptr;
  GRPO_TRY(nccl_status(ncclCommInitRank(&c, world, id, rank), "communicator set-up (ncclCommInitRank)"));
  return std::unique_ptr<Communicator>(new NcclCommunicator(c, rank, world, timeout_s, std::move(watch)));
}

}  // namespace grpo
#endif  // GRPO_HAVE_CUDA
