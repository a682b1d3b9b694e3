// CUDA AdamW (fused: f32 master, m, v updated and the compute copy written in one
// pass) and a deterministic Σ grad².
// AdamW follows cpu/optim.cpp operation by operation, with every product and sum
// rounded separately (__fmul_rn/__fadd_rn: no FMA contraction), so that in f32 the
// master weights match the CPU reference bit for bit (sqrtf and '/' are IEEE here).
// sum_squares: fixed 64K-element chunks, each summed in f64 by one block with a fixed
// tree; a second kernel adds the chunk sums in order. The result depends only on the
// data, not on the device or launch configuration.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/optim.h"

#include <cmath>

namespace grpo::cuda {

namespace {

constexpr int64_t kChunk = 1 << 16;
constexpr int kSumThreads = 256;

struct AdamConsts {
  float beta1, beta2, one_m_b1, one_m_b2, eps, step_size, bc2_sqrt, decay, grad_scale;
};

template <class TP>
__global__ void adamw_kernel(float* __restrict__ P, TP* __restrict__ param, const float* __restrict__ G,
                             float* __restrict__ M, float* __restrict__ V, int64_t n, AdamConsts k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(G[i], k.grad_scale);
    float p = __fmul_rn(P[i], k.decay);
    const float m = __fadd_rn(__fmul_rn(k.beta1, M[i]), __fmul_rn(k.one_m_b1, g));
    const float v = __fadd_rn(__fmul_rn(k.beta2, V[i]), __fmul_rn(__fmul_rn(k.one_m_b2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(sqrtf(v), k.bc2_sqrt), k.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(k.step_size, m), denom));
    P[i] = p;
    M[i] = m;
    V[i] = v;
    if (param) param[i] = from_f32<TP>(p);
  }
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Fixed-order block sum in f64 (blockDim.x == kSumThreads); result valid in thread 0.
__device__ double block_sum_d(double v) {
  __shared__ double sh[kSumThreads / 32];
  v = warp_sum_d(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kSumThreads / 32; ++w) r += sh[w];
  return r;
}

template <class T>
__global__ void __launch_bounds__(kSumThreads) sumsq_chunk_kernel(double* __restrict__ part, const T* __restrict__ g,
                                                                  int64_t n) {
  const int64_t begin = blockIdx.x * kChunk;
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kSumThreads) {
    const double x = double(to_f32(g[i]));
    s += x * x;
  }
  s = block_sum_d(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kSumThreads) sumsq_final_kernel(double* __restrict__ out,
                                                                  const double* __restrict__ part, int64_t nb) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < nb; i += kSumThreads) s += part[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void adamw_step(Context& ctx, Tensor& master, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p) {
  const int64_t n = master.numel();
  GRPO_CHECK_MSG(master.dtype == DType::f32 && grad.dtype == DType::f32 && m.dtype == DType::f32 &&
                     v.dtype == DType::f32,
                 "adamw_step: master, grad, m, v must be f32");
  GRPO_CHECK_MSG(grad.numel() == n && m.numel() == n && v.numel() == n && param.numel() == n,
                 "adamw_step: all buffers must have the same number of elements");
  if (n == 0) return;
  // Host constants computed exactly as the CPU reference does.
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  AdamConsts k;
  k.beta1 = p.beta1;
  k.beta2 = p.beta2;
  k.one_m_b1 = 1.f - p.beta1;
  k.one_m_b2 = 1.f - p.beta2;
  k.eps = p.eps;
  k.step_size = float(double(p.lr) / bc1);
  k.bc2_sqrt = float(std::sqrt(bc2));
  k.decay = 1.f - p.lr * p.weight_decay;
  k.grad_scale = p.grad_scale;
  const bool write_param = param.data != master.data;
  const int threads = 256;
  const unsigned grid = flat_grid(n, threads);
  cudaStream_t st = stream_of(ctx);
  if (!write_param || param.dtype == DType::f32) {
    adamw_kernel<float><<<grid, threads, 0, st>>>(master.ptr<float>(), write_param ? param.ptr<float>() : nullptr,
                                                  grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), n, k);
  } else if (param.dtype == DType::bf16) {
    adamw_kernel<__nv_bfloat16><<<grid, threads, 0, st>>>(master.ptr<float>(), param.ptr<__nv_bfloat16>(),
                                                          grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), n, k);
  } else if (param.dtype == DType::f16) {
    adamw_kernel<__half><<<grid, threads, 0, st>>>(master.ptr<float>(), param.ptr<__half>(), grad.ptr<float>(),
                                                   m.ptr<float>(), v.ptr<float>(), n, k);
  } else {
    GRPO_CHECK_MSG(false, "adamw_step: param must be f32, bf16 or f16");
  }
  CUDA_CHECK_LAUNCH();
}

double sum_squares(Context& ctx, const Tensor& grad) {
  const int64_t n = grad.numel();
  if (n == 0) return 0.0;
  const int64_t nb = ceil_div(n, kChunk);
  GRPO_CHECK_MSG(nb <= 0x7fffffff, "sum_squares: tensor too large");
  ScratchAlloc sa(ctx);
  double* part = sa.alloc<double>(nb + 1, "sum_squares partials");
  cudaStream_t st = stream_of(ctx);
  GRPO_DISPATCH_FLOAT(grad.dtype, T, {
    sumsq_chunk_kernel<T><<<unsigned(nb), kSumThreads, 0, st>>>(part, grad.ptr<T>(), n);
  });
  CUDA_CHECK_LAUNCH();
  sumsq_final_kernel<<<1, kSumThreads, 0, st>>>(part + nb, part, nb);
  CUDA_CHECK_LAUNCH();
  double out = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&out, part + nb, sizeof(double), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

}  // namespace grpo::cuda
