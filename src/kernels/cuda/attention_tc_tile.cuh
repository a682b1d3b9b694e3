// Private to the tensor-core attention kernels (attention_prefill_tc.cu, attention_train_fwd_tc.cu,
// attention_train_bwd_tc.cu; bf16, head dim 64 or 128): the tile loaders, mma tile products and the
// forward key walk they share. Everything is in an anonymous namespace and force-inlined, so each
// kernel file compiles its own copy and the kernels are the same code whichever file holds them.
//
// The kernels: FlashAttention-2-shaped forward, dq and dk/dv kernels on mma.sync m16n8k16 (bf16 in,
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
//   paged prefill (attention_paged with PagedAttnMeta::prefill_tiles): block = (one tile of
//            up to 64 consecutive query rows of one sequence, one query head); the same key
//            walk and softmax (fwd_walk, shared with the forward), over key positions 0 ..
//            of the sequence, whose K/V rows are gathered through the block table
//            (load_rows with a paged row-offset functor); writes out only. With FP8 (E4M3)
//            caches (PagedTcArgs::kv_fp8) the K/V tiles are copied as bytes into two staging
//            stages and widened (exactly) into one bf16 K/V tile per step (fwd_walk's staged
//            walk): outputs bit for bit those over a bf16 cache holding the same values.
//   dq:      block = (64 query tokens, one query head); same walk; recomputes P from lse,
//            dP = dO·Vᵀ, dS, and accumulates dq += dS·K.
//   dk/dv:   block = (64 key tokens, one kv head); walks the group's query heads and the
//            query tiles from its first key to the end of its last key's sequence;
//            computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, accumulates dv += Pᵀ·dO and dk += dSᵀ·Q.
// Shared-memory rows are padded by 16 bytes so ldmatrix reads are free of bank conflicts.
// The engine's per-token paged attention (attention.cu: decode, and prefill without a tile
// list) computes the same function with CUDA-core arithmetic in a different order, and the
// paged prefill kernel walks keys from position 0 rather than packed 64-row tiles, so
// rollout and training outputs agree to bf16 rounding (not bit for bit); see
// docs/ARCHITECTURE.md.
#pragma once

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/mma.cuh"

#include <cmath>
#include <type_traits>

namespace grpo::cuda {

namespace {

using namespace tc;

constexpr int kThreads = 128;
constexpr int kTile = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 4 bytes (.ca: 4-byte copies must go through L1); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(tc::smem_u32(smem)), "l"(gmem), "r"(n));
}

// The 64 rows of N padded smem tiles (row stride D + 8) from N tensors that share one row
// layout: tile row r of tensor i is the D contiguous values at src[i] + off(r), or zeros
// where off(r) < 0 (no global read then: the cp.async source size is 0). off is the only
// thing that differs between the packed loader (row r0 + r of a (T, H, D) tensor) and the
// paged one (key position k0 + r through the block table), and it is evaluated once per
// thread and row for all N tensors, so the paged K and V tiles share one block-table
// lookup. Thread x copies the 16-byte chunks x, x + 128, ... (The packed loader issues K
// and V as two N = 1 calls: loading them together costs the training forward ~20
// registers for no gain, since its row offsets are plain arithmetic.)
template <int D, int N, class RowOff>
__device__ __forceinline__ void load_rows(__nv_bfloat16* const (&dst)[N], const __nv_bfloat16* const (&src)[N],
                                          RowOff off) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  constexpr int LD = D + 8;
  static_assert(kTile * CPR % kThreads == 0, "load_rows: every thread copies the same number of chunks");
  for (int e = threadIdx.x; e < kTile * CPR; e += kThreads) {
    const int r = e / CPR, c = e % CPR;
    const int64_t o = off(r);
    const bool ok = o >= 0;
#pragma unroll
    for (int i = 0; i < N; ++i) cp_async16(dst[i] + r * LD + c * 8, src[i] + (ok ? o : 0) + c * 8, ok);
  }
}

