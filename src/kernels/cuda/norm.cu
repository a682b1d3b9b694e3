// CUDA RMSNorm (f32 math, bf16 or f32 storage; x and w share a dtype).
// Formulas as in cpu/norm.cpp: y = w·(x·r), r = 1/sqrt(mean(x²)+eps);
//   dx = r·g·w − x·r³·dot/C with dot = Σ_c g·w·x;  dw += Σ_rows g·x·r.
//
// Kernel layouts. V = elements per 16-byte vector (8 bf16, 4 f32); "vector rows" means
// C % V == 0 and every pointer 16-byte aligned (then every row is aligned too).
//   forward, warp path (vector rows, C/V <= 32·kMaxNV): one warp per row, kFwdWarps rows
//     per block. Lane l owns the vectors l, l+32, ..., l+32·(NV−1) of its row (coalesced
//     16-byte loads) and keeps them in registers (raw, NV·16 bytes) between Σx² and the
//     write; Σx² is lane-local in vector order, then a butterfly warp_sum.
//   forward, block path (everything else): one block per row, threads stride over units of
//     E elements (E = V for vector rows with large C, else E = 1); fixed-order block_sum;
//     the write pass re-reads x (L1/L2).
//   backward, warp path: G = min(ceil(N/kBwdWarps), kMaxBwdBlocks) blocks of kBwdWarps
//     warps; warp q of block b takes rows b·kBwdWarps + q + k·G·kBwdWarps, k = 0, 1, ...
//     Each row is held in registers as in the forward; its dw contribution goes to a
//     per-lane register accumulator (rows in increasing order). At the end the warps add
//     their accumulators into one shared-memory row in warp order 0, 1, ..., which the block
//     writes as its partial.
//   backward, block path: G = min(N, kMaxBwdBlocks) blocks walk rows b, b+G, ...; dw
//     partial per block in shared memory (C floats), each column owned by one thread.
//   sum_partials: dw[c] += Σ_b part[b][c]: 8 slices of the G partials (b ≡ s mod 8), each
//     summed in block order, then the 8 slice sums added in slice order.
// Everything is deterministic (fixed orders, no atomics). The path (and NV, E, block size)
// depends only on C, the dtype and pointer alignment, never on N, and each row is reduced
// by one warp or one block alone, so a row's y, rstd and dx do not depend on the other rows
// in the launch. out may alias x: every element is read, then written, by the same thread.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/norm.h"

#include <algorithm>

namespace grpo::cuda {

namespace {

constexpr int kFwdWarps = 4;         // rows (warps) per forward block, warp path
constexpr int kBwdWarps = 8;         // warps per backward block, warp path
constexpr int kMaxBwdBlocks = 256;   // backward blocks, i.e. dw partials, at most
constexpr int kMaxNV = 8;            // 16-byte vectors per lane held in registers

// ---------------------------------------------------------------- forward

template <class T, int NV>
__global__ void __launch_bounds__(kFwdWarps * 32)
rmsnorm_fwd_warp_kernel(T* out, float* __restrict__ rstd, const T* x, const T* __restrict__ w, int64_t N, int nvec,
                        float eps) {
  pdl_trigger();  // launched with launch_pdl (cuda_check.cuh)
  pdl_wait();
  constexpr int V = Vec16<T>::n;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kFwdWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // the whole warp: no block-wide synchronisation below
  const int64_t C = int64_t(nvec) * V;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * C);
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  // w is fetched together with x (one memory round trip fewer) unless registers are tight
  constexpr bool kEarlyW = NV <= 4;
  uint4 xv[NV], wr[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    xv[k] = j < nvec ? xr[j] : make_uint4(0u, 0u, 0u, 0u);
    if constexpr (kEarlyW) wr[k] = j < nvec ? __ldg(wv + j) : make_uint4(0u, 0u, 0u, 0u);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    if (lane + 32 * k < nvec) {
      float f[V];
      unpack16<T>(xv[k], f);
#pragma unroll
      for (int e = 0; e < V; ++e) ss += f[e] * f[e];
    }
  }
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (lane == 0 && rstd) rstd[row] = r;
  T* yr = out + row * C;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      float f[V], g[V];
      unpack16<T>(xv[k], f);
      unpack16<T>(kEarlyW ? wr[k] : __ldg(wv + j), g);
#pragma unroll
      for (int e = 0; e < V; ++e) f[e] = g[e] * (f[e] * r);
      store_vec(yr + int64_t(j) * V, f);
    }
  }
}

