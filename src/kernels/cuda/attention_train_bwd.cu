// CUDA causal GQA attention backward (packed sequences), deterministic, no atomics.
// Definitions as in cpu/attention.cpp (scale s = 1/sqrt(D), Δ = dout·out):
//   p_ij = exp(s·q_i·k_j − lse_i), da_ij = p_ij·(dout_i·v_j − Δ_i),
//   dq_i = s·Σ_j da_ij·k_j,  dk_j = s·Σ_{i,h} da_ij·q_i,  dv_j = Σ_{i,h} p_ij·dout_i.
// Δ (Hq,T) goes to the scratch (one warp per (token, head)); then, for D in {32, 64, 128},
// the shared-memory tiled kernels of attention_train_bwd_tiled.cu run. For other head dims the
// simple kernels below do, each output element owned by one warp:
//   dq:     one warp per (token, head); lanes take 32 keys at a time for the scores,
//           then lanes take head dims for the accumulation (keys in increasing order);
//   dk/dv:  one warp per (key token, kv head); loops over the group's query heads and
//           the later query tokens of the sequence (lanes over queries, then over dims).
// Rows of K/V (dq) and Q/dout (dk/dv) are read with 16-byte vectors; head dim D must
// be a multiple of 8 and at most 256. With a sliding window W only the simple kernels
// run (they bound the key range of a query, and the query range of a key, by W).
#include "kernels/attention.h"
#include "kernels/cuda/attention_train_bwd.cuh"
#include "kernels/cuda/attention_tc.cuh"

#include <cmath>

namespace grpo::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxD = 256;
constexpr int kDPL = kMaxD / 32;  // head dims per lane, at most