// load_rows with every row offset of this thread computed before the first copy: for offsets
// that need a global read (the paged block-table lookup), which could not be moved above an
// earlier cp.async (the copies are memory-ordering asm statements), so the lookups of one
// thread's rows are in flight together instead of one per copy. E: the element type (bf16
// tiles with the padded row stride LD = D + 8; the FP8 (E4M3) KV cache's staging tiles as
// bytes, unpadded, LD = D, which the widening step turns into the padded bf16 layout; the
// row offsets are element offsets either way). 16-byte chunks: 8 bf16 or 16 FP8 elements.
template <int D, int N, class E = __nv_bfloat16, int LD = D + 8, class RowOff>
__device__ __forceinline__ void load_rows_hoisted(E* const (&dst)[N], const E* const (&src)[N], RowOff off) {
  constexpr int EPC = 16 / int(sizeof(E));  // elements per 16-byte chunk
  constexpr int CPR = D / EPC;              // chunks per row
  constexpr int kPer = kTile * CPR / kThreads;
  static_assert(kTile * CPR % kThreads == 0 && kThreads % CPR == 0, "load_rows_hoisted: fixed chunk column");
  const int c = threadIdx.x % CPR, r0 = threadIdx.x / CPR;
  int64_t o[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) o[j] = off(r0 + j * (kThreads / CPR));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = r0 + j * (kThreads / CPR);
    const bool ok = o[j] >= 0;
#pragma unroll
    for (int i = 0; i < N; ++i) cp_async16(dst[i] + r * LD + c * EPC, src[i] + (ok ? o[j] : 0) + c * EPC, ok);
  }
}

// Row offset of packed row r0 + r of a (T, H, D) tensor at head h; -1 (zeros) past T.
template <int D>
__device__ __forceinline__ auto packed_rows(int64_t r0, int64_t T, int H, int h) {
  return [=](int r) {
    const int64_t row = r0 + r;
    return row < T ? (row * H + h) * D : int64_t(-1);
  };
}