template <class T, int E>
__global__ void rmsnorm_fwd_block_kernel(T* out, float* __restrict__ rstd, const T* x, const T* __restrict__ w,
                                         int64_t C, float eps) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* yr = out + row * C;
  const int64_t nu = C / E;
  float ss = 0.f;
  for (int64_t u = threadIdx.x; u < nu; u += blockDim.x) {
    float f[E];
    load_elems<T, E>(xr + u * E, f);
#pragma unroll
    for (int e = 0; e < E; ++e) ss += f[e] * f[e];
  }
  ss = block_sum(ss, sh);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
  for (int64_t u = threadIdx.x; u < nu; u += blockDim.x) {
    float f[E], g[E];
    load_elems<T, E>(xr + u * E, f);
    load_elems<T, E>(w + u * E, g);
#pragma unroll
    for (int e = 0; e < E; ++e) f[e] = g[e] * (f[e] * r);
    store_elems<T, E>(yr + u * E, f);
  }
}

// ---------------------------------------------------------------- backward

template <class T, int NV>
__global__ void __launch_bounds__(kBwdWarps * 32)
rmsnorm_bwd_warp_kernel(T* __restrict__ dx, float* __restrict__ dw_part, const T* __restrict__ dout,
                        const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd, int64_t N,
                        int nvec) {
  constexpr int V = Vec16<T>::n;
  extern __shared__ float dwrow[];  // C floats when dw_part != nullptr
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t C = int64_t(nvec) * V;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  float acc[NV][V];
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[k][e] = 0.f;
  // w (raw) stays in registers across rows when that is cheap, else it is re-read per row (L1)
  constexpr bool kHoldW = NV <= 4;
  uint4 wr[NV];
  if constexpr (kHoldW) {
#pragma unroll
    for (int k = 0; k < NV; ++k) wr[k] = lane + 32 * k < nvec ? __ldg(wv + lane + 32 * k) : make_uint4(0u, 0u, 0u, 0u);
  }

  const int64_t step = int64_t(gridDim.x) * kBwdWarps;
  for (int64_t row = int64_t(blockIdx.x) * kBwdWarps + warp; row < N; row += step) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * C);
    const uint4* gr = reinterpret_cast<const uint4*>(dout + row * C);
    uint4 xv[NV], gv[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      xv[k] = j < nvec ? xr[j] : make_uint4(0u, 0u, 0u, 0u);
      gv[k] = j < nvec ? gr[j] : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (!kHoldW) wr[k] = j < nvec ? __ldg(wv + j) : make_uint4(0u, 0u, 0u, 0u);
    }
    const float r = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      if (j < nvec) {
        float xf[V], gf[V], wf[V];
        unpack16<T>(xv[k], xf);
        unpack16<T>(gv[k], gf);
        unpack16<T>(wr[k], wf);
#pragma unroll
        for (int e = 0; e < V; ++e) dot += gf[e] * wf[e] * xf[e];
      }
    }
    dot = warp_sum(dot);
    const float kr = r * r * r * dot / float(C);
    T* dr = dx + row * C;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      if (j < nvec) {
        float xf[V], gf[V], wf[V], o[V];
        unpack16<T>(xv[k], xf);
        unpack16<T>(gv[k], gf);
        unpack16<T>(wr[k], wf);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (dw_part) acc[k][e] += gf[e] * xf[e] * r;
          o[e] = r * gf[e] * wf[e] - kr * xf[e];
        }
        store_vec(dr + int64_t(j) * V, o);
      }
    }
  }
  if (!dw_part) return;  // uniform over the block
  // Warp order 0, 1, ...: each column's shared slot is owned by one lane of each warp.
  for (int q = 0; q < kBwdWarps; ++q) {
    if (warp == q) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int j = lane + 32 * k;
        if (j < nvec) {
#pragma unroll
          for (int e = 0; e < V; ++e) {
            float* s = dwrow + j * V + e;
            *s = q == 0 ? acc[k][e] : *s + acc[k][e];
          }
        }
      }
    }
    __syncthreads();
  }
  float* dst = dw_part + int64_t(blockIdx.x) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = dwrow[c];
}

