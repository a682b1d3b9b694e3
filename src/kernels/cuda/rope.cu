// CUDA rotary embedding (rotate_half convention, as cpu/rope.cpp): one thread per
// (token, head, pair i < D/2); the backward is the rotation by −θ. In place.
// Products are rounded separately (__fmul_rn) so that f32 results match the CPU
// reference, which does not contract a·c − b·s into an FMA.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/rope.h"

namespace grpo::cuda {

namespace {

template <class T>
__global__ void rope_kernel(T* __restrict__ x, const int32_t* __restrict__ pos, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, int64_t T_, int64_t H, int64_t half, float sign) {
  const int64_t total = T_ * H * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t th = idx / half;  // t·H + h
    const int64_t t = th / H;
    const int64_t p = pos[t];
    const float c = cos_t[p * half + i];
    const float s = sign * sin_t[p * half + i];
    T* v = x + th * 2 * half;
    const float a = to_f32(v[i]), b = to_f32(v[i + half]);
    v[i] = from_f32<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    v[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
}

void rope_launch(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, float sign) {
  GRPO_CHECK_MSG(x.ndim == 3, "rope: x must be (T,H,D)");
  const int64_t T_ = x.shape[0], H = x.shape[1], D = x.shape[2];
  GRPO_CHECK_MSG(D % 2 == 0, "rope: D must be even");
  const int64_t half = D / 2;
  GRPO_CHECK_MSG(positions.numel() == T_ && positions.dtype == DType::i32, "rope: positions must be (T) i32");
  GRPO_CHECK_MSG(cos.ndim == 2 && cos.shape[1] == half && cos.dtype == DType::f32, "rope: cos must be (P, D/2) f32");
  GRPO_CHECK_MSG(sin.ndim == 2 && sin.shape[1] == half && sin.dtype == DType::f32, "rope: sin must be (P, D/2) f32");
  const int64_t total = T_ * H * half;
  if (total == 0) return;
  const int threads = 256;
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    rope_kernel<T><<<flat_grid(total, threads), threads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), positions.ptr<int32_t>(), cos.ptr<float>(), sin.ptr<float>(), T_, H, half, sign);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_launch(ctx, x, positions, cos, sin, 1.f);
}

void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_launch(ctx, dx, positions, cos, sin, -1.f);
}

}  // namespace grpo::cuda
