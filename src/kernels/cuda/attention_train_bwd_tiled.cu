// Shared-memory tiled attention backward (CUDA cores, f32 math), FlashAttention-2
// shaped but deterministic: every output element is owned by one thread and summed in
// a fixed order; no atomics. 128 threads, tiles of 32 queries × 32 keys, rows padded
// to D+1 floats (conflict-free column access). Δ must already be in a.delta.
//   dq kernel:  block = (32 query tokens, one query head); walks key tiles from the
//               earliest sequence start of its rows up to its last row.
//   dkv kernel: block = (32 key tokens, one kv head); walks the group's query heads and
//               query tiles from its first key to the last sequence end of its keys.
// Per tile pair both kernels compute S = Q·Kᵀ and dP = dO·Vᵀ (thread: one row, 8
// columns), p = exp(s·S − lse), dS = p·(dP − Δ) into shared memory, then accumulate
// dq += dS·K, or dv += pᵀ·dO and dk += dSᵀ·Q (thread: one row, D/4 columns).
// Tiles may straddle packed sequences: the mask is start(i) <= j <= i.
#include "kernels/cuda/attention_train_bwd.cuh"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTile = 32;
constexpr int kPS = kTile + 1;  // padded row of the 32×32 score tiles

template <int D>
constexpr size_t smem_bytes() {
  return size_t(4 * kTile * (D + 1) + 2 * kTile * kPS + 2 * kTile) * sizeof(float) + kTile * sizeof(int64_t);
}

// rows [r0, r0+32) of a (T, H, D) tensor at head h into a padded f32 tile (zeros past T)
template <class T, int D>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const T* __restrict__ src, int64_t r0, int64_t T_,
                                          int H, int h) {
  for (int e = threadIdx.x; e < kTile * D; e += kThreads) {
    const int r = e / D, d = e % D;
    const int64_t row = r0 + r;
    dst[r * (D + 1) + d] = row < T_ ? to_f32(src[(row * H + h) * D + d]) : 0.f;
  }
}