template <class T, int E>
__global__ void rmsnorm_bwd_block_kernel(T* __restrict__ dx, float* __restrict__ dw_part, const T* __restrict__ dout,
                                         const T* __restrict__ x, const T* __restrict__ w,
                                         const float* __restrict__ rstd, int64_t N, int64_t C) {
  __shared__ float sh[32];
  extern __shared__ float dwp[];  // C floats when dw_part != nullptr
  const int64_t nu = C / E;
  if (dw_part)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dwp[c] = 0.f;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    const T* gr = dout + row * C;
    float dot = 0.f;
    for (int64_t u = threadIdx.x; u < nu; u += blockDim.x) {
      float xf[E], gf[E], wf[E];
      load_elems<T, E>(xr + u * E, xf);
      load_elems<T, E>(gr + u * E, gf);
      load_elems<T, E>(w + u * E, wf);
#pragma unroll
      for (int e = 0; e < E; ++e) dot += gf[e] * wf[e] * xf[e];
    }
    dot = block_sum(dot, sh);
    const float r = rstd[row];
    const float kr = r * r * r * dot / float(C);
    T* dr = dx + row * C;
    for (int64_t u = threadIdx.x; u < nu; u += blockDim.x) {
      float xf[E], gf[E], wf[E], o[E];
      load_elems<T, E>(xr + u * E, xf);
      load_elems<T, E>(gr + u * E, gf);
      load_elems<T, E>(w + u * E, wf);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if (dw_part) dwp[u * E + e] += gf[e] * xf[e] * r;
        o[e] = r * gf[e] * wf[e] - kr * xf[e];
      }
      store_elems<T, E>(dr + u * E, o);
    }
  }
  if (dw_part) {
    __syncthreads();  // the write pass below reads columns owned by other threads when E > 1
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_part[blockIdx.x * C + c] = dwp[c];
  }
}

// dw (C) += Σ_b part (G, C). Block: 32 columns × 8 slices; slice s sums b = s, s+8, ...
// in order, then thread (c, 0) adds the slice sums in slice order.
__global__ void __launch_bounds__(256) sum_partials_kernel(float* __restrict__ dw, const float* __restrict__ part,
                                                           int G, int64_t C) {
  __shared__ float sh[8][33];
  const int cx = threadIdx.x & 31, s = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  float v = 0.f;
  if (c < C) {
#pragma unroll 8
    for (int b = s; b < G; b += 8) v += part[int64_t(b) * C + c];
  }
  sh[s][cx] = v;
  __syncthreads();
  if (s == 0 && c < C) {
    float t = sh[0][cx];
#pragma unroll
    for (int q = 1; q < 8; ++q) t += sh[q][cx];
    dw[c] += t;
  }
}

int row_threads(int64_t units) { return units >= 4096 ? 512 : units >= 1024 ? 256 : 128; }

// Registers per lane needed for nvec vectors: 1, 2, 4 or 8 (0 when more than kMaxNV).
int vectors_per_lane(int64_t nvec) {
  const int64_t k = ceil_div(nvec, 32);
  return k <= 1 ? 1 : k <= 2 ? 2 : k <= 4 ? 4 : k <= kMaxNV ? kMaxNV : 0;
}

template <class T, int NV>
void fwd_warp_launch(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x, const Tensor& w, int64_t N, int nvec,
                     float eps) {
  launch_pdl(ctx, rmsnorm_fwd_warp_kernel<T, NV>, dim3(unsigned(ceil_div(N, kFwdWarps))), dim3(kFwdWarps * 32), 0,
             out.ptr<T>(), rstd ? rstd->ptr<float>() : nullptr, x.ptr<T>(), w.ptr<T>(), N, nvec, eps);
}

template <class T, int NV>
void bwd_warp_launch(Context& ctx, Tensor& dx, float* part, const Tensor& dout, const Tensor& x, const Tensor& w,
                     const Tensor& rstd, int64_t N, int nvec, int G, size_t smem) {
  rmsnorm_bwd_warp_kernel<T, NV><<<unsigned(G), kBwdWarps * 32, smem, stream_of(ctx)>>>(
      dx.ptr<T>(), part, dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, nvec);
}

}  // namespace