// Dot of a shared-memory f32 row with a global row of D elements (16-byte vectors).
template <class T>
__device__ __forceinline__ float dot_row(const float* __restrict__ sh, const T* __restrict__ g, int D) {
  constexpr int V = Vec16<T>::n;
  float s = 0.f;
  for (int d = 0; d < D; d += V) {
    float f[V];
    load_vec(g + d, f);
#pragma unroll
    for (int i = 0; i < V; ++i) s += sh[d + i] * f[i];
  }
  return s;
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) delta_kernel(BwdArgs a) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // t·Hq + h
  if (r >= a.T * a.Hq) return;
  const int lane = threadIdx.x & 31;
  const T* o = static_cast<const T*>(a.out) + r * a.D;
  const T* g = static_cast<const T*>(a.dout) + r * a.D;
  float s = 0.f;
  for (int d = lane; d < a.D; d += 32) s += to_f32(o[d]) * to_f32(g[d]);
  s = warp_sum(s);
  if (lane == 0) a.delta[(r % a.Hq) * a.T + r / a.Hq] = s;
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) dq_kernel(BwdArgs a) {
  __shared__ float sq[kWarps][kMaxD], sdo[kWarps][kMaxD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + warp;
  if (r >= a.T * a.Hq) return;  // warp-uniform; no block barriers below
  const int64_t t = r / a.Hq;
  const int h = int(r % a.Hq), kh = h / a.G, D = a.D;
  const T* K = static_cast<const T*>(a.k);
  const T* Vv = static_cast<const T*>(a.v);
  for (int d = lane; d < D; d += 32) {
    sq[warp][d] = to_f32(static_cast<const T*>(a.q)[r * D + d]);
    sdo[warp][d] = to_f32(static_cast<const T*>(a.dout)[r * D + d]);
  }
  __syncwarp();
  const int64_t seq_start = a.cu[find_seq(a.cu, a.n_seqs, t)];
  const int64_t start = a.window > 0 && t - a.window + 1 > seq_start ? t - a.window + 1 : seq_start;
  const float l = a.lse[int64_t(h) * a.T + t], delta = a.delta[int64_t(h) * a.T + t];
  float acc[kDPL];
#pragma unroll
  for (int i = 0; i < kDPL; ++i) acc[i] = 0.f;
  for (int64_t j0 = start; j0 <= t; j0 += 32) {
    const int64_t j = j0 + lane;
    float da = 0.f;
    if (j <= t) {
      const int64_t row = (j * a.Hkv + kh) * D;
      const float p = expf(a.scale * dot_row(sq[warp], K + row, D) - l);
      da = p * (dot_row(sdo[warp], Vv + row, D) - delta);
    }
    const int n = int(t - j0 + 1 < 32 ? t - j0 + 1 : 32);
    for (int jj = 0; jj < n; ++jj) {
      const float dj = __shfl_sync(0xffffffffu, da, jj);
      const T* kr = K + ((j0 + jj) * a.Hkv + kh) * D;
#pragma unroll
      for (int i = 0; i < kDPL; ++i)
        if (lane + 32 * i < D) acc[i] += dj * to_f32(kr[lane + 32 * i]);
    }
  }
  T* dq = static_cast<T*>(a.dq) + r * D;
#pragma unroll
  for (int i = 0; i < kDPL; ++i)
    if (lane + 32 * i < D) dq[lane + 32 * i] = from_f32<T>(a.scale * acc[i]);
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) dkv_kernel(BwdArgs a) {
  __shared__ float sk[kWarps][kMaxD], sv[kWarps][kMaxD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kWarps + warp;  // j·Hkv + kh
  if (r >= a.T * a.Hkv) return;
  const int64_t j = r / a.Hkv;
  const int kh = int(r % a.Hkv), D = a.D;
  const T* Q = static_cast<const T*>(a.q);
  const T* DO = static_cast<const T*>(a.dout);
  for (int d = lane; d < D; d += 32) {
    sk[warp][d] = to_f32(static_cast<const T*>(a.k)[r * D + d]);
    sv[warp][d] = to_f32(static_cast<const T*>(a.v)[r * D + d]);
  }
  __syncwarp();
  const int s = find_seq(a.cu, a.n_seqs, j);
  const int64_t seq_end = a.cu[s + 1];
  // queries j..end-1 see key j (with a window W, only those with i - j < W)
  const int64_t end = a.window > 0 && j + a.window < seq_end ? j + a.window : seq_end;
  float dk[kDPL], dv[kDPL];
#pragma unroll
  for (int i = 0; i < kDPL; ++i) dk[i] = dv[i] = 0.f;
  for (int h = kh * a.G; h < (kh + 1) * a.G; ++h) {
    for (int64_t i0 = j; i0 < end; i0 += 32) {
      const int64_t i = i0 + lane;
      float p = 0.f, da = 0.f;
      if (i < end) {
        const int64_t row = (i * a.Hq + h) * D;
        p = expf(a.scale * dot_row(sk[warp], Q + row, D) - a.lse[int64_t(h) * a.T + i]);
        da = p * (dot_row(sv[warp], DO + row, D) - a.delta[int64_t(h) * a.T + i]);
      }
      const int n = int(end - i0 < 32 ? end - i0 : 32);
      for (int ii = 0; ii < n; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii);
        const float di = __shfl_sync(0xffffffffu, da, ii);
        const int64_t row = ((i0 + ii) * a.Hq + h) * D;
#pragma unroll
        for (int c = 0; c < kDPL; ++c) {
          if (lane + 32 * c < D) {
            dv[c] += pi * to_f32(DO[row + lane + 32 * c]);
            dk[c] += di * to_f32(Q[row + lane + 32 * c]);
          }
        }
      }
    }
  }
  T* dkp = static_cast<T*>(a.dk) + r * D;
  T* dvp = static_cast<T*>(a.dv) + r * D;
#pragma unroll
  for (int c = 0; c < kDPL; ++c) {
    if (lane + 32 * c < D) {
      dkp[lane + 32 * c] = from_f32<T>(a.scale * dk[c]);
      dvp[lane + 32 * c] = from_f32<T>(dv[c]);
    }
  }
}

}  // namespace

