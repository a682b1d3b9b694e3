// Tensor-core causal GQA attention for packed training batches (bf16, head dim 64 or 128):
// FlashAttention-2-shaped forward, dq and dk/dv kernels on mma.sync m16n8k16 (bf16 in,
// f32 accumulate), deterministic (every output element is owned by one thread and summed
// in a fixed order; no atomics). Definitions as in cpu/attention.cpp (s = 1/sqrt(D)):
//   p_ij = exp(s·q_i·k_j − lse_i) for start(i) <= j <= i;  out_i = Σ_j p_ij·v_j
//   dS_ij = p_ij·(dout_i·v_j − Δ_i);  dq_i = s·Σ_j dS_ij·k_j;  dk_j = s·Σ_{i,h} dS_ij·q_i;
//   dv_j = Σ_{i,h} p_ij·dout_i.
// Tiles are 64 packed rows × 64 packed columns and may straddle sequences: the mask is
// start(i) <= j <= i (start(i) = first token of i's sequence), so no tile list is needed.
// 128 threads = 4 warps; a warp owns 16 rows of the 64-row tile (the mma M dimension).
//   forward: block = (64 query tokens, one query head); walks key tiles from the start of
//            its first row's sequence up to its last row; online softmax in the exp2
//            domain; K/V tiles double-buffered through cp.async; writes out and lse.
//   dq:      block = (64 query tokens, one query head); same walk; recomputes P from lse,
//            dP = dO·Vᵀ, dS, and accumulates dq += dS·K.
//   dk/dv:   block = (64 key tokens, one kv head); walks the group's query heads and the
//            query tiles from its first key to the end of its last key's sequence;
//            computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, accumulates dv += Pᵀ·dO and dk += dSᵀ·Q.
// Shared-memory rows are padded by 16 bytes so ldmatrix reads are free of bank conflicts.
// The engine's paged attention (attention.cu) computes the same function with CUDA-core
// arithmetic in a different order, so rollout and training outputs agree to bf16 rounding
// (not bit for bit); see docs/ARCHITECTURE.md.
#include "kernels/cuda/attention_tc.cuh"

#include <cmath>

namespace grpo::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTile = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a·b for one m16n8k16 tile (a: 4 regs, b: 2 regs of packed bf16 pairs).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
// 4 bytes (.ca: 4-byte copies must go through L1); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [r0, r0+64) of a (T, H, D) tensor at head h into a padded smem tile (zeros past T).
template <int D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t r0, int64_t T, int H,
                                          int h) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  constexpr int LD = D + 8;
  for (int e = threadIdx.x; e < kTile * CPR; e += kThreads) {
    const int r = e / CPR, c = e % CPR;
    const int64_t row = r0 + r;
    const bool ok = row < T;
    const __nv_bfloat16* g = src + ((ok ? row : 0) * H + h) * D + c * 8;
    cp_async16(dst + r * LD + c * 8, g, ok);
  }
}

// First token of the sequence holding packed token t (t < T).
__device__ __forceinline__ int64_t seq_start(const int32_t* cu, int n_seqs, int64_t t) {
  return cu[find_seq(cu, n_seqs, t)];
}

