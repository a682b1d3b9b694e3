// Tensor-core paged attention for query tokens taken one at a time (decode rows; any row of a
// paged batch when no prefill tile list is given), bf16 with head dim 64 or 128 and GQA groups
// of 4 to 16 query heads per kv head; the caches bf16 or FP8 E4M3 (kv_cache_dtype = fp8: the
// ring holds FP8 tiles, half the bytes, widened per warp into bf16 just before the products).
// attention_paged (attention.cu) calls it first and falls back to the CUDA-core
// attn_paged_kernel for everything else (f32, other head dims).
//
// Layout: grid (tokens, Hkv, Z), 128 threads = 4 warps. A block takes one query token and one
// kv head; its G query heads are the rows of a 16-row mma tile (rows >= G are zero and never
// written), so K/V are read once for the whole group. The token's keys are cut into fixed
// partitions of kPart = 256 positions (kLongPart = 1024 in batch-invariant contexts with G <= 4;
// never by batch: a token's result depends only on its own context and the model's shape);
// block z takes partitions z, z + Z, ... of its token. The last partition of the
// launch (n_splits − 1) also takes every key past n_splits·kPart, so an underestimated
// max_context stays correct.
// K/V stream through a ring of NS (2, 3 or 5) shared-memory stages of 64 keys (cp.async, 16-byte chunks,
// rows padded by 16 bytes for conflict-free ldmatrix), NS − 1 tiles in flight ahead of the
// one being computed, across the block's partitions. In each 64-key tile warp w takes keys
// 16w..16w+15: scores S = Q·Kᵀ (2 mma n-tiles), masked past the context, online softmax in the
// exp2 domain per warp, then acc += P·V (P rounded to bf16, one k-step of 16 keys).
// At a partition's end the four warps merge in warp order through shared memory: per head the
// max of the warps' maxima, each warp's acc and sum rescaled to it and summed in warp order.
// A token whose context fits one partition writes out = acc / l directly; otherwise each
// partition writes (acc, m, l) partials (m in natural-log units) and the combine kernel of
// attention.cu merges them in partition order (programmatic dependent launch).
// Every output is computed in a fixed order with no atomics: rows do not depend on the other
// tokens of the launch, nor on Z or max_context (when it covers the token).
// A/B switches (read once): GRPO_DECODE_TC=0 (use the CUDA-core kernel), GRPO_DECODE_PART
// (partition length, a multiple of 64), GRPO_DECODE_WAVES (blocks along z ≈ waves × resident
// blocks), GRPO_DECODE_STAGES (2, 3 or 5), GRPO_DECODE_MIN_G (smallest GQA group taken),
// GRPO_DECODE_ROWS=0 (batch-invariant runs of rows one token per block), GRPO_DECODE_ROWS_QG
// (16-row groups per block of the rows kernel). Measured settings: docs/BENCHMARKS.md.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/mma.cuh"