void rmsnorm_forward(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x, const Tensor& w, float eps) {
  GRPO_CHECK_MSG(x.ndim == 2, "rmsnorm_forward: x must be (N,C)");
  const int64_t N = x.shape[0], C = x.shape[1];
  GRPO_CHECK_MSG(w.numel() == C && out.numel() == N * C, "rmsnorm_forward: w must be (C), out (N,C)");
  GRPO_CHECK_MSG(out.dtype == x.dtype && w.dtype == x.dtype, "rmsnorm_forward: out, x and w must share a dtype");
  if (rstd) GRPO_CHECK_MSG(rstd->numel() == N && rstd->dtype == DType::f32, "rmsnorm_forward: rstd must be (N) f32");
  if (N == 0 || C == 0) return;
  GRPO_CHECK_MSG(N <= 0x7fffffff, "rmsnorm_forward: too many rows");
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    constexpr int V = Vec16<T>::n;
    const bool vec = C % V == 0 && aligned16(out.data) && aligned16(x.data) && aligned16(w.data);
    const int nv = vec ? vectors_per_lane(C / V) : 0;
    const int nvec = int(vec && nv ? C / V : 0);
    switch (nv) {
      case 1: fwd_warp_launch<T, 1>(ctx, out, rstd, x, w, N, nvec, eps); break;
      case 2: fwd_warp_launch<T, 2>(ctx, out, rstd, x, w, N, nvec, eps); break;
      case 4: fwd_warp_launch<T, 4>(ctx, out, rstd, x, w, N, nvec, eps); break;
      case kMaxNV: fwd_warp_launch<T, kMaxNV>(ctx, out, rstd, x, w, N, nvec, eps); break;
      default:
        if (vec)
          rmsnorm_fwd_block_kernel<T, V><<<unsigned(N), row_threads(C / V), 0, stream_of(ctx)>>>(
              out.ptr<T>(), rstd ? rstd->ptr<float>() : nullptr, x.ptr<T>(), w.ptr<T>(), C, eps);
        else
          rmsnorm_fwd_block_kernel<T, 1><<<unsigned(N), row_threads(C), 0, stream_of(ctx)>>>(
              out.ptr<T>(), rstd ? rstd->ptr<float>() : nullptr, x.ptr<T>(), w.ptr<T>(), C, eps);
    }
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
  if (N == 0 || C == 0) return;
  if (dw) {
    const size_t smem = size_t(C) * sizeof(float);
    GRPO_CHECK_MSG(smem <= 227u * 1024u, "rmsnorm_backward: C too large for the shared-memory dw partial");
  }
  int G = 0;
  float* part = nullptr;
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    constexpr int V = Vec16<T>::n;
    const bool vec = C % V == 0 && aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) &&
                     aligned16(w.data);
    const int nv = vec ? vectors_per_lane(C / V) : 0;
    // warp path: kBwdWarps rows in flight per block; block path: one row per block
    G = int(nv ? std::min<int64_t>(ceil_div(N, kBwdWarps), kMaxBwdBlocks) : std::min<int64_t>(N, kMaxBwdBlocks));
    size_t smem = 0;
    if (dw) {
      ScratchAlloc sa(ctx);
      part = sa.alloc<float>(int64_t(G) * C, "rmsnorm_backward dw partials");
      smem = size_t(C) * sizeof(float);
    }
    const int nvec = int(nv ? C / V : 0);
    switch (nv) {
      case 1: bwd_warp_launch<T, 1>(ctx, dx, part, dout, x, w, rstd, N, nvec, G, smem); break;
      case 2: bwd_warp_launch<T, 2>(ctx, dx, part, dout, x, w, rstd, N, nvec, G, smem); break;
      case 4: bwd_warp_launch<T, 4>(ctx, dx, part, dout, x, w, rstd, N, nvec, G, smem); break;
      case kMaxNV: bwd_warp_launch<T, kMaxNV>(ctx, dx, part, dout, x, w, rstd, N, nvec, G, smem); break;
      default:
        if (vec) {
          if (smem > 48u * 1024u)
            CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_block_kernel<T, V>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          rmsnorm_bwd_block_kernel<T, V><<<unsigned(G), row_threads(C / V), smem, stream_of(ctx)>>>(
              dx.ptr<T>(), part, dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, C);
        } else {
          if (smem > 48u * 1024u)
            CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_block_kernel<T, 1>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          rmsnorm_bwd_block_kernel<T, 1><<<unsigned(G), row_threads(C), smem, stream_of(ctx)>>>(
              dx.ptr<T>(), part, dout.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), N, C);
        }
    }
  });
  CUDA_CHECK_LAUNCH();
  if (dw) {
    sum_partials_kernel<<<unsigned(ceil_div(C, 32)), 256, 0, stream_of(ctx)>>>(dw->ptr<float>(), part, G, C);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace grpo::cuda