void attention_backward(Context& ctx, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttnVarlen& meta) {
  GRPO_CHECK_MSG(q.ndim == 3 && k.ndim == 3, "attention_backward: q (T,Hq,D), k (T,Hkv,D)");
  const int64_t T_ = q.shape[0];
  const int Hq = int(q.shape[1]), Hkv = int(k.shape[1]), D = int(q.shape[2]);
  const DType dt = q.dtype;
  GRPO_CHECK_MSG(k.dtype == dt && v.dtype == dt && out.dtype == dt && dout.dtype == dt && dq.dtype == dt &&
                     dk.dtype == dt && dv.dtype == dt,
                 "attention_backward: all activations must share a dtype");
  GRPO_CHECK_MSG(dq.numel() == q.numel() && out.numel() == q.numel() && dout.numel() == q.numel() &&
                     dk.numel() == k.numel() && dv.numel() == k.numel() && v.numel() == k.numel() &&
                     k.shape[0] == T_ && k.shape[2] == D,
                 "attention_backward: shape mismatch");
  GRPO_CHECK_MSG(lse.dtype == DType::f32 && lse.numel() == int64_t(Hq) * T_, "attention_backward: lse (Hq,T) f32");
  GRPO_CHECK_MSG(Hkv > 0 && Hq % Hkv == 0, "attention_backward: Hq must be a multiple of Hkv");
  GRPO_CHECK_MSG(D % 8 == 0 && D <= kMaxD, "attention_backward (cuda): D must be a multiple of 8, at most 256");
  GRPO_CHECK_MSG(aligned16(q.data) && aligned16(k.data) && aligned16(v.data) && aligned16(dout.data),
                 "attention_backward: 16-byte alignment");
  GRPO_CHECK_MSG(meta.cu_seqlens_dev.defined() && meta.cu_seqlens.size() >= 2 && meta.cu_seqlens.back() == T_,
                 "attention_backward: cu_seqlens must span the T tokens");
  GRPO_CHECK_MSG(meta.window >= 0, "attention_backward: window must be >= 0");
  if (T_ == 0) return;
  ScratchAlloc sa(ctx);
  BwdArgs a{};
  a.q = q.data; a.k = k.data; a.v = v.data; a.out = out.data; a.dout = dout.data;
  a.dq = dq.data; a.dk = dk.data; a.dv = dv.data;
  a.lse = lse.ptr<float>();
  a.delta = sa.alloc<float>(int64_t(Hq) * T_, "attention_backward delta");
  a.cu = meta.cu_seqlens_dev.ptr<int32_t>();
  a.n_seqs = int(meta.cu_seqlens.size() - 1);
  a.T = T_;
  a.Hq = Hq; a.Hkv = Hkv; a.G = Hq / Hkv; a.D = D;
  a.window = meta.window;
  a.scale = 1.f / std::sqrt(float(D));
  cudaStream_t st = stream_of(ctx);
  const unsigned gq = unsigned(ceil_div(T_ * Hq, kWarps)), gk = unsigned(ceil_div(T_ * Hkv, kWarps));
  GRPO_DISPATCH_FLOAT(dt, T, {
    delta_kernel<T><<<gq, kWarps * 32, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
  if (a.window == 0) {  // bf16 with head dim 64/128: the tensor-core kernels (attention_train_bwd_tc.cu)
    TcArgs t{};
    t.q = a.q; t.k = a.k; t.v = a.v; t.dout = a.dout; t.dq = a.dq; t.dk = a.dk; t.dv = a.dv;
    t.lse = const_cast<float*>(a.lse);
    t.delta = a.delta;
    t.cu = a.cu; t.n_seqs = a.n_seqs; t.T = a.T;
    if (attention_tc_supported(dt, a.D)) t.tok_start = sa.alloc<int32_t>(a.T, "attention_backward token starts");
    t.Hq = a.Hq; t.Hkv = a.Hkv; t.G = a.G; t.D = a.D; t.scale = a.scale;
    if (attention_backward_tc(ctx, t, dt)) return;
  }
  if (a.window == 0 && attention_backward_tiled(ctx, a, dt)) return;
  GRPO_DISPATCH_FLOAT(dt, T, {
    dq_kernel<T><<<gq, kWarps * 32, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
    dkv_kernel<T><<<gk, kWarps * 32, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace grpo::cuda