// S (16 rows of A × 64 columns of B) = A·Bᵀ over D, A and B row-major [row][d] tiles.
// A rows start at a_row0 of tile A; the result is s[8][4] in mma C layout.
template <int D>
__device__ __forceinline__ void tile_qkT(float (&s)[8][4], const __nv_bfloat16* A, int a_row0,
                                         const __nv_bfloat16* B, int lane) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm4(a, A + (a_row0 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      const int mi = lane >> 3;
      ldsm4(b, B + (np * 16 + (lane & 7) + (mi >> 1) * 8) * LD + kk * 16 + (mi & 1) * 8);
      mma(s[2 * np], a, b[0], b[1]);
      mma(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 rows × D) += P (16 rows × 64, packed in mma C layout) · B, B a row-major [64][D] tile.
template <int D>
__device__ __forceinline__ void tile_pv(float (&acc)[D / 8][4], const float (&p)[8][4], const __nv_bfloat16* B,
                                        int lane) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      const int mi = lane >> 3;
      ldsm4_t(b, B + (kk * 16 + (lane & 7) + (mi & 1) * 8) * LD + dp * 16 + (mi >> 1) * 8);
      mma(acc[2 * dp], a, b[0], b[1]);
      mma(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// The walk of a 64-query-row block (forward and dq kernels): rows r0.., key tiles from the
// start of the first row's sequence (ks) to the last row; this thread's two rows (g and g+8
// of its warp's 16) with their sequence starts.
struct QueryWalk {
  int64_t r0, ks, warp_last;
  int n_tiles;
  int64_t row[2], rstart[2];
};

__device__ __forceinline__ QueryWalk query_walk(const TcArgs& a, int warp, int g) {
  QueryWalk w;
  w.r0 = int64_t(blockIdx.x) * kTile;
  const int64_t last = min(w.r0 + kTile, a.T) - 1;
  w.ks = seq_start(a.cu, a.n_seqs, w.r0);
  w.n_tiles = int((last - w.ks) / kTile) + 1;
  w.warp_last = w.r0 + warp * 16 + 15;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    w.row[i] = w.r0 + warp * 16 + g + i * 8;
    w.rstart[i] = w.row[i] < a.T ? seq_start(a.cu, a.n_seqs, w.row[i]) : INT64_MAX;
  }
  return w;
}

// Double-buffered K/V: issues tile it+1 (if any) and waits for tile it.
template <int D>
__device__ __forceinline__ void kv_next(const TcArgs& a, int it, int n_tiles, int64_t k0, __nv_bfloat16* Ks,
                                        __nv_bfloat16* Vs, int kh) {
  constexpr int TS = kTile * (D + 8);
  if (it + 1 < n_tiles) {
    const int nb = (it + 1) & 1;
    load_tile<D>(Ks + nb * TS, static_cast<const __nv_bfloat16*>(a.k), k0 + kTile, a.T, a.Hkv, kh);
    load_tile<D>(Vs + nb * TS, static_cast<const __nv_bfloat16*>(a.v), k0 + kTile, a.T, a.Hkv, kh);
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
}

template <int D>
constexpr size_t fwd_smem() {
  return size_t(5) * kTile * (D + 8) * sizeof(__nv_bfloat16);
}

template <int D>
__global__ void __launch_bounds__(kThreads) attn_fwd_tc_kernel(TcArgs a) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* Ks = Qs + TS;      // 2 buffers
  __nv_bfloat16* Vs = Ks + 2 * TS;  // 2 buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, kh = h / a.G;
  const QueryWalk wk = query_walk(a, warp, g);
  const int64_t r0 = wk.r0, ks = wk.ks, warp_last = wk.warp_last;
  const int n_tiles = wk.n_tiles;
  const int64_t* row = wk.row;
  const int64_t* rstart = wk.rstart;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);

  load_tile<D>(Qs, q, r0, a.T, a.Hq, h);
  load_tile<D>(Ks, k, ks, a.T, a.Hkv, kh);
  load_tile<D>(Vs, v, ks, a.T, a.Hkv, kh);
  cp_commit();

  const float sl2 = a.scale * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t k0 = ks + int64_t(it) * kTile;
    kv_next<D>(a, it, n_tiles, k0, Ks, Vs, kh);
    __syncthreads();
    const __nv_bfloat16* Kt = Ks + (it & 1) * TS;
    const __nv_bfloat16* Vt = Vs + (it & 1) * TS;
    if (k0 <= warp_last) {  // some key of this tile is visible to some row of the warp
      float s[8][4];
      tile_qkT<D>(s, Qs, warp * 16, Kt, lane);
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          const int64_t col = k0 + j * 8 + 2 * t4 + (e & 1);
          const bool ok = col >= rstart[i] && col <= row[i];
          s[j][e] = ok ? s[j][e] * sl2 : -INFINITY;
          mx[i] = fmaxf(mx[i], s[j][e]);
        }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      }
      float corr[2], base[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        base[i] = mx[i] == -INFINITY ? 0.f : mx[i];
        corr[i] = exp2f(m[i] - base[i]);  // m = -inf: 0
        m[i] = mx[i];
        l[i] *= corr[i];
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[j][e] - base[e >> 1]);
          s[j][e] = p;
          l[e >> 1] += p;
        }
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        acc[j][0] *= corr[0];
        acc[j][1] *= corr[0];
        acc[j][2] *= corr[1];
        acc[j][3] *= corr[1];
      }
      tile_pv<D>(acc, s, Vt, lane);
    }
    __syncthreads();
  }

  auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float L = l[i];
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    if (row[i] >= a.T) continue;
    const float inv = 1.f / L;
    __nv_bfloat16* o = out + (row[i] * a.Hq + h) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint32_t pk = pack_bf16(acc[j][2 * i] * inv, acc[j][2 * i + 1] * inv);
      *reinterpret_cast<uint32_t*>(o + j * 8 + 2 * t4) = pk;
    }
    if (t4 == 0 && a.lse) a.lse[int64_t(h) * a.T + row[i]] = m[i] * kLn2 + logf(L);
  }
}

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
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  const auto* dout = static_cast<const __nv_bfloat16*>(a.dout);

  float lse2[2], dlt[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool ok = row[i] < a.T;
    lse2[i] = ok ? a.lse[int64_t(h) * a.T + row[i]] * kLog2e : 0.f;
    dlt[i] = ok ? a.delta[int64_t(h) * a.T + row[i]] : 0.f;
  }

  load_tile<D>(Qs, q, r0, a.T, a.Hq, h);
  load_tile<D>(dOs, dout, r0, a.T, a.Hq, h);
  load_tile<D>(Ks, k, ks, a.T, a.Hkv, kh);
  load_tile<D>(Vs, v, ks, a.T, a.Hkv, kh);
  cp_commit();

  const float sl2 = a.scale * kLog2e;
  float acc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t k0 = ks + int64_t(it) * kTile;
    kv_next<D>(a, it, n_tiles, k0, Ks, Vs, kh);
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

template <int D>
__global__ void __launch_bounds__(kThreads) attn_dkv_tc_kernel(TcArgs a) {
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

template <class K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48u * 1024u)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int D>
void launch_fwd(Context& ctx, const TcArgs& a) {
  const size_t sm = fwd_smem<D>();
  set_smem(attn_fwd_tc_kernel<D>, sm);
  attn_fwd_tc_kernel<D><<<dim3(unsigned(ceil_div(a.T, kTile)), unsigned(a.Hq)), kThreads, sm, stream_of(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
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

bool attention_tc_supported(DType dt, int D) { return dt == DType::bf16 && (D == 64 || D == 128); }

bool attention_forward_tc(Context& ctx, const TcArgs& a, DType dt) {
  if (!attention_tc_supported(dt, a.D) || a.T == 0) return false;
  if (a.D == 64) launch_fwd<64>(ctx, a);
  else launch_fwd<128>(ctx, a);
  return true;
}

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