// Rows [r0, r0+64) of a (T, H, D) tensor at head h into a padded smem tile (zeros past T).
template <int D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t r0, int64_t T, int H,
                                          int h) {
  load_rows<D, 1>({dst}, {src}, packed_rows<D>(r0, T, H, h));
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
      mma16816(s[2 * np], a, b[0], b[1]);
      mma16816(s[2 * np + 1], a, b[2], b[3]);
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
      mma16816(acc[2 * dp], a, b[0], b[1]);
      mma16816(acc[2 * dp + 1], a, b[2], b[3]);
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

// Double-buffered K/V: issue(j) issues the cp.async copies of key tile j into buffer j & 1;
// kv_next issues tile it+1 (if any) and waits for tile it.
template <class Issue>
__device__ __forceinline__ void kv_next(int it, int n_tiles, const Issue& issue) {
  if (it + 1 < n_tiles) {
    issue(it + 1);
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
}

// Key tile j of a packed walk from key ks: rows ks + 64·j .. of k and v at kv head kh.
template <int D>
__device__ __forceinline__ auto packed_kv(const TcArgs& a, __nv_bfloat16* Ks, __nv_bfloat16* Vs, int64_t ks, int kh) {
  constexpr int TS = kTile * (D + 8);
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  const int64_t T = a.T;
  const int Hkv = a.Hkv;
  return [=](int j) {
    const int b = j & 1;
    const int64_t k0 = ks + int64_t(j) * kTile;
    load_rows<D, 1>({Ks + b * TS}, {k}, packed_rows<D>(k0, T, Hkv, kh));
    load_rows<D, 1>({Vs + b * TS}, {v}, packed_rows<D>(k0, T, Hkv, kh));
  };
}

// Online-softmax state of this thread's two rows (g and g+8 of its warp's 16 rows): running
// max m (scaled scores, log2 domain), this thread's share of the running sum l (its quad
// sums it at the end), and the unnormalised output in mma C layout.
template <int D>
struct FwdState {
  float m[2], l[2];
  float acc[D / 8][4];
};

// The walk's widening step when K/V tiles are loaded as bf16: none (a tag, never called).
struct NoWiden {};

// The forward key walk shared by the packed (training) and the paged (prefill) kernels:
// key tile it holds keys ks + 64·it .. ks + 64·it + 63 (buffer it & 1); row i of this thread
// sees key col iff lo[i] <= col <= hi[i] (lo = INT64_MAX: a padding row that sees nothing).
// The warp skips tiles that start past warp_last, the last key any of its rows may see.
// On entry Q is being loaded into Qs and key tile 0 into buffer 0 (committed); issue(j)
// issues key tile j (see kv_next).
// Staged walk (a Widen other than NoWiden; the FP8 KV cache): issue(j) copies tile j into
// staging buffer j & 1 instead, and once it has landed widen(j) turns it into the single
// bf16 K/V tiles Ks, Vs (a barrier on each side: the tiles are free when every warp is done
// with tile j − 1, and read only after every thread has written its part). No barrier ends
// the iteration: the staging buffer that issue(j + 2) overwrites was last read by widen(j),
// before the barrier that precedes tile j's products.
template <int D, class Issue, class Widen = NoWiden>
__device__ __forceinline__ void fwd_walk(FwdState<D>& st, const __nv_bfloat16* Qs, const __nv_bfloat16* Ks,
                                         const __nv_bfloat16* Vs, int n_tiles, int64_t ks, int64_t warp_last,
                                         const int64_t (&lo)[2], const int64_t (&hi)[2], float sl2,
                                         const Issue& issue, const Widen& widen = Widen{}) {
  constexpr bool kStaged = !std::is_same_v<Widen, NoWiden>;
  constexpr int TS = kTile * (D + 8);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;
  float(&m)[2] = st.m;
  float(&l)[2] = st.l;
  float(&acc)[D / 8][4] = st.acc;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.f;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t k0 = ks + int64_t(it) * kTile;
    kv_next(it, n_tiles, issue);
    __syncthreads();
    const __nv_bfloat16* Kt = Ks;
    const __nv_bfloat16* Vt = Vs;
    if constexpr (kStaged) {
      widen(it);
      __syncthreads();
    } else {
      Kt += (it & 1) * TS;
      Vt += (it & 1) * TS;
    }
    if (k0 <= warp_last) {  // some key of this tile is visible to some row of the warp
      float s[8][4];
      tile_qkT<D>(s, Qs, warp * 16, Kt, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          const int64_t col = k0 + j * 8 + 2 * t4 + (e & 1);
          const bool ok = col >= lo[i] && col <= hi[i];
          s[j][e] = ok ? s[j][e] * sl2 : -INFINITY;
        }
      online_softmax_step(s, m, l, acc);
      tile_pv<D>(acc, s, Vt, lane);
    }
    if constexpr (!kStaged) __syncthreads();
  }
}

// Row i of this thread after the walk: sums l over the quad and, when o is not null
// (a real row), writes acc / l there as bf16 (o: the row's D outputs). Returns the sum.
template <int D>
__device__ __forceinline__ float fwd_finish(const FwdState<D>& st, int i, __nv_bfloat16* o, int t4) {
  float L = st.l[i];
  L += __shfl_xor_sync(0xffffffffu, L, 1);
  L += __shfl_xor_sync(0xffffffffu, L, 2);
  if (o) {
    const float inv = 1.f / L;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint32_t pk = pack_bf16(st.acc[j][2 * i] * inv, st.acc[j][2 * i + 1] * inv);
      *reinterpret_cast<uint32_t*>(o + j * 8 + 2 * t4) = pk;
    }
  }
  return L;
}

template <int D>
constexpr size_t fwd_smem() {
  return size_t(5) * kTile * (D + 8) * sizeof(__nv_bfloat16);
}
// Paged prefill over an FP8 cache: Q, one bf16 K and V tile, and two stages of FP8 K and V
// staging tiles (D = 64: 44,032 bytes, D = 128: 84,992; the bf16 kernel's are 46,080 and 87,040).
template <int D>
constexpr size_t paged_fp8_smem() {
  return size_t(3) * kTile * (D + 8) * sizeof(__nv_bfloat16) + size_t(4) * kTile * D;
}

template <class K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48u * 1024u)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

}  // namespace grpo::cuda