namespace grpo::cuda {

namespace {

using namespace tc;

constexpr int kThreads = 128;
constexpr int kTile = 64;   // keys per ring stage
constexpr int kTab = 512;    // block-table entries cached in shared memory (8192 positions at block size 16)
constexpr int kPart = 256;  // keys per partition (GRPO_DECODE_PART overrides, a multiple of 64: A/B runs)
constexpr int kLongPart = 1024;  // the same in batch-invariant contexts with GQA groups of at most 4
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecArgs {
  const __nv_bfloat16* q;  // (T,Hq,D)
  __nv_bfloat16* out;      // (T,Hq,D)
  const __nv_bfloat16* k;  // (n_blocks,bs,Hkv,D)
  const __nv_bfloat16* v;
  const int32_t* token_seq;
  const int32_t* token_pos;
  const int32_t* block_table;  // (S,max_blocks)
  float* part_acc;             // (chunk,Hq,n_splits,D) when n_splits > 1
  float* part_ml;              // (chunk,Hq,n_splits,2)
  int64_t tok0;
  int max_blocks, block_size, Hq, Hkv, G, n_splits, part;
  float scale;
  const uint8_t* k8;  // FP8 caches (E4M3, (n_blocks,bs,Hkv,D) bytes): used instead of k, v
  const uint8_t* v8;
  float* lse;         // (Hq,T) or null: rows' log-sum-exp (natural log), T = all tokens
  int64_t T;
};

// F8 (FP8 E4M3 caches): the ring's stages hold FP8 K and V tiles (D bytes per row, unpadded:
// half the bytes of a bf16 stage), followed by one bf16 K and V tile into which each warp
// widens its 16 keys of the tile being computed.
template <int D, int NS, bool F8 = false>
struct DecCfg {
  static constexpr int LD = D + 8;          // padded shared row (elements)
  static constexpr int TS = kTile * LD;     // one K or V tile (elements)
  static constexpr int TS8 = kTile * D;     // one FP8 K or V tile (bytes)
  static constexpr size_t ring = F8 ? size_t(NS) * 2 * TS8 + size_t(2) * TS * sizeof(__nv_bfloat16)
                                    : size_t(NS) * 2 * TS * sizeof(__nv_bfloat16);
  static constexpr size_t tab = size_t(kTab) * sizeof(int32_t);  // the token's block-table row
  static constexpr size_t q_bytes = size_t(16) * LD * sizeof(__nv_bfloat16);
  static constexpr size_t stat_bytes = size_t(4 * 16 * 2 + 32) * sizeof(float);
  // After the q fragments are in registers the q tile's space holds the merge state:
  // wm, wl (4 warps × 16 rows), sM, sL (16 rows), then red (4 warps × G × D f32).
  static size_t bytes(int G) {
    const size_t merge = stat_bytes + size_t(4) * G * D * sizeof(float);
    return ring + tab + (merge > q_bytes ? merge : q_bytes);
  }
};

// Keys [k0, min(k0 + 64, kend)) of kv head kh into a ring stage's bf16 K and V tiles (rows of
// LD elements; rows past kend zero-filled), 16-byte cp.async chunks. entry(i): the sequence's
// block-table entry i. The block-table lookups of all of this thread's rows are done first:
// the cp.async below are memory-ordering asm statements, so a lookup placed after one could
// not be hoisted.
template <int D, class Entry>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* Ks, __nv_bfloat16* Vs, const DecArgs& a, int kh, int k0,
                                             int kend, Entry&& entry, int tid) {
  constexpr int LD = D + 8, CPR = D / 8;
  constexpr int kPer = kTile * CPR / kThreads;  // chunks per thread (8 or 4)
  static_assert(kTile * CPR % kThreads == 0 && kThreads % CPR == 0, "every thread keeps one chunk column");
  const int c = tid % CPR;
  int64_t off[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int p = k0 + tid / CPR + i * (kThreads / CPR);
    off[i] = p < kend ? (int64_t(entry(p / a.block_size)) * a.block_size + p % a.block_size) * a.Hkv : -1;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int r = tid / CPR + i * (kThreads / CPR);
    const bool ok = off[i] >= 0;
    const int64_t g = ok ? (off[i] + kh) * D + c * 8 : 0;
    cp_async16(Ks + r * LD + c * 8, a.k + g, ok);
    cp_async16(Vs + r * LD + c * 8, a.v + g, ok);
  }
}

// The four warps' softmax states of one 16-row mma group merged in warp order at the end of a
// partition: each row's l summed over its four lanes; per row the max M of the warps' maxima and
// L = Σ_w l_w · 2^(m_w − M) in warp order (into sM, sL); each warp's acc rescaled to M into
// red[(warp · stride + r) · D ..] for rows r < n_rows. Ends with a barrier: red is complete.
template <int D>
__device__ __forceinline__ void merge_warps(float (&m)[2], float (&l)[2], float (&acc)[D / 8][4], float* wm,
                                            float* wl, float* sM, float* sL, float* red, int stride, int n_rows,
                                            int warp, int tid, int g, int t4) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  if (t4 == 0) {
    wm[warp * 16 + g] = m[0];
    wm[warp * 16 + g + 8] = m[1];
    wl[warp * 16 + g] = l[0];
    wl[warp * 16 + g + 8] = l[1];
  }
  __syncthreads();
  if (tid < 16) {
    float M = -INFINITY;
    for (int w = 0; w < 4; ++w) M = fmaxf(M, wm[w * 16 + tid]);
    float L = 0.f;
    for (int w = 0; w < 4; ++w) {
      const float mw = wm[w * 16 + tid];
      L += mw == -INFINITY ? 0.f : wl[w * 16 + tid] * exp2f(mw - M);
    }
    sM[tid] = M;
    sL[tid] = L;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = g + 8 * i;
    if (r >= n_rows) continue;
    const float sc = m[i] == -INFINITY ? 0.f : exp2f(m[i] - sM[r]);
    float* dst = red + (warp * stride + r) * D + 2 * t4;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(acc[j][2 * i] * sc, acc[j][2 * i + 1] * sc);
  }
  __syncthreads();
}

