// CUDA RMSNorm (f32 math, bf16 or f32 storage; x and w share a dtype).
//   forward:  one block per row; Σx² by a fixed-order block reduction; out may alias x
//             (each element is read and then written by the same thread).
//   backward: G = min(N, 256) blocks walk rows b, b+G, ...; dw partials per block live in
//             shared memory (C floats) and go to the scratch, then one kernel adds the G
//             partials per column in block order: deterministic, no atomics.
// Formulas as in cpu/norm.cpp: y = w·(x·r), r = 1/sqrt(mean(x²)+eps);
//   dx = r·g·w − x·r³·dot/C with dot = Σ_c g·w·x;  dw += Σ_rows g·x·r.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/norm.h"

namespace grpo::cuda {

namespace {

constexpr int kMaxGroups = 256;

template <class T>
__global__ void rmsnorm_fwd_kernel(T* out, float* __restrict__ rstd, const T* x, const T* __restrict__ w, int64_t C,
                                   float eps) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* yr = out + row * C;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss, sh);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = from_f32<T>(to_f32(w[c]) * (to_f32(xr[c]) * r));
}

template <class T>
__global__ void rmsnorm_bwd_kernel(T* dx, float* __restrict__ dw_part, const T* dout, const T* __restrict__ x,
                                   const T* __restrict__ w, const float* __restrict__ rstd, int64_t N, int64_t C) {
  __shared__ float sh[32];
  extern __shared__ float dwp[];  // C floats when dw_part != nullptr
  if (dw_part)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dwp[c] = 0.f;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    const T* gr = dout + row * C;
    float dot = 0.f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += to_f32(gr[c]) * to_f32(w[c]) * to_f32(xr[c]);
    dot = block_sum(dot, sh);
    const float r = rstd[row];
    const float k = r * r * r * dot / float(C);
    T* dr = dx + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = to_f32(gr[c]), xv = to_f32(xr[c]);
      if (dw_part) dwp[c] += g * xv * r;
      dr[c] = from_f32<T>(r * g * to_f32(w[c]) - k * xv);
    }
  }
  if (dw_part)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_part[blockIdx.x * C + c] = dwp[c];
}

// dw (C) += Σ_b part (G, C) in block order.
__global__ void sum_partials_kernel(float* __restrict__ dw, const float* __restrict__ part, int G, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (int g = 0; g < G; ++g) s += part[int64_t(g) * C + c];
  dw[c] += s;
}

int row_threads(int64_t C) { return C >= 4096 ? 512 : C >= 1024 ? 256 : 128; }

}  // namespace

void rmsnorm_forward(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x, const Tensor& w, float eps) {
  GRPO_CHECK_MSG(x.ndim == 2, "rmsnorm_forward: x must be (N,C)");
  const int64_t N = x.shape[0], C = x.shape[1];
  GRPO_CHECK_MSG(w.numel() == C && out.numel() == N * C, "rmsnorm_forward: w must be (C), out (N,C)");
  GRPO_CHECK_MSG(out.dtype == x.dtype && w.dtype == x.dtype, "rmsnorm_forward: out, x and w must share a dtype");
  if (rstd) GRPO_CHECK_MSG(rstd->numel() == N && rstd->dtype == DType::f32, "rmsnorm_forward: rstd must be (N) f32");
  if (N == 0) return;
  GRPO_CHECK_MSG(N <= 0x7fffffff, "rmsnorm_forward: too many rows");
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    rmsnorm_fwd_kernel<T><<<unsigned(N), row_threads(C), 0, stream_of(ctx)>>>(
        out.ptr<T>(), rstd ? rstd->ptr<float>() : nullptr, x.ptr<T>(), w.ptr<T>(), C, eps);
  });
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Context& ctx, Tensor& dx, Tensor* dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  GRPO_CHECK_MSG(x.ndim == 2, "rmsnorm_backward: x must be (N,C)");
  const int64_t N = x.shape[0], C = x.shape[1];
  GRPO_CHECK_MSG(w.numel() == C && dx.numel() == N * C && dout.numel() == N * C, "rmsnorm_backward: shape mismatch");
  GRPO_CHECK_MSG(dx.dtype == x.dtype && dout.dtype == x.dtype && w.dtype == x.dtype,
                 "rmsnorm_backward: dx, dout, x and w must share a dtype");
  GRPO_CHECK_MSG(rstd.numel() == N && rstd.dtype == DType::f32, "rmsnorm_backward: rstd must be (N) f32");
  if (dw) GRPO_CHECK_MSG(dw->numel() == C && dw->dtype == DType::f32, "rmsnorm_backward: dw must be (C) f32");
  if (N == 0) return;
  const int G = int(N < kMaxGroups ? N : kMaxGroups);
  float* part = nullptr;
  size_t smem = 0;
  if (dw) {
    ScratchAlloc sa(ctx);
    part = sa.alloc<float>(int64_t(G) * C, "rmsnorm_backward dw partials");
    smem = size_t(C) * sizeof(float);
    GRPO_CHECK_MSG(smem <= 227u * 1024u, "rmsnorm_backward: C too large for the shared-memory dw partial");
  }
  const int threads = row_threads(C);
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    if (smem > 48u * 1024u)
      CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    rmsnorm_bwd_kernel<T><<<unsigned(G), threads, smem, stream_of(ctx)>>>(
        dx.ptr<T>(), part, dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, C);
  });
  CUDA_CHECK_LAUNCH();
  if (dw) {
    sum_partials_kernel<<<unsigned(ceil_div(C, 256)), 256, 0, stream_of(ctx)>>>(dw->ptr<float>(), part, G, C);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace grpo::cuda
