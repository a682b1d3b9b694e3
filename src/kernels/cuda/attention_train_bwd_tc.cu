// Tensor-core attention backward of packed training batches (bf16, head dim 64/128): the dq kernel
// (block = 64 query tokens × query head) and the dk/dv kernel (block = 64 key tokens × kv head),
// deterministic (no atomics). Definitions and tiling in attention_tc_tile.cuh.
#include "kernels/cuda/attention_tc_tile.cuh"

namespace grpo::cuda {

namespace {

template <int D>
constexpr size_t dq_smem() {
  return size_t(6) * kTile * (D + 8) * sizeof(__nv_bfloat16);
}

template <int D>
__global__ void __launch_bounds__(kThreads) attn_dq_tc_kernel(TcArgs a) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* dOs = Qs + TS;
  __nv_bfloat16* Ks = dOs + TS;     // 2 buffers
  __nv_bfloat16* Vs = Ks + 2 * TS;  // 2 buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, kh = h / a.G;
  const QueryWalk wk = query_walk(a, warp, g);
  const int64_t r0 = wk.r0, ks = wk.ks, warp_last = wk.warp_last;
  const int n_tiles = wk.n_tiles;
  const int64_t* row = wk.row;
  const int64_t* rstart = wk.rstart;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const auto* dout = static_cast<const __nv_bfloat16*>(a.dout);

  float lse2[2], dlt[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool ok = row[i] < a.T;
    lse2[i] = ok ? a.lse[int64_t(h) * a.T + row[i]] * kLog2e : 0.f;
    dlt[i] = ok ? a.delta[int64_t(h) * a.T + row[i]] : 0.f;
  }

  const auto kv = packed_kv<D>(a, Ks, Vs, ks, kh);
  load_tile<D>(Qs, q, r0, a.T, a.Hq, h);
  load_tile<D>(dOs, dout, r0, a.T, a.Hq, h);
  kv(0);
  cp_commit();

  const float sl2 = a.scale * kLog2e;
  float acc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t k0 = ks + int64_t(it) * kTile;
    kv_next(it, n_tiles, kv);
    __syncthreads();
    const __nv_bfloat16* Kt = Ks + (it & 1) * TS;
    const __nv_bfloat16* Vt = Vs + (it & 1) * TS;
    if (k0 <= warp_last) {
      float s[8][4], dp[8][4];
      tile_qkT<D>(s, Qs, warp * 16, Kt, lane);
      tile_qkT<D>(dp, dOs, warp * 16, Vt, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          const int64_t col = k0 + j * 8 + 2 * t4 + (e & 1);
          const bool ok = col >= rstart[i] && col <= row[i];
          const float p = ok ? exp2f(s[j][e] * sl2 - lse2[i]) : 0.f;
          s[j][e] = p * (dp[j][e] - dlt[i]);  // dS
        }
      tile_pv<D>(acc, s, Kt, lane);
    }
    __syncthreads();
  }

  auto* dq = static_cast<__nv_bfloat16*>(a.dq);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= a.T) continue;
    __nv_bfloat16* o = dq + (row[i] * a.Hq + h) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(o + j * 8 + 2 * t4) =
          pack_bf16(acc[j][2 * i] * a.scale, acc[j][2 * i + 1] * a.scale);
  }
}

template <int D>
constexpr size_t dkv_smem() {
  return size_t(6) * kTile * (D + 8) * sizeof(__nv_bfloat16) + size_t(2) * kTile * (2 * sizeof(float) + sizeof(int32_t));
}

