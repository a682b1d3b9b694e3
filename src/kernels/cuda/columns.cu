// CUDA column-range ops: one element per thread, grid-stride over M·n. The
// arithmetic is cpu/columns.cpp's (scale·src in f32, one rounding to the dtype).
#include "kernels/columns.h"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"

namespace grpo::cuda {

namespace {
constexpr int kThreads = 256;

template <class T>
__global__ void columns_add_kernel(T* __restrict__ out, const T* __restrict__ src, int64_t M, int64_t N, int64_t n,
                                   int64_t col0, float scale) {
  const int64_t total = M * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i - r * n;
    T* o = out + r * N + col0 + j;
    *o = from_f32<T>(to_f32(*o) + scale * to_f32(src[i]));
  }
}

template <class T>
__global__ void columns_copy_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t M, int64_t N, int64_t n,
                                    int64_t col0, float scale) {
  const int64_t total = M * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i - r * n;
    dst[i] = from_f32<T>(scale * to_f32(src[r * N + col0 + j]));
  }
}
}  // namespace

void columns_add(Context& ctx, Tensor& out, const Tensor& src, int64_t col0, float scale) {
  const int64_t M = out.shape[0], N = out.shape[1], n = src.shape[1];
  if (M * n == 0) return;
  GRPO_DISPATCH_FLOAT(out.dtype, T, {
    columns_add_kernel<T><<<flat_grid(M * n, kThreads), kThreads, 0, stream_of(ctx)>>>(out.ptr<T>(), src.ptr<T>(), M,
                                                                                       N, n, col0, scale);
  });
  CUDA_CHECK_LAUNCH();
}

void columns_copy(Context& ctx, Tensor& dst, const Tensor& src, int64_t col0, float scale) {
  const int64_t M = src.shape[0], N = src.shape[1], n = dst.shape[1];
  if (M * n == 0) return;
  GRPO_DISPATCH_FLOAT(dst.dtype, T, {
    columns_copy_kernel<T><<<flat_grid(M * n, kThreads), kThreads, 0, stream_of(ctx)>>>(dst.ptr<T>(), src.ptr<T>(), M,
                                                                                        N, n, col0, scale);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace grpo::cuda
