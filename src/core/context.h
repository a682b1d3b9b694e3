// Execution context passed explicitly to every op: device, stream, BLAS
// handles, workspace and the CPU thread pool. No hidden global state: two
// contexts may coexist (e.g. trainer and a rollout engine on another GPU).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/tensor.h"

namespace grpo {

class ThreadPool;

struct ContextOptions {
  Device device = Device::cpu;
  int cuda_device = 0;
  int n_threads = 0;            // CPU worker threads; 0 = hardware concurrency
  size_t workspace_bytes = size_t(1) << 30;  // cuBLASLt / scratch workspace on the device (1 GiB: big LM-head logprob tiles)
  bool deterministic = false;   // prefer batch-invariant, run-to-run identical reductions
  // train.on_policy = "bitwise" on CUDA (docs/bitwise.md): every forward GEMM runs the one
  // batch-invariant kernel (a row's result never depends on M or the other rows), and the
  // trainer's attention forward takes the engine's per-token paged kernels. Implies nothing
  // on the CPU, whose deterministic kernels are batch-invariant already.
  bool batch_invariant = false;
  // CUDA: the stream gets the device's greatest priority, so that its kernels are scheduled
  // ahead of other streams' (the rollout engine beside a training step on one GPU).
  bool high_priority = false;
};

class Context {
 public:
  explicit Context(const ContextOptions& opt = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return opt_.device; }
  bool deterministic() const { return opt_.deterministic; }
  bool batch_invariant() const { return opt_.batch_invariant; }
  int n_threads() const;
  // Runs fn(begin, end) over [0, n) split into chunks across the pool. Blocks.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1) const;

  // CUDA objects (opaque here so that host-only code need not include CUDA headers).
  void* stream() const { return stream_; }           // cudaStream_t
  // The stream with shared ownership: it lives until the context and every tensor
  // allocated on it (StreamScope) are gone. Null on the CPU.
  const std::shared_ptr<void>& stream_ref() const { return stream_ref_; }
  void* cublaslt() const { return cublaslt_; }       // cublasLtHandle_t
  void* cublas() const { return cublas_; }           // cublasHandle_t
  Tensor& workspace() { return workspace_; }         // (bytes) u8 on the device
  void synchronize() const;                          // waits for the stream (no-op on the CPU)
  // Makes this context's GPU the calling thread's current device (CUDA's current
  // device is per thread): call it first in a thread that runs ops (no-op on the CPU).
  void make_current() const;

 private:
  ContextOptions opt_;
  std::unique_ptr<ThreadPool> pool_;
  void* stream_ = nullptr;
  std::shared_ptr<void> stream_ref_;
  void* cublaslt_ = nullptr;
  void* cublas_ = nullptr;
  Tensor workspace_;
};

// Makes ctx's stream the calling thread's stream for device allocations, copies and fills
// (tensor_thread_stream in core/tensor.h) until destroyed; the previous one comes back.
// For threads that share a GPU with work on other streams (asynchronous rollouts): their
// allocations, frees, copies and fills stop waiting for the whole device. A CPU context
// sets none. Everything the thread copies or fills must be ordered by ctx's stream.
class StreamScope {
 public:
  explicit StreamScope(const Context& ctx);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  std::shared_ptr<void> previous_;
};

}  // namespace grpo