// S and dP for the thread's row `r` and columns c = cq + 4·cc (cc < 8) of the tile pair.
template <int D>
__device__ __forceinline__ void scores(const float* Qs, const float* dOs, const float* Ks, const float* Vs, int r,
                                       int cq, float (&s)[8], float (&dp)[8]) {
#pragma unroll
  for (int cc = 0; cc < 8; ++cc) s[cc] = dp[cc] = 0.f;
#pragma unroll 4
  for (int d = 0; d < D; ++d) {
    const float qd = Qs[r * (D + 1) + d], od = dOs[r * (D + 1) + d];
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const int c = cq + 4 * cc;
      s[cc] += qd * Ks[c * (D + 1) + d];
      dp[cc] += od * Vs[c * (D + 1) + d];
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) dq_tiled_kernel(BwdArgs a) {
  extern __shared__ float sm[];
  float* Qs = sm;
  float* dOs = Qs + kTile * (D + 1);
  float* Ks = dOs + kTile * (D + 1);
  float* Vs = Ks + kTile * (D + 1);
  float* dSs = Vs + kTile * (D + 1);
  float* lse_s = dSs + 2 * kTile * kPS;
  float* del_s = lse_s + kTile;
  int64_t* start_s = reinterpret_cast<int64_t*>(del_s + kTile);
  const int64_t i0 = int64_t(blockIdx.x) * kTile;
  const int h = blockIdx.y, kh = h / a.G, tid = threadIdx.x;
  load_tile<T, D>(Qs, static_cast<const T*>(a.q), i0, a.T, a.Hq, h);
  load_tile<T, D>(dOs, static_cast<const T*>(a.dout), i0, a.T, a.Hq, h);
  if (tid < kTile) {
    const int64_t i = i0 + tid;
    lse_s[tid] = i < a.T ? a.lse[int64_t(h) * a.T + i] : 0.f;
    del_s[tid] = i < a.T ? a.delta[int64_t(h) * a.T + i] : 0.f;
    start_s[tid] = i < a.T ? int64_t(a.cu[find_seq(a.cu, a.n_seqs, i)]) : INT64_MAX;
  }
  __syncthreads();
  int64_t kmin = INT64_MAX;
  for (int r = 0; r < kTile; ++r) kmin = start_s[r] < kmin ? start_s[r] : kmin;
  const int64_t kmax = (i0 + kTile - 1 < a.T - 1 ? i0 + kTile - 1 : a.T - 1);  // last key any row sees
  const int r = tid / 4, cq = tid % 4;
  const int64_t i = i0 + r;
  float acc[D / 4];
#pragma unroll
  for (int e = 0; e < D / 4; ++e) acc[e] = 0.f;
  for (int64_t j0 = kmin; j0 <= kmax; j0 += kTile) {
    load_tile<T, D>(Ks, static_cast<const T*>(a.k), j0, a.T, a.Hkv, kh);
    load_tile<T, D>(Vs, static_cast<const T*>(a.v), j0, a.T, a.Hkv, kh);
    __syncthreads();
    float s[8], dp[8];
    scores<D>(Qs, dOs, Ks, Vs, r, cq, s, dp);
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const int c = cq + 4 * cc;
      const int64_t j = j0 + c;
      const bool valid = i < a.T && j <= i && j >= start_s[r];
      const float p = valid ? expf(a.scale * s[cc] - lse_s[r]) : 0.f;
      dSs[r * kPS + c] = p * (dp[cc] - del_s[r]);
    }
    __syncthreads();
    for (int c = 0; c < kTile; ++c) {
      const float ds = dSs[r * kPS + c];
#pragma unroll
      for (int e = 0; e < D / 4; ++e) acc[e] += ds * Ks[c * (D + 1) + cq + 4 * e];
    }
    __syncthreads();
  }
  if (i < a.T) {
    T* dq = static_cast<T*>(a.dq) + (i * a.Hq + h) * D;
#pragma unroll
    for (int e = 0; e < D / 4; ++e) dq[cq + 4 * e] = from_f32<T>(a.scale * acc[e]);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads) dkv_tiled_kernel(BwdArgs a) {
  extern __shared__ float sm[];
  float* Ks = sm;
  float* Vs = Ks + kTile * (D + 1);
  float* Qs = Vs + kTile * (D + 1);
  float* dOs = Qs + kTile * (D + 1);
  float* Ps = dOs + kTile * (D + 1);
  float* dSs = Ps + kTile * kPS;
  float* lse_s = dSs + kTile * kPS;
  float* del_s = lse_s + kTile;
  int64_t* end_s = reinterpret_cast<int64_t*>(del_s + kTile);
  const int64_t j0 = int64_t(blockIdx.x) * kTile;
  const int kh = blockIdx.y, tid = threadIdx.x;
  load_tile<T, D>(Ks, static_cast<const T*>(a.k), j0, a.T, a.Hkv, kh);
  load_tile<T, D>(Vs, static_cast<const T*>(a.v), j0, a.T, a.Hkv, kh);
  if (tid < kTile) {
    const int64_t j = j0 + tid;
    end_s[tid] = j < a.T ? int64_t(a.cu[find_seq(a.cu, a.n_seqs, j) + 1]) : 0;
  }
  __syncthreads();
  int64_t qmax = 0;  // one past the last query that sees a key of this tile
  for (int c = 0; c < kTile; ++c) qmax = end_s[c] > qmax ? end_s[c] : qmax;
  // Score-phase roles: query row r, key columns cq + 4·cc. Accumulation roles: key row kr.
  const int r = tid / 4, cq = tid % 4, kr = tid / 4;
  float dk[D / 4], dv[D / 4];
#pragma unroll
  for (int e = 0; e < D / 4; ++e) dk[e] = dv[e] = 0.f;
  for (int h = kh * a.G; h < (kh + 1) * a.G; ++h) {
    for (int64_t q0 = j0; q0 < qmax; q0 += kTile) {
      load_tile<T, D>(Qs, static_cast<const T*>(a.q), q0, a.T, a.Hq, h);
      load_tile<T, D>(dOs, static_cast<const T*>(a.dout), q0, a.T, a.Hq, h);
      if (tid < kTile) {
        const int64_t i = q0 + tid;
        lse_s[tid] = i < a.T ? a.lse[int64_t(h) * a.T + i] : 0.f;
        del_s[tid] = i < a.T ? a.delta[int64_t(h) * a.T + i] : 0.f;
      }
      __syncthreads();
      float s[8], dp[8];
      scores<D>(Qs, dOs, Ks, Vs, r, cq, s, dp);
      const int64_t i = q0 + r;
#pragma unroll
      for (int cc = 0; cc < 8; ++cc) {
        const int c = cq + 4 * cc;
        const int64_t j = j0 + c;
        const bool valid = i < a.T && j < a.T && j <= i && i < end_s[c];
        const float p = valid ? expf(a.scale * s[cc] - lse_s[r]) : 0.f;
        Ps[r * kPS + c] = p;
        dSs[r * kPS + c] = p * (dp[cc] - del_s[r]);
      }
      __syncthreads();
      for (int q = 0; q < kTile; ++q) {
        const float p = Ps[q * kPS + kr], ds = dSs[q * kPS + kr];
#pragma unroll
        for (int e = 0; e < D / 4; ++e) {
          dv[e] += p * dOs[q * (D + 1) + cq + 4 * e];
          dk[e] += ds * Qs[q * (D + 1) + cq + 4 * e];
        }
      }
      __syncthreads();
    }
  }
  const int64_t j = j0 + kr;
  if (j < a.T) {
    T* dkp = static_cast<T*>(a.dk) + (j * a.Hkv + kh) * D;
    T* dvp = static_cast<T*>(a.dv) + (j * a.Hkv + kh) * D;
#pragma unroll
    for (int e = 0; e < D / 4; ++e) {
      dkp[cq + 4 * e] = from_f32<T>(a.scale * dk[e]);
      dvp[cq + 4 * e] = from_f32<T>(dv[e]);
    }
  }
}

template <class T, int D>
void launch_tiled(Context& ctx, const BwdArgs& a) {
  constexpr size_t smem = smem_bytes<D>();
  cudaStream_t st = stream_of(ctx);
  CUDA_CHECK(cudaFuncSetAttribute(dq_tiled_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CUDA_CHECK(cudaFuncSetAttribute(dkv_tiled_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const unsigned tiles = unsigned(ceil_div(a.T, kTile));
  dq_tiled_kernel<T, D><<<dim3(tiles, unsigned(a.Hq)), kThreads, smem, st>>>(a);
  CUDA_CHECK_LAUNCH();
  dkv_tiled_kernel<T, D><<<dim3(tiles, unsigned(a.Hkv)), kThreads, smem, st>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_backward_tiled(Context& ctx, const BwdArgs& a, DType dt) {
  if (a.D != 32 && a.D != 64 && a.D != 128) return false;
  GRPO_CHECK_MSG(a.Hq <= 65535 && a.Hkv <= 65535 && ceil_div(a.T, kTile) <= 0x7fffffff, "attention_backward: grid too large");
  GRPO_DISPATCH_FLOAT(dt, T, {
    switch (a.D) {
      case 32: launch_tiled<T, 32>(ctx, a); break;
      case 64: launch_tiled<T, 64>(ctx, a); break;
      default: launch_tiled<T, 128>(ctx, a); break;
    }
  });
  return true;
}

}  // namespace grpo::cuda
