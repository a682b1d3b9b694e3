#include "core/context.h"

#include <algorithm>
#include <thread>

#include "core/thread_pool.h"

#ifdef GRPO_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace grpo {

Context::Context(const ContextOptions& opt) : opt_(opt) {
  int n = opt.n_threads > 0 ? opt.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  pool_ = std::make_unique<ThreadPool>(n);
  if (opt.device == Device::cuda) {
#ifdef GRPO_HAVE_CUDA
    GRPO_CHECK_MSG(cudaSetDevice(opt.cuda_device) == cudaSuccess, "cudaSetDevice failed");
    cudaStream_t s;
    int least = 0, greatest = 0;
    GRPO_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
    GRPO_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, opt.high_priority ? greatest : least) ==
               cudaSuccess);
    stream_ = s;
    // Destroyed after the context and every stream-ordered tensor on it (StreamScope).
    const int dev = opt.cuda_device;
    stream_ref_ = std::shared_ptr<void>(s, [dev](void* q) {
      cudaSetDevice(dev);
      cudaStreamSynchronize(static_cast<cudaStream_t>(q));
      cudaStreamDestroy(static_cast<cudaStream_t>(q));
    });
    cublasLtHandle_t lt;
    GRPO_CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    cublaslt_ = lt;
    cublasHandle_t h;
    GRPO_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    GRPO_CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS);
    cublas_ = h;
    workspace_ = tensor_empty(Device::cuda, DType::u8, {int64_t(opt.workspace_bytes)});
#else
    GRPO_CHECK_MSG(false, "this build has no CUDA backend (rebuild with nvcc present)");
#endif
  }
}

void Context::make_current() const {
#ifdef GRPO_HAVE_CUDA
  if (opt_.device == Device::cuda)
    GRPO_CHECK_MSG(cudaSetDevice(opt_.cuda_device) == cudaSuccess, "cudaSetDevice failed");
#endif
}

Context::~Context() {
#ifdef GRPO_HAVE_CUDA
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (cublaslt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
  workspace_ = Tensor();
  stream_ref_.reset();
#endif
}

int Context::n_threads() const { return pool_->size(); }

void Context::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) const {
  if (n <= 0) return;
  int64_t workers = pool_->size();
  int64_t chunks = std::min<int64_t>(workers * 4, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  pool_->run(int((n + per - 1) / per), [&](int i) {
    int64_t b = int64_t(i) * per;
    int64_t e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

StreamScope::StreamScope(const Context& ctx) : previous_(tensor_thread_stream()) {
  tensor_set_thread_stream(ctx.stream_ref());
}

StreamScope::~StreamScope() { tensor_set_thread_stream(std::move(previous_)); }

void Context::synchronize() const {
#ifdef GRPO_HAVE_CUDA
  if (stream_) GRPO_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)) == cudaSuccess);
#endif
}

}  // namespace grpo