// Head dim 64: at most 168 registers (from 194; 16 bytes spill) so three blocks fit an SM
// instead of two; the kernel is issue/latency-bound, and the Qwen2.5-0.5B train step went
// 0.331-0.334 → 0.328-0.330 s on an H200.
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 1) attn_dkv_tc_kernel(TcArgs a) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* Vs = Ks + TS;
  __nv_bfloat16* Qs = Vs + TS;       // 2 buffers
  __nv_bfloat16* dOs = Qs + 2 * TS;  // 2 buffers
  int32_t* qst = reinterpret_cast<int32_t*>(dOs + 2 * TS);  // 2 × 64 query sequence starts
  float* lse2 = reinterpret_cast<float*>(qst + 2 * kTile);  // 2 × 64 lse (natural log)
  float* dlt = lse2 + 2 * kTile;                            // 2 × 64
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int kh = blockIdx.y;
  const int64_t k0 = int64_t(blockIdx.x) * kTile;
  const int64_t klast = min(k0 + kTile, a.T) - 1;
  const int64_t q_end = a.cu[find_seq(a.cu, a.n_seqs, klast) + 1];  // one past the last query needed
  const int n_qt = int((q_end - 1 - k0) / kTile) + 1;
  const int n_iter = n_qt * a.G;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  const auto* dout = static_cast<const __nv_bfloat16*>(a.dout);

  int64_t key[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key[i] = k0 + warp * 16 + g + i * 8;
  const int64_t warp_first = k0 + warp * 16;

  // Iteration it: query head kh·G + it / n_qt, query tile it % n_qt.
  auto issue = [&](int it) {
    const int buf = it & 1;
    const int h = kh * a.G + it / n_qt;
    const int64_t q0 = k0 + int64_t(it % n_qt) * kTile;
    load_tile<D>(Qs + buf * TS, q, q0, a.T, a.Hq, h);
    load_tile<D>(dOs + buf * TS, dout, q0, a.T, a.Hq, h);
    // Per-query scalars by cp.async too, so no thread stalls on them (zeros past T,
    // where the mask's qi < T test applies).
    for (int e = threadIdx.x; e < 3 * kTile; e += kThreads) {
      const int which = e / kTile, c = e % kTile;
      const int64_t i = q0 + c;
      const bool ok = i < a.T;
      const int64_t ii = ok ? i : 0;
      if (which == 0) cp_async4(qst + buf * kTile + c, a.tok_start + ii, ok);
      else if (which == 1) cp_async4(lse2 + buf * kTile + c, a.lse + int64_t(h) * a.T + ii, ok);
      else cp_async4(dlt + buf * kTile + c, a.delta + int64_t(h) * a.T + ii, ok);
    }
  };
  load_tile<D>(Ks, k, k0, a.T, a.Hkv, kh);
  load_tile<D>(Vs, v, k0, a.T, a.Hkv, kh);
  issue(0);
  cp_commit();

  const float sl2 = a.scale * kLog2e;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;

  for (int it = 0; it < n_iter; ++it) {
    const int64_t q0 = k0 + int64_t(it % n_qt) * kTile;
    if (it + 1 < n_iter) {
      issue(it + 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int buf = it & 1;
    const __nv_bfloat16* Qt = Qs + buf * TS;
    const __nv_bfloat16* dOt = dOs + buf * TS;
    const int32_t* qs = qst + buf * kTile;
    const float* l2 = lse2 + buf * kTile;
    const float* dl = dlt + buf * kTile;
    if (q0 + kTile - 1 >= warp_first) {  // some query of this tile sees some key of the warp
      float s[8][4], dp[8][4];
      tile_qkT<D>(s, Ks, warp * 16, Qt, lane);   // Sᵀ: rows keys, columns queries
      tile_qkT<D>(dp, Vs, warp * 16, dOt, lane); // dPᵀ
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = j * 8 + 2 * t4 + (e & 1);
          const int64_t qi = q0 + c, kj = key[e >> 1];
          const bool ok = qi < a.T && kj <= qi && int64_t(qs[c]) <= kj;
          const float p = ok ? exp2f(s[j][e] * sl2 - l2[c] * kLog2e) : 0.f;
          s[j][e] = p;
          dp[j][e] = p * (dp[j][e] - dl[c]);
        }
      tile_pv<D>(dv, s, dOt, lane);
      tile_pv<D>(dk, dp, Qt, lane);
    }
    __syncthreads();
  }

  auto* dkp = static_cast<__nv_bfloat16*>(a.dk);
  auto* dvp = static_cast<__nv_bfloat16*>(a.dv);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= a.T) continue;
    __nv_bfloat16* ok_ = dkp + (key[i] * a.Hkv + kh) * D;
    __nv_bfloat16* ov = dvp + (key[i] * a.Hkv + kh) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(ok_ + j * 8 + 2 * t4) =
          pack_bf16(dk[j][2 * i] * a.scale, dk[j][2 * i + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(ov + j * 8 + 2 * t4) = pack_bf16(dv[j][2 * i], dv[j][2 * i + 1]);
    }
  }
}

// tok_start[t] = first token of t's sequence: one binary search per token, once per backward
// (the dk/dv kernel needs it for every query tile it visits).
__global__ void tok_start_kernel(int32_t* __restrict__ out, const int32_t* __restrict__ cu, int n_seqs, int64_t T) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < T) out[t] = cu[find_seq(cu, n_seqs, t)];
}

template <int D>
void launch_bwd(Context& ctx, const TcArgs& a) {
  const unsigned nt = unsigned(ceil_div(a.T, kTile));
  set_smem(attn_dq_tc_kernel<D>, dq_smem<D>());
  attn_dq_tc_kernel<D><<<dim3(nt, unsigned(a.Hq)), kThreads, dq_smem<D>(), stream_of(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
  set_smem(attn_dkv_tc_kernel<D>, dkv_smem<D>());
  attn_dkv_tc_kernel<D><<<dim3(nt, unsigned(a.Hkv)), kThreads, dkv_smem<D>(), stream_of(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_backward_tc(Context& ctx, const TcArgs& args, DType dt) {
  if (!attention_tc_supported(dt, args.D) || args.T == 0) return false;
  const TcArgs& a = args;
  GRPO_CHECK_MSG(a.tok_start, "attention_backward_tc: tok_start scratch missing");
  tok_start_kernel<<<unsigned(ceil_div(a.T, 256)), 256, 0, stream_of(ctx)>>>(a.tok_start, a.cu, a.n_seqs, a.T);
  CUDA_CHECK_LAUNCH();
  if (a.D == 64) launch_bwd<64>(ctx, a);
  else launch_bwd<128>(ctx, a);
  return true;
}

}  // namespace grpo::cuda