// F8: the K/V tiles are FP8 in the ring (16-byte copies of 16 elements); a warp widens its 16
// keys of the tile (exactly) into its rows of the bf16 tiles `wide` just before its products
// (no block barrier: no other warp reads those rows), so its mma operands, and with them the
// outputs, are bit for bit those of the bf16 kernel on a bf16 cache holding the same values.
template <int D, int NS, bool F8>
__global__ void __launch_bounds__(kThreads) attn_decode_tc_kernel(DecArgs a) {
  using C = DecCfg<D, NS, F8>;
  constexpr int LD = C::LD, TS = C::TS, TS8 = C::TS8, CPR = D / 8;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smraw);  // stage s: K at 2s·TS, V at (2s+1)·TS
  uint8_t* ring8 = smraw;                                         // F8: stage s: K at 2s·TS8, V at (2s+1)·TS8
  __nv_bfloat16* wide = reinterpret_cast<__nv_bfloat16*>(smraw + size_t(NS) * 2 * TS8);  // F8: K, then V at TS
  int32_t* stab = reinterpret_cast<int32_t*>(smraw + C::ring);
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw + C::ring + C::tab);
  float* wm = reinterpret_cast<float*>(smraw + C::ring + C::tab);  // reuses the q tile (see DecCfg)
  float* wl = wm + 64;
  float* sM = wl + 64;
  float* sL = sM + 16;
  float* red = sL + 16;

  pdl_trigger();  // launched with launch_pdl: the next grid may be scheduled once every block has started
  pdl_wait();     // q comes from the previous kernel
  const int64_t tok = a.tok0 + blockIdx.x;
  const int kh = blockIdx.y, Z = int(gridDim.z), G = a.G;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int ctx_len = a.token_pos[tok] + 1;
  const int n_used = min(a.n_splits, (ctx_len + a.part - 1) / a.part);  // partitions holding keys
  if (int(blockIdx.z) >= n_used) return;
  const int32_t* table = a.block_table + int64_t(a.token_seq[tok]) * a.max_blocks;
  auto part_end = [&](int p) { return p == a.n_splits - 1 ? ctx_len : min(ctx_len, (p + 1) * a.part); };

  // q of the group's heads → Qs rows 0..G-1 (zeros below), its own commit group.
  for (int e = tid; e < 16 * CPR; e += kThreads) {
    const int r = e / CPR, c = e % CPR;
    const bool ok = r < G;
    cp_async16(Qs + r * LD + c * 8, a.q + (tok * a.Hq + kh * G + (ok ? r : 0)) * D + c * 8, ok);
  }
  cp_commit();

  // The token's block-table entries → shared memory once (when they fit), so issuing a tile
  // later costs no dependent global read before its copies can start.
  const int n_ent = (ctx_len + a.block_size - 1) / a.block_size;
  const bool tab_in_smem = n_ent <= kTab;
  if (tab_in_smem)
    for (int i = tid; i < n_ent; i += kThreads) stab[i] = table[i];
  __syncthreads();
  auto entry = [&](int i) { return tab_in_smem ? stab[i] : table[i]; };

  // Keys [k0, min(k0 + 64, kend)) into ring stage `stage` (rows past kend zero-filled). The
  // block-table lookups of all of this thread's rows are done first: the cp.async below are
  // memory-ordering asm statements, so a lookup placed after one could not be hoisted.
  auto issue = [&](int stage, int k0, int kend) {
    if constexpr (F8) {
      uint8_t* Ks = ring8 + stage * 2 * TS8;
      uint8_t* Vs = Ks + TS8;
      constexpr int CPR8 = D / 16;                    // 16-byte chunks per FP8 row
      constexpr int kPer = kTile * CPR8 / kThreads;  // chunks per thread (4 or 2)
      static_assert(kTile * CPR8 % kThreads == 0 && kThreads % CPR8 == 0, "every thread keeps one chunk column");
      const int c = tid % CPR8;
      int64_t off[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int p = k0 + tid / CPR8 + i * (kThreads / CPR8);
        off[i] = p < kend ? (int64_t(entry(p / a.block_size)) * a.block_size + p % a.block_size) * a.Hkv : -1;
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int r = tid / CPR8 + i * (kThreads / CPR8);
        const bool ok = off[i] >= 0;
        const int64_t g = ok ? (off[i] + kh) * D + c * 16 : 0;
        cp_async16(Ks + r * D + c * 16, a.k8 + g, ok);
        cp_async16(Vs + r * D + c * 16, a.v8 + g, ok);
      }
      return;
    }
    load_kv_tile<D>(ring + stage * 2 * TS, ring + stage * 2 * TS + TS, a, kh, k0, kend, entry, tid);
  };
  // The block's tile sequence: partitions z, z+Z, ... < n_used, 64 keys at a time.
  int pp = int(blockIdx.z), pk = pp * a.part;  // producer: next tile to issue
  auto advance = [&](int& p, int& k) {
    k += kTile;
    if (k >= part_end(p)) {
      p += Z;
      k = p * a.part;
    }
  };
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (pp < n_used) {
      issue(s, pk, part_end(pp));
      advance(pp, pk);
    }
    cp_commit();
  }
  cp_wait<NS - 1>();  // the q group
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm4(qa[kk], Qs + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);

  const float sl2 = a.scale * kLog2e;
  float m[2], l[2], acc[D / 8][4];
  auto reset = [&] {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  };
  reset();

  int cp = int(blockIdx.z), ck = cp * a.part;  // consumer: tile being computed
  for (int it = 0; cp < n_used; ++it) {
    cp_wait<NS - 2>();  // tile `it` has landed (this thread's copies) ...
    __syncthreads();    // ... everyone's, and the stage issued next is no longer read
    if (pp < n_used) {
      issue((it + NS - 1) % NS, pk, part_end(pp));
      advance(pp, pk);
    }
    cp_commit();
    const int kend = part_end(cp);
    const __nv_bfloat16* Kt = F8 ? wide : ring + (it % NS) * 2 * TS;
    const __nv_bfloat16* Vt = Kt + TS;
    const int kb = ck + warp * 16;  // this warp's first key
    if (kb < kend) {
      if constexpr (F8) {  // this warp's 16 keys of the stage → its rows of `wide`
        const uint8_t* K8 = ring8 + (it % NS) * 2 * TS8 + warp * 16 * D;
        widen_e4m3_kv<D, 16, 32>(wide + warp * 16 * LD, wide + TS + warp * 16 * LD, K8, K8 + TS8, lane);
        __syncwarp();
      }
      const int mi = lane >> 3;
      float s[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b[4];
        ldsm4(b, Kt + (warp * 16 + (lane & 7) + (mi >> 1) * 8) * LD + kk * 16 + (mi & 1) * 8);
        mma16816(s[0], qa[kk], b[0], b[1]);
        mma16816(s[1], qa[kk], b[2], b[3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kb + j * 8 + 2 * t4 + (e & 1);
          s[j][e] = key < kend ? s[j][e] * sl2 : -INFINITY;
        }
      online_softmax_step(s, m, l, acc);
      const uint32_t pa[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]),
                              pack_bf16(s[1][0], s[1][1]), pack_bf16(s[1][2], s[1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldsm4_t(b, Vt + (warp * 16 + (lane & 7) + (mi & 1) * 8) * LD + dp * 16 + (mi >> 1) * 8);
        mma16816(acc[2 * dp], pa, b[0], b[1]);
        mma16816(acc[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    ck += kTile;
    if (ck < kend) continue;

    // Partition cp is complete: merge the four warps in warp order and write.
    merge_warps<D>(m, l, acc, wm, wl, sM, sL, red, G, G, warp, tid, g, t4);
    for (int e = tid; e < G * D; e += kThreads) {
      const int r = e / D, d = e % D;
      const float A = ((red[r * D + d] + red[(G + r) * D + d]) + red[(2 * G + r) * D + d]) + red[(3 * G + r) * D + d];
      const int h = kh * G + r;
      if (n_used == 1) {
        a.out[(tok * a.Hq + h) * D + d] = __float2bfloat16_rn(A / sL[r]);
        if (d == 0 && a.lse) a.lse[int64_t(h) * a.T + tok] = sM[r] * kLn2 + logf(sL[r]);
      } else {
        const int64_t row = (int64_t(blockIdx.x) * a.Hq + h) * a.n_splits + cp;
        a.part_acc[row * D + d] = A;
        if (d == 0) {
          a.part_ml[row * 2] = sM[r] * kLn2;
          a.part_ml[row * 2 + 1] = sL[r];
        }
      }
    }
    // The merge state is next written after at least one more __syncthreads (loop top).
    reset();
    cp += Z;
    ck = cp * a.part;
  }
  cp_wait<0>();  // no copy may be left in flight when the block exits
}

// ---- several query tokens of one sequence per block (batch-invariant contexts) ----
//
// attn_rows_tc_kernel computes every row exactly as attn_decode_tc_kernel does for that token
// alone (bit for bit), but a block takes up to NR = QG · (16 / G) consecutive rows and reads each
// K/V tile once for all of them: the mma tiles' rows are (token, head) pairs, 16 / G tokens of G
// heads each per 16-row group, QG groups per block. The bitwise mode's training forward (every
// row of a micro-batch through the per-token order) and its engine prefill run it.
// Per row it does what the one-token kernel does: the same 256-key partitions (the last taking
// every key past n_splits·part), the same 64-key tiles with warp w on keys 16w..16w+15, scores
// masked past the row's own partition end, the same online softmax per row, P rounded to bf16,
// warps merged in warp order, partials combined in partition order. A block walks a partition's
// tiles up to its last row's end; a row whose keys ended earlier meets only fully masked tiles,
// which leave its state (m, l, acc) unchanged (corr = 1, p = 0; with m = −inf, l and acc stay 0),
// and a group none of whose rows has keys in a tile skips it, as the one-token kernel does.
// Rows of several sequences in one block's range are taken as consecutive runs of one sequence
// each, one run after the other (a run is at most NR rows).
template <int D, int QG>
struct RowsCfg {
  static constexpr int NS = 2;  // ring depth: launches of many blocks share an SM
  static constexpr int LD = D + 8, TS = kTile * LD;
  static constexpr size_t ring = size_t(NS) * 2 * TS * sizeof(__nv_bfloat16);
  static constexpr size_t tab = size_t(kTab) * sizeof(int32_t);
  static constexpr size_t q_bytes = size_t(QG) * 16 * LD * sizeof(__nv_bfloat16);
  static constexpr size_t ctx_bytes = size_t(16) * QG * sizeof(int32_t);
  static constexpr size_t stat_bytes = size_t(4 * 16 * 2 + 32) * sizeof(float);
  static constexpr size_t red_bytes = size_t(4) * 16 * D * sizeof(float);
  static constexpr size_t bytes = ring + tab + q_bytes + ctx_bytes + stat_bytes + red_bytes;
};

template <int D, int QG>
__global__ void __launch_bounds__(kThreads) attn_rows_tc_kernel(DecArgs a, int64_t n_rows) {
  using C = RowsCfg<D, QG>;
  constexpr int LD = C::LD, TS = C::TS, NS = C::NS, CPR = D / 8;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smraw);
  int32_t* stab = reinterpret_cast<int32_t*>(smraw + C::ring);
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw + C::ring + C::tab);
  int32_t* sctx = reinterpret_cast<int32_t*>(smraw + C::ring + C::tab + C::q_bytes);
  float* wm = reinterpret_cast<float*>(smraw + C::ring + C::tab + C::q_bytes + C::ctx_bytes);
  float* wl = wm + 64;
  float* sM = wl + 64;
  float* sL = sM + 16;
  float* red = sL + 16;

  pdl_trigger();
  pdl_wait();
  const int kh = blockIdx.y, Z = int(gridDim.z), G = a.G, TPG = 16 / G, NR = QG * TPG, GR = TPG * G;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t b_end = min((int64_t(blockIdx.x) + 1) * NR, n_rows);
  for (int64_t r0 = int64_t(blockIdx.x) * NR; r0 < b_end;) {
    const int64_t tok0 = a.tok0 + r0;
    const int seq = a.token_seq[tok0];
    int n = 1;
    while (r0 + n < b_end && a.token_seq[tok0 + n] == seq) ++n;
    r0 += n;
    __syncthreads();  // the previous run is done with shared memory
    if (tid < n) sctx[tid] = a.token_pos[tok0 + tid] + 1;
    __syncthreads();
    int ctx_max = 0;
    for (int j = 0; j < n; ++j) ctx_max = max(ctx_max, sctx[j]);
    const int n_used = min(a.n_splits, (ctx_max + a.part - 1) / a.part);
    if (int(blockIdx.z) >= n_used) continue;
    const int32_t* table = a.block_table + int64_t(seq) * a.max_blocks;
    auto pend = [&](int p, int c) { return p == a.n_splits - 1 ? c : min(c, (p + 1) * a.part); };

    for (int e = tid; e < QG * 16 * CPR; e += kThreads) {
      const int q = e / (16 * CPR), r = e / CPR % 16, c = e % CPR, j = q * TPG + r / G;
      const bool ok = r < GR && j < n;
      cp_async16(Qs + (q * 16 + r) * LD + c * 8,
                 a.q + ((tok0 + (ok ? j : 0)) * a.Hq + kh * G + (ok ? r % G : 0)) * D + c * 8, ok);
    }
    cp_commit();
    const int n_ent = (ctx_max + a.block_size - 1) / a.block_size;
    const bool tab_in_smem = n_ent <= kTab;
    if (tab_in_smem)
      for (int i = tid; i < n_ent; i += kThreads) stab[i] = table[i];
    __syncthreads();
    auto entry = [&](int i) { return tab_in_smem ? stab[i] : table[i]; };

    int pp = int(blockIdx.z), pk = pp * a.part;
    auto advance = [&](int& p, int& k) {
      k += kTile;
      if (k >= pend(p, ctx_max)) {
        p += Z;
        k = p * a.part;
      }
    };
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
      if (pp < n_used) {
        load_kv_tile<D>(ring + s * 2 * TS, ring + s * 2 * TS + TS, a, kh, pk, pend(pp, ctx_max), entry, tid);
        advance(pp, pk);
      }
      cp_commit();
    }
    cp_wait<NS - 1>();  // the q group
    __syncthreads();

    // This thread's rows g and g + 8 of each group: their contexts (0: padding), and each
    // group's largest context.
    int rctx[QG][2], gctx[QG];
#pragma unroll
    for (int q = 0; q < QG; ++q) {
      gctx[q] = 0;
      for (int j = q * TPG; j < min(q * TPG + TPG, n); ++j) gctx[q] = max(gctx[q], sctx[j]);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i, j = q * TPG + r / G;
        rctx[q][i] = r < GR && j < n ? sctx[j] : 0;
      }
    }
    const float sl2 = a.scale * kLog2e;
    float m[QG][2], l[QG][2], acc[QG][D / 8][4];
    auto reset = [&] {
#pragma unroll
      for (int q = 0; q < QG; ++q) {
        m[q][0] = m[q][1] = -INFINITY;
        l[q][0] = l[q][1] = 0.f;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) acc[q][j][0] = acc[q][j][1] = acc[q][j][2] = acc[q][j][3] = 0.f;
      }
    };
    reset();

    int cp = int(blockIdx.z), ck = cp * a.part;
    for (int it = 0; cp < n_used; ++it) {
      cp_wait<NS - 2>();
      __syncthreads();
      if (pp < n_used) {
        const int st = (it + NS - 1) % NS;
        load_kv_tile<D>(ring + st * 2 * TS, ring + st * 2 * TS + TS, a, kh, pk, pend(pp, ctx_max), entry, tid);
        advance(pp, pk);
      }
      cp_commit();
      const __nv_bfloat16* Kt = ring + (it % NS) * 2 * TS;
      const __nv_bfloat16* Vt = Kt + TS;
      const int kb = ck + warp * 16, mi = lane >> 3;
#pragma unroll
      for (int q = 0; q < QG; ++q) {
        if (kb >= pend(cp, gctx[q])) continue;  // no row of this group has keys here
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t qa[4], b[4];
          ldsm4(qa, Qs + (q * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
          ldsm4(b, Kt + (warp * 16 + (lane & 7) + (mi >> 1) * 8) * LD + kk * 16 + (mi & 1) * 8);
          mma16816(s[0], qa, b[0], b[1]);
          mma16816(s[1], qa, b[2], b[3]);
        }
        const int kend0 = pend(cp, rctx[q][0]), kend1 = pend(cp, rctx[q][1]);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kb + j * 8 + 2 * t4 + (e & 1);
            s[j][e] = key < (e < 2 ? kend0 : kend1) ? s[j][e] * sl2 : -INFINITY;
          }
        online_softmax_step(s, m[q], l[q], acc[q]);
        const uint32_t pa[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]),
                                pack_bf16(s[1][0], s[1][1]), pack_bf16(s[1][2], s[1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldsm4_t(b, Vt + (warp * 16 + (lane & 7) + (mi & 1) * 8) * LD + dp * 16 + (mi >> 1) * 8);
          mma16816(acc[q][2 * dp], pa, b[0], b[1]);
          mma16816(acc[q][2 * dp + 1], pa, b[2], b[3]);
        }
      }
      ck += kTile;
      if (ck < pend(cp, ctx_max)) continue;

      // Partition cp is complete: per group, the four warps merged in warp order (as in
      // attn_decode_tc_kernel), then each row with keys in it writes.
#pragma unroll
      for (int q = 0; q < QG; ++q) {
        merge_warps<D>(m[q], l[q], acc[q], wm, wl, sM, sL, red, 16, GR, warp, tid, g, t4);
        for (int e = tid; e < GR * D; e += kThreads) {
          const int r = e / D, d = e % D, j = q * TPG + r / G;
          if (j >= n) break;  // rows ascend with e: the group's remaining rows are padding
          const int used = min(a.n_splits, (sctx[j] + a.part - 1) / a.part);
          if (cp >= used) continue;  // the row's keys ended before this partition
          const float A = ((red[r * D + d] + red[(16 + r) * D + d]) + red[(32 + r) * D + d]) + red[(48 + r) * D + d];
          const int64_t tok = tok0 + j;
          const int h = kh * G + r % G;
          if (used == 1) {
            a.out[(tok * a.Hq + h) * D + d] = __float2bfloat16_rn(A / sL[r]);
            if (d == 0 && a.lse) a.lse[int64_t(h) * a.T + tok] = sM[r] * kLn2 + logf(sL[r]);
          } else {
            const int64_t row = ((tok - a.tok0) * a.Hq + h) * a.n_splits + cp;
            a.part_acc[row * D + d] = A;
            if (d == 0) {
              a.part_ml[row * 2] = sM[r] * kLn2;
              a.part_ml[row * 2 + 1] = sL[r];
            }
          }
        }
        __syncthreads();  // wm, sM, red are the next group's
      }
      reset();
      cp += Z;
      ck = cp * a.part;
    }
    cp_wait<0>();
  }
}

template <int D, int QG>
void launch_rows(Context& ctx, const DecArgs& a, dim3 grid, int64_t n_rows) {
  const size_t smem = RowsCfg<D, QG>::bytes;
  CUDA_CHECK(cudaFuncSetAttribute(attn_rows_tc_kernel<D, QG>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl(ctx, attn_rows_tc_kernel<D, QG>, grid, dim3(kThreads), smem, a, n_rows);
}
// Groups of 16 mma rows per block: two (their accumulators are 32 / 64 registers a thread
// per group at head dim 64 / 128). H200, the bitwise trainer's attention over 13,440 rows of
// Qwen2.5-0.5B (bench_bitwise attn): one token per block 0.861 ms; 1 / 2 / 4 groups 0.824 /
// 0.706 / 0.798 ms (4 groups: 225 registers, two blocks an SM). GRPO_DECODE_ROWS_QG = 1, 2
// or 4 (at most 2 at head dim 128) overrides it for A/B runs.
int rows_groups(int D) {
  static const int forced = int(env_long("GRPO_DECODE_ROWS_QG", 0, 1, 4));
  const int qg = forced == 1 || forced == 2 || forced == 4 ? forced : 2;
  return D == 128 ? std::min(qg, 2) : qg;
}
template <int D>
size_t rows_smem(int qg) {
  return qg == 4 ? RowsCfg<D, 4>::bytes : qg == 2 ? RowsCfg<D, 2>::bytes : RowsCfg<D, 1>::bytes;
}
template <int D>
void launch_rows_qg(Context& ctx, const DecArgs& a, dim3 grid, int64_t n_rows, int qg) {
  if constexpr (D == 64) {
    if (qg == 4) return launch_rows<D, 4>(ctx, a, grid, n_rows);
  }
  if (qg == 2) return launch_rows<D, 2>(ctx, a, grid, n_rows);
  launch_rows<D, 1>(ctx, a, grid, n_rows);
}

template <int D, int NS, bool F8>
void launch_decode(Context& ctx, const DecArgs& a, dim3 grid) {
  const size_t smem = DecCfg<D, NS, F8>::bytes(a.G);
  // Per launch (a host-side attribute, valid during graph capture): the size depends on G
  // and the current device may differ between calls.
  CUDA_CHECK(cudaFuncSetAttribute(attn_decode_tc_kernel<D, NS, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(smem)));
  launch_pdl(ctx, attn_decode_tc_kernel<D, NS, F8>, grid, dim3(kThreads), smem, a);
}
template <int D, bool F8>
void launch_decode_ns(Context& ctx, const DecArgs& a, dim3 grid, int ns) {
  if (ns == 5) launch_decode<D, 5, F8>(ctx, a, grid);
  else if (ns == 3) launch_decode<D, 3, F8>(ctx, a, grid);
  else launch_decode<D, 2, F8>(ctx, a, grid);
}

// Ring depth: the deepest of 5 (head dim 64), 3 and 2 stages with which two blocks still fit an
// SM. With 5 stages and 64-key tiles a block requests a whole 256-key partition at once: decode
// steps of the GRPO shape have about one block per SM slot, so the bytes in flight per block,
// not the number of blocks, decide the rate (ncu, Qwen2.5-0.5B at context 330: 3 stages ran
// at 17% of DRAM bandwidth with 10% achieved occupancy).
// The same rule for FP8 caches, with their smaller stages (head dim 64: 5 stages; 128: 3 for
// G <= 12, else 2).
constexpr size_t kTwoPerSm = 110u * 1024u;
int forced_stages() {  // GRPO_DECODE_STAGES: 2|3|5 (A/B runs), else 0
  static const int forced = [] {
    const int v = int(env_long("GRPO_DECODE_STAGES", 0, 2, 5));
    return v == 2 || v == 3 || v == 5 ? v : 0;
  }();
  return forced;
}
template <int D, bool F8>
int stages_for(int G) {
  if (const int forced = forced_stages()) return forced;
  if (D == 64 && DecCfg<D, 5, F8>::bytes(G) <= kTwoPerSm) return 5;
  return DecCfg<D, 3, F8>::bytes(G) <= kTwoPerSm ? 3 : 2;
}
template <int D, bool F8>
size_t decode_smem(int ns, int G) {
  return ns == 5 ? DecCfg<D, 5, F8>::bytes(G) : ns == 3 ? DecCfg<D, 3, F8>::bytes(G) : DecCfg<D, 2, F8>::bytes(G);
}

}  // namespace

bool attention_paged_decode_tc(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache,
                               const Tensor& v_cache, const PagedAttnMeta& meta, float* lse) {
  static const bool enabled = !env_off("GRPO_DECODE_TC");  // 0: the CUDA-core kernel (A/B measurements)
  if (!enabled || q.dtype != DType::bf16 || out.dtype != DType::bf16 || v_cache.dtype != k_cache.dtype) return false;
  const bool f8 = k_cache.dtype == DType::f8e4m3;  // FP8 E4M3 caches (kv_cache_dtype = fp8)
  if (!f8 && k_cache.dtype != DType::bf16) return false;
  const int D = int(q.shape[2]), Hq = int(q.shape[1]), Hkv = int(k_cache.shape[2]);
  // Groups of 4..16 query heads per kv head: the mma rows carry the group, so the scores of
  // the whole group cost one tensor-core product. For G < 4 the CUDA-core kernel (which takes
  // a key per thread) was as fast or faster on an H200 (Qwen3-0.6B, G = 2: 1.24 s against
  // 1.24–1.41 s for the GRPO-shape rollout over partition/stage settings), for G = 7
  // (Qwen2.5-0.5B) this kernel is ~5% faster (0.745–0.751 s against 0.788 s).
  // Batch-invariant contexts (the bitwise mode) take every group size: there the engine's decode
  // and the trainer's forward must run one kernel, and the trainer's rows pack 16 / G tokens
  // into the mma rows (attn_rows_tc_kernel), which makes small groups cheap for it.
  static const int min_g = int(env_long("GRPO_DECODE_MIN_G", 4, 1, 16));  // smallest group taken (A/B runs)
  const bool bi = ctx.batch_invariant();
  if ((D != 64 && D != 128) || Hkv <= 0 || Hq % Hkv != 0 || Hq / Hkv < (bi ? 1 : min_g) || Hq / Hkv > 16)
    return false;
  const int64_t T = q.shape[0];
  if (T == 0) return true;
  // Several rows of a sequence per block (bit for bit the same outputs) where rows come in runs:
  // batch-invariant launches of at least 4 rows per sequence on average (the trainer's forward,
  // prefill-heavy engine steps). In other modes prefill has its own tensor-core kernel.
  const int64_t n_seqs = std::max<int64_t>(meta.block_table.shape[0], 1);
  static const bool rows_on = !env_off("GRPO_DECODE_ROWS");  // 0: one token per block (A/B runs)
  const bool rows = rows_on && bi && !f8 && T >= 4 * n_seqs;
  DecArgs a{};
  a.q = q.ptr<__nv_bfloat16>();
  a.out = out.ptr<__nv_bfloat16>();
  if (f8) {
    a.k8 = k_cache.ptr<uint8_t>();
    a.v8 = v_cache.ptr<uint8_t>();
  } else {
    a.k = k_cache.ptr<__nv_bfloat16>();
    a.v = v_cache.ptr<__nv_bfloat16>();
  }
  a.token_seq = meta.token_seq.ptr<int32_t>();
  a.token_pos = meta.token_pos.ptr<int32_t>();
  a.block_table = meta.block_table.ptr<int32_t>();
  a.max_blocks = int(meta.block_table.shape[1]);
  a.block_size = int(k_cache.shape[1]);
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.G = Hq / Hkv;
  a.scale = 1.f / std::sqrt(float(D));
  a.lse = lse;
  a.T = T;
  static const int forced_part = [] {  // GRPO_DECODE_PART: a multiple of 64 (A/B runs), else 0
    const int v = int(env_long("GRPO_DECODE_PART", 0, kTile, 1 << 20));
    return v % kTile == 0 ? v : 0;
  }();
  // Batch-invariant contexts with GQA groups of at most 4: partitions of 1024 keys (the
  // partition is part of a row's arithmetic, so it depends only on the model's shape, which the
  // engine and the trainer share). Fewer, longer blocks there: H200, GRPO benchmark step in the
  // bitwise mode, 256 -> 1024: Qwen3-0.6B (G = 2) 1.834 -> 1.721 s, Llama-3.2-1B (G = 4) 1.854 ->
  // 1.793 s; Qwen2.5-0.5B (G = 7) 1.107 -> 1.146 s, so it keeps 256.
  a.part = forced_part ? forced_part : bi && a.G <= 4 ? kLongPart : kPart;
  a.n_splits = int(ceil_div(std::max(meta.max_context, 1), a.part));
  GRPO_CHECK_MSG(a.n_splits <= 65535, "attention_paged: max_context too large for the decode kernel");
  const int64_t chunk = a.n_splits > 1 ? alloc_partials(ctx, T, Hq, a.n_splits, D, &a.part_acc, &a.part_ml)
                                       : std::min<int64_t>(T, 0x7fffffff);
  int ns = D == 64 ? (f8 ? stages_for<64, true>(a.G) : stages_for<64, false>(a.G))
                   : (f8 ? stages_for<128, true>(a.G) : stages_for<128, false>(a.G));
  // Launches of many more blocks than resident slots (the bitwise mode's training forward runs
  // every row of a micro-batch through this kernel): the 2-deep ring, so more blocks share an
  // SM. The ring depth changes no bit. H200, 13,440 rows of Qwen2.5-0.5B: 0.87 ms against 1.15.
  if (forced_stages() == 0 && T * Hkv > int64_t(sm_count()) * 16) ns = 2;
  const int qg = rows_groups(D);
  const size_t smem = rows ? (D == 64 ? rows_smem<64>(qg) : rows_smem<128>(qg))
                      : D == 64 ? (f8 ? decode_smem<64, true>(ns, a.G) : decode_smem<64, false>(ns, a.G))
                                : (f8 ? decode_smem<128, true>(ns, a.G) : decode_smem<128, false>(ns, a.G));
  const int per_sm = std::max(1, std::min(4, int((228u * 1024u) / (smem + 1024u))));  // resident blocks per SM
  const int rows_per_block = rows ? qg * (16 / a.G) : 1;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    a.tok0 = t0;
    const int64_t n = std::min(chunk, T - t0);
    const int64_t blocks = ceil_div(n, int64_t(rows_per_block));
    // Blocks along z: about two waves of blocks, at most 4 partitions per block (any Z gives
    // the same results).
    const int64_t pairs = blocks * Hkv;
    static const int waves = int(env_long("GRPO_DECODE_WAVES", 2, 1, 16));
    const int64_t z =
        std::max<int64_t>(ceil_div(a.n_splits, 4), ceil_div(int64_t(sm_count()) * per_sm * waves, pairs));
    const dim3 grid(unsigned(blocks), unsigned(Hkv), unsigned(std::min<int64_t>(z, a.n_splits)));
    if (rows) {
      if (D == 64) launch_rows_qg<64>(ctx, a, grid, n, qg);
      else launch_rows_qg<128>(ctx, a, grid, n, qg);
    } else if (D == 64) {
      if (f8) launch_decode_ns<64, true>(ctx, a, grid, ns);
      else launch_decode_ns<64, false>(ctx, a, grid, ns);
    } else {
      if (f8) launch_decode_ns<128, true>(ctx, a, grid, ns);
      else launch_decode_ns<128, false>(ctx, a, grid, ns);
    }
    if (a.n_splits > 1)
      launch_paged_combine(ctx, DType::bf16, a.out, a.lse, a.part_acc, a.part_ml, a.token_pos, T, t0, n, Hq, a.n_splits, D,
                           a.part);
  }
  return true;
}

}  // namespace grpo::cuda
