// CUDA causal GQA attention forward, two CUDA-core kernels and the dispatch to the tensor-core ones:
//   attn_paged_kernel  the engine path (attention_paged: prefill, chunked prefill, decode) for what
//                      the tensor-core kernels do not take: attention_paged tries, in order, the
//                      prefill kernel over query tiles (attention_prefill_tc.cu; when the runner passed a
//                      tile list), the decode kernel for GQA groups of 4..16 (attention_decode.cu),
//                      then this one (f32, other head dims, groups < 4)
//   attn_split_kernel  the packed training path (attention_forward), and its fallback
// Both compute every query token by itself (no state shared between tokens), in a fixed
// order, with no atomics: a token's output does not depend on which other tokens share
// the launch, and decode rows equal the prefill rows of the same tokens bit for bit.
// The two kernels round differently, so paged and packed outputs agree to bf16/f32
// tolerance, not bitwise.
//
// Paged kernel layout (attn_paged_kernel<T, CT, D, MG>; T: q and out, CT: the cache
// elements, T or e4m3_t for an FP8 cache, whose elements are read as their exact values):
//   grid (tokens, Hkv·n_hgroups, Z), 128 threads. A block takes one query token, up to
//   MG query heads of one GQA group (K/V are read once for all of them) and partitions
//   z, z+Z, ... of KP consecutive key positions each (KP by the cache dtype and head dim,
//   paged_part_of: bf16 128, or 64 for D = 128; f32 64; fp8 128 — the
//   same for every call, so partition boundaries never depend on the batch; n_splits =
//   ceil(max_context / KP) partitions, Z <= n_splits blocks chosen to fill the GPU, so
//   the empty partitions of a CUDA-graph replay's large max_context cost little). Keys
//   past the token's context are not visited. The last partition (n_splits-1) also takes
//   every key past n_splits·KP, in further KP-key tiles merged by online softmax, so an
//   underestimated max_context stays correct. Shared memory (dynamic): the K and V
//   tiles (KP rows × D, 16-byte chunks rotated by row to spread banks), q (MG × D f32),
//   scores (MG × KP f32), the KP cache rows, and per-head running max / sum / rescale
//   factor. Per KP-key tile:
//   0. threads look up the block table once per key (row index → shared), then issue
//      cp.async for the whole K tile (one group) and the whole V tile (a second group);
//   1. scores: 128/KP threads per key (1 or 2) read the K row from shared
//      memory and take the MG dot products against q (broadcast reads of shared q), so
//      no shuffles per key; scaled scores → shared;
//   2. softmax statistics: a warp per head: tile max (butterfly), p = exp(s − m) written
//      back over the scores, running sum and rescale factor for (l, acc);
//   3. out partial: thread = (piece of 4 or 8 elements of d, key subset); each subset walks
//      its keys KG = 4 at a time (one float4 of p per head; V rows past the context are
//      zero-filled), accumulating MG heads in registers.
//   At the end the key subsets reduce: xor butterfly inside the warp, then the warps in
//   warp order through shared memory (over the K tile). A token whose context fits one
//   partition writes out = acc / l directly; otherwise every used partition writes
//   (acc, m, l) partials and attn_paged_combine_kernel merges the token's
//   ceil(ctx / KP) partitions in partition order (launched with programmatic dependent
//   launch so its start overlaps the split kernel's tail; it returns at once for tokens
//   of one partition). Partitions past a token's context are never read, so the result
//   is the same for any n_splits ≥ the token's partition count.
//
// Packed kernel layout (attn_split_kernel):
//   grid (tokens, Hkv·n_hgroups, n_splits), 128 threads. A block takes one query token,
//   up to kMaxG query heads sharing one kv head (GQA: K/V are read once for all of them),
//   and one partition of kPart consecutive key positions. Each key is handled by TPK
//   lanes (D/8 for bf16, D/4 for f32, rounded up to a power of two; head dims 16, 32, 48,
//   64, 96, 128) holding 16 bytes of it each; every lane group keeps its own online
//   softmax state (m, l, acc) per head; states merge across lanes by a fixed xor
//   butterfly, across warps in warp order, across partitions in partition order.
//   The last partition also takes any keys past n_splits·kPart, so an underestimated
//   max_context stays correct.
// Sliding window (window W > 0): a query at position p takes keys max(0, p-W+1) .. p. Both
// kernels keep their partition boundaries and start each partition at that bound:
// partitions wholly below it load nothing and leave a neutral partial (m = −inf, l = 0)
// that the combine weighs by zero, so the merge order is unchanged. The tensor-core
// kernels have no window: attention_paged / attention_forward skip them when W > 0.
// kv_cache_write copies token rows into their slots (slot < 0: padding, skipped); into an
// FP8 cache it converts them to E4M3 (RN, satfinite) on the way.
#include "kernels/attention.h"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/validate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

namespace grpo::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxG = 8;     // most query heads per block (MG: 2 or 8 by the GQA group size)
constexpr int kPart = 256;   // key positions per partition (64 measured slower for B=64 decode)
constexpr int kUnroll = 4;   // keys in flight per lane group (~233 regs bf16, no spills)

struct AttnArgs {
  const void* q;          // (T,Hq,D)
  void* out;              // (T,Hq,D)
  float* lse;             // (Hq,T) or null
  float* part_acc;        // (chunk,Hq,n_splits,D) when n_splits > 1
  float* part_ml;         // (chunk,Hq,n_splits,2)
  const void* k;          // paged: (n_blocks,bs,Hkv,D); packed: (T,Hkv,D)
  const void* v;
  const int32_t* token_seq;    // paged
  const int32_t* token_pos;    // paged
  const int32_t* block_table;  // paged (S,max_blocks)
  const int32_t* cu_seqlens;   // packed (S+1)
  int n_seqs, max_blocks, block_size;
  int64_t T;              // total query tokens (lse row stride)
  int64_t tok0;           // first token of this launch
  int Hq, Hkv, G, n_hgroups, n_splits;
  int window;             // sliding window W (0: full causal)
  float scale;
};

// First key position of a query at position pos (0-based) under sliding window W.
__device__ __forceinline__ int64_t window_start(int64_t pos, int window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

__device__ __forceinline__ float rescale(float m, float mn) { return m == -INFINITY ? 0.f : expf(m - mn); }

// out[d] (and *lse) from the n partials starting at partial row r0, merged in partition order:
// the one merge both combine kernels use.
template <class T>
__device__ __forceinline__ void merge_partials(T* out, float* lse, const float* part_acc, const float* part_ml,
                                               int64_t r0, int n, int D) {
  float M = -INFINITY;
  for (int s = 0; s < n; ++s) M = fmaxf(M, part_ml[(r0 + s) * 2]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.f, A = 0.f;
    for (int s = 0; s < n; ++s) {
      const float sc = rescale(part_ml[(r0 + s) * 2], M);
      L += part_ml[(r0 + s) * 2 + 1] * sc;
      A += part_acc[(r0 + s) * D + d] * sc;
    }
    out[d] = from_f32<T>(A / L);
    if (d == 0 && lse) *lse = M + logf(L);
  }
}

constexpr int pow2ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

template <class T, int D, int MG>
__global__ void __launch_bounds__(kThreads) attn_split_kernel(AttnArgs a) {
  constexpr int VEC = Vec16<T>::n;
  constexpr int NV = D / VEC;            // 16-byte vectors per key row
  constexpr int TPK = pow2ceil(NV);      // lanes per key (lanes dpart >= NV hold zeros)
  static_assert(D % VEC == 0, "head dim must be a multiple of the vector width");
  constexpr int KPW = 32 / TPK;    // keys per warp
  constexpr int KPB = kWarps * KPW;
  static_assert(TPK >= 1 && TPK <= 32 && (TPK & (TPK - 1)) == 0, "unsupported head dim");
  __shared__ float sm_m[kWarps][MG], sm_l[kWarps][MG];
  __shared__ float sm_acc[kWarps][MG][D];

  const int64_t tok = a.tok0 + blockIdx.x;
  const int kh = blockIdx.y / a.n_hgroups;
  const int qh0 = kh * a.G + (blockIdx.y % a.n_hgroups) * MG;
  const int ng = min(MG, kh * a.G + a.G - qh0);
  const int split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int dpart = lane % TPK;

  int lo = 0, hi = a.n_seqs - 1;  // last s with cu[s] <= tok
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (a.cu_seqlens[mid] <= tok) lo = mid; else hi = mid - 1;
  }
  const int64_t row0 = a.cu_seqlens[lo];
  const int64_t ctx_len = tok - row0 + 1;
  const int64_t kbeg = max(int64_t(split) * kPart, window_start(ctx_len - 1, a.window));
  const int64_t kend = split == a.n_splits - 1 ? ctx_len : min(ctx_len, int64_t(split) * kPart + kPart);
  const int64_t prow = (int64_t(blockIdx.x) * a.Hq + qh0) * a.n_splits + split;  // partial row of head qh0

  if (kbeg >= kend) {  // empty partition (only when n_splits > 1): neutral partial
    for (int e = threadIdx.x; e < ng * D; e += kThreads)
      a.part_acc[(prow + int64_t(e / D) * a.n_splits) * D + e % D] = 0.f;
    if (threadIdx.x < ng) {
      a.part_ml[(prow + int64_t(threadIdx.x) * a.n_splits) * 2] = -INFINITY;
      a.part_ml[(prow + int64_t(threadIdx.x) * a.n_splits) * 2 + 1] = 0.f;
    }
    return;
  }

  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  float qv[MG][VEC];
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    if (g < ng && dpart < NV) {
      load_vec(q + ((tok * a.Hq) + qh0 + g) * D + dpart * VEC, qv[g]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = 0.f;
    }
  }
  float m[MG], l[MG], acc[MG][VEC];
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  const int kslot = warp * KPW + lane / TPK;
  for (int64_t base = kbeg; base < kend; base += KPB * kUnroll) {
    float kf[kUnroll][VEC], vf[kUnroll][VEC];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * KPB + kslot;
      valid[u] = p < kend;
      if (valid[u] && dpart < NV) {
        const int64_t row = (row0 + p) * a.Hkv + kh;
        load_vec(kc + row * D + dpart * VEC, kf[u]);
        load_vec(vc + row * D + dpart * VEC, vf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) kf[u][i] = vf[u][i] = 0.f;
      }
    }
    // Per head: the kUnroll scores of this batch, one rescale of (l, acc) per batch.
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      float sc[kUnroll];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += qv[g][i] * kf[u][i];
#pragma unroll
        for (int o = TPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        sc[u] = valid[u] ? s * a.scale : -INFINITY;
        mx = fmaxf(mx, sc[u]);
      }
      if (mx != -INFINITY) {  // some key seen by this lane group
        const float corr = rescale(m[g], mx);
        float lsum = l[g] * corr;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] *= corr;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float pe = valid[u] ? expf(sc[u] - mx) : 0.f;
          lsum += pe;
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[g][i] += pe * vf[u][i];
        }
        l[g] = lsum;
        m[g] = mx;
      }
    }
  }

  // Merge the KPW lane groups of the warp (xor butterfly over the key-slot bits).
#pragma unroll
  for (int o = TPK; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo_ = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mn = fmaxf(m[g], mo);
      const float sa = rescale(m[g], mn), sb = rescale(mo, mn);
      l[g] = l[g] * sa + lo_ * sb;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * sa + ao * sb;
      }
      m[g] = mn;
    }
  }
  if (lane < TPK) {
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      if (dpart < NV) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) sm_acc[warp][g][dpart * VEC + i] = acc[g][i];
      }
      if (lane == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  for (int e = threadIdx.x; e < ng * D; e += kThreads) {
    const int g = e / D, d = e % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, A = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float sc = rescale(sm_m[w][g], M);
      L += sm_l[w][g] * sc;
      A += sm_acc[w][g][d] * sc;
    }
    if (a.n_splits == 1) {
      out[(tok * a.Hq + qh0 + g) * D + d] = from_f32<T>(A / L);
      if (d == 0 && a.lse) a.lse[int64_t(qh0 + g) * a.T + tok] = M + logf(L);
    } else {
      const int64_t r = prow + int64_t(g) * a.n_splits;
      a.part_acc[r * D + d] = A;
      if (d == 0) {
        a.part_ml[r * 2] = M;
        a.part_ml[r * 2 + 1] = L;
      }
    }
  }
}

// ---- paged kernel (attention_paged) ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// 16-byte global → shared copy; src_bytes 0 writes zeros (src is not read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Loads N consecutive elements (N·sizeof(T) = 16 or 8 bytes, aligned) as f32.
template <int N>
__device__ __forceinline__ void load_piece(const float* p, float* f) {
  if constexpr (N == 4) {
    load_vec(p, f);
  } else {
    static_assert(N == 2, "piece of 8 or 16 bytes");
    const float2 v = *reinterpret_cast<const float2*>(p);
    f[0] = v.x;
    f[1] = v.y;
  }
}
template <int N>
__device__ __forceinline__ void load_piece(const __nv_bfloat16* p, float* f) {
  if constexpr (N == 8) {
    load_vec(p, f);
  } else {
    static_assert(N == 4, "piece of 8 or 16 bytes");
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    f[0] = __uint_as_float(v.x << 16);
    f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16);
    f[3] = __uint_as_float(v.y & 0xffff0000u);
  }
}

// FP8 E4M3 cache elements (kv_cache_dtype = fp8) as f32, exact: 8 or 4 bytes (aligned).
template <int N>
__device__ __forceinline__ void load_piece(const e4m3_t* p, float* f) {
  if constexpr (N == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    e4m3x4_to_f32(v.x, f);
    e4m3x4_to_f32(v.y, f + 4);
  } else {
    static_assert(N == 4, "piece of 8 or 4 bytes");
    e4m3x4_to_f32(*reinterpret_cast<const uint32_t*>(p), f);
  }
}

// Key positions per partition of the paged kernel: fixed per cache dtype and head dim (never
// by batch). 64 for bf16 with D = 128: half the shared memory per block, so more blocks per
// SM keep more K/V loads in flight (Qwen3's 8 kv heads × 128 make decode KV-bound). FP8
// caches: 128 for every head dim (one key per thread in phase 1, the most this block
// shape takes); for D = 128 that is the same 16 KB K tile as bf16's 64 keys, so the six
// blocks per SM keep as many bytes in flight, each byte now one key element.
constexpr int paged_part_of(int elem_bytes, int D) {
  return elem_bytes == 2 ? (D >= 128 ? 64 : 128) : elem_bytes == 1 ? 128 : 64;
}
template <class CT, int D>
constexpr int paged_part() { return paged_part_of(int(sizeof(CT)), D); }

// CT: the cache element type (float, bf16, or e4m3_t for an FP8 cache); q and out may differ.
template <class CT, int D, int MG>
struct PagedCfg {
  static constexpr int VEC = Vec16<CT>::n;    // cache elements per 16-byte chunk
  static constexpr int NV = D / VEC;          // 16-byte chunks per K/V row
  static constexpr int KP = paged_part<CT, D>();  // keys per partition (= per shared tile)
  static constexpr int TK = kThreads / KP;    // phase 1: threads per key
  // Phase 3 works on pieces of VP elements: at most 8 (16 bytes of bf16 or f32, 8 of fp8),
  // halved when MG·VP is large, to keep the MG·VP accumulators and the KG·VP loaded values
  // few: NP pieces per row, NPP lanes per key subset.
  static constexpr int VE = VEC < 8 ? VEC : 8;
  static constexpr int VP = MG * VE > 32 ? VE / 2 : VE;
  static constexpr int NP = D / VP;
  static constexpr int NPP = pow2ceil(NP);    // lanes c >= NP idle
  static constexpr int SPW = 32 / NPP;        // key subsets per warp
  static constexpr int NSUB = kWarps * SPW;   // key subsets per block
  static constexpr int KG = 4;                // phase 3: keys per step (one float4 of p)
  static constexpr size_t kv_bytes = size_t(KP) * D * sizeof(CT);
  static constexpr size_t off_k = 0;
  static constexpr size_t off_v = off_k + kv_bytes;
  static constexpr size_t off_q = off_v + kv_bytes;                       // MG × D f32
  static constexpr size_t off_s = off_q + size_t(MG) * D * 4;             // MG × KP f32
  static constexpr size_t off_row = off_s + size_t(MG) * KP * 4;          // KP i32
  static constexpr size_t off_stat = off_row + size_t(KP) * 4;            // m, l, corr: 3 × MG f32
  static constexpr size_t bytes = off_stat + size_t(3) * MG * 4;
  static_assert(D % VEC == 0 && NV % TK == 0, "unsupported head dim");
  static_assert(TK * KP == kThreads && (TK == 1 || TK == 2), "partition length must match the block");
  static_assert(NPP <= 32 && VP % 2 == 0 && KP % 32 == 0 && KP % KG == 0, "unsupported head dim");
  static_assert(size_t(kWarps) * MG * D * 4 <= kv_bytes, "warp partials must fit over the K tile");
  // Shared position of chunk c of tile row r: rotated by row so that the rows read by
  // 8 consecutive threads (phase 1) and the chunks of one row (phase 3) spread banks.
  // Unsigned (c, r >= 0): a mask for power-of-two NV, no sign fix-ups.
  __device__ static __forceinline__ int swz(int c, int r) { return int((unsigned(c) + unsigned(r) * TK) % unsigned(NV)); }
  // Tile copies: when NV divides the block, thread t always copies chunk t % NV, of rows
  // t / NV + i·kThreads / NV, so the per-thread parts of the addresses are computed once per
  // tile and a row costs a shared-memory read of its cache row and a multiply-add (the
  // generic loop spent ~25 instructions per 16-byte copy on signed division and 64-bit
  // index math; H200, Qwen3 decode B = 64: fp8 −5% (ctx 640) / −8% (2048), bf16 −4% / 0%).
  static constexpr bool kRowSteps = kThreads % NV == 0;
};

// Two heads per block (GQA groups <= 2, e.g. Qwen3-0.6B): at most 80 registers so that six
// blocks (their 34 KB of shared memory each) fit an SM and keep more K/V tiles in flight:
// Qwen3 heads, B = 64, context 640: 62.7 → 58.9 µs per layer on an H200 (64% → 67% of copy
// bandwidth); nano-vllm workload 7.08 → 6.92 s.
// T: q and out; CT: the cache elements (T, or e4m3_t for an FP8 cache).
template <class T, class CT, int D, int MG>
__global__ void __launch_bounds__(kThreads, MG == 2 ? 6 : 4) attn_paged_kernel(AttnArgs a) {
  using C = PagedCfg<CT, D, MG>;
  constexpr int VEC = C::VEC, NV = C::NV, KP = C::KP, TK = C::TK, VP = C::VP, NP = C::NP, NPP = C::NPP,
                SPW = C::SPW, NSUB = C::NSUB, KG = C::KG;
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* sK = reinterpret_cast<uint4*>(smem + C::off_k);
  uint4* sV = reinterpret_cast<uint4*>(smem + C::off_v);
  float* sq = reinterpret_cast<float*>(smem + C::off_q);
  float* ss = reinterpret_cast<float*>(smem + C::off_s);
  int* srow = reinterpret_cast<int*>(smem + C::off_row);
  float* s_m = reinterpret_cast<float*>(smem + C::off_stat);
  float* s_l = s_m + MG;
  float* s_c = s_l + MG;

  pdl_trigger();  // the combine grid may be scheduled once every block has started
  pdl_wait();     // launched with launch_pdl: q and the newest K/V come from the previous kernel
  const int64_t tok = a.tok0 + blockIdx.x;
  const int kh = blockIdx.y / a.n_hgroups;
  const int qh0 = kh * a.G + (blockIdx.y % a.n_hgroups) * MG;
  const int ng = min(MG, kh * a.G + a.G - qh0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const int ctx_len = a.token_pos[tok] + 1;
  const int32_t seq = a.token_seq[tok];
  if (int(blockIdx.z) * KP >= ctx_len) return;  // partitions past this token's context: never read
  const int n_used = min(a.n_splits, (ctx_len + KP - 1) / KP);  // partitions holding this token's keys
  const int32_t* table = a.block_table + int64_t(seq) * a.max_blocks;
  const CT* kc = static_cast<const CT*>(a.k);
  const CT* vc = static_cast<const CT*>(a.v);

  {  // q of the ng heads (contiguous in (T,Hq,D)) → shared f32
    constexpr int QV = Vec16<T>::n, NQ = D / QV;
    const T* q = static_cast<const T*>(a.q) + (tok * a.Hq + qh0) * D;
    for (int e = tid; e < ng * NQ; e += kThreads) {
      float f[QV];
      load_vec(q + e * QV, f);
#pragma unroll
      for (int i = 0; i < QV; i += 4)
        *reinterpret_cast<float4*>(sq + e * QV + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
    }
  }
  const int pc = lane % NPP;                 // phase 3: piece of d (elements pc·VP ..)
  const int pj = warp * SPW + lane / NPP;    // phase 3: key subset
  // Piece pc of a V row lies in chunk pc·VP / VEC, at element offset pc·VP % VEC.
  const int pchunk = pc * VP / VEC, poff = pc * VP % VEC;

  // Partitions z, z + Z, ... (Z = gridDim.z <= n_splits): each computed the same way
  // whichever block takes it.
  for (int split = blockIdx.z; split < a.n_splits; split += gridDim.z) {
    if (split * KP >= ctx_len) break;
    // Keys below the window start are skipped; a partition wholly below it runs no
    // tile and writes the neutral partial (acc 0, m −inf, l 0).
    const int kbeg = max(split * KP, int(window_start(ctx_len - 1, a.window)));
    const int kend = split == a.n_splits - 1 ? ctx_len : min(ctx_len, split * KP + KP);
    if (split != int(blockIdx.z)) __syncthreads();  // the previous partition's outputs are read
    if (tid < MG) {
      s_m[tid] = -INFINITY;
      s_l[tid] = 0.f;
    }
    float acc[MG][VP];
#pragma unroll
    for (int g = 0; g < MG; ++g)
#pragma unroll
      for (int i = 0; i < VP; ++i) acc[g][i] = 0.f;

    for (int kb = kbeg; kb < kend; kb += KP) {  // one tile, except in an overfull last partition
      const int nk = min(KP, kend - kb);
      const int nkg = (nk + KG - 1) / KG * KG;  // V rows nk..nkg are zero-filled
      if (kb != kbeg) __syncthreads();          // the previous tile is consumed
      if (tid < nk) {
        const int p = kb + tid;
        srow[tid] = table[p / a.block_size] * a.block_size + p % a.block_size;
      }
      __syncthreads();
      if constexpr (C::kRowSteps) {
        constexpr int RS = kThreads / NV;  // rows between a thread's copies
        const int c = tid % NV, row_elems = a.Hkv * D;
        const CT* kt = kc + kh * D + c * VEC;  // + srow · row_elems: chunk c of the row's kv head
        const CT* vt = vc + kh * D + c * VEC;
        for (int r = tid / NV; r < nk; r += RS)
          cp_async_16(sK + r * NV + C::swz(c, r), kt + int64_t(srow[r]) * row_elems, 16);
        cp_async_commit();
        for (int r = tid / NV; r < nkg; r += RS) {
          const bool ok = r < nk;
          cp_async_16(sV + r * NV + C::swz(c, r), ok ? vt + int64_t(srow[r]) * row_elems : vc, ok ? 16 : 0);
        }
        cp_async_commit();
      } else {
        for (int e = tid; e < nk * NV; e += kThreads) {
          const int r = e / NV, c = e % NV;
          cp_async_16(sK + r * NV + C::swz(c, r), kc + (int64_t(srow[r]) * a.Hkv + kh) * D + c * VEC, 16);
        }
        cp_async_commit();
        for (int e = tid; e < nkg * NV; e += kThreads) {
          const int r = e / NV, c = e % NV;
          const bool ok = r < nk;
          const CT* src = ok ? vc + (int64_t(srow[r]) * a.Hkv + kh) * D + c * VEC : vc;
          cp_async_16(sV + r * NV + C::swz(c, r), src, ok ? 16 : 0);
        }
        cp_async_commit();
      }
      cp_async_wait<1>();  // K tile (this thread's copies)
      __syncthreads();

      // Phase 1: scores of key `key` for the ng heads.
      {
        const int key = tid / TK, part = tid % TK;
        float s[MG];
#pragma unroll
        for (int g = 0; g < MG; ++g) s[g] = 0.f;
        if (key < nk) {
          const CT* krow = reinterpret_cast<const CT*>(sK + key * NV);
#pragma unroll 2
          for (int cc = 0; cc < NV / TK; ++cc) {
            const int c = cc * TK + part;
            float kf[VEC];
            load_vec(krow + C::swz(c, key) * VEC, kf);
#pragma unroll
            for (int g = 0; g < MG; ++g) {
              if (g >= ng) break;
              const float* qp = sq + g * D + c * VEC;
              float d = 0.f;
#pragma unroll
              for (int i = 0; i < VEC; i += 4) {
                const float4 q4 = *reinterpret_cast<const float4*>(qp + i);
                d = fmaf(q4.x, kf[i], d);
                d = fmaf(q4.y, kf[i + 1], d);
                d = fmaf(q4.z, kf[i + 2], d);
                d = fmaf(q4.w, kf[i + 3], d);
              }
              s[g] += d;
            }
          }
        }
        if constexpr (TK == 2) {
#pragma unroll
          for (int g = 0; g < MG; ++g) {
            if (g >= ng) break;
            s[g] += __shfl_xor_sync(0xffffffffu, s[g], 1);
          }
        }
        if (part == 0 && key < nk) {
#pragma unroll
          for (int g = 0; g < MG; ++g) {
            if (g >= ng) break;
            ss[g * KP + key] = s[g] * a.scale;
          }
        }
      }
      __syncthreads();

      // Phase 2: a warp per head: tile max, p = exp(s − m) over the scores, running (m, l).
      for (int g = warp; g < ng; g += kWarps) {
        float v[KP / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < KP / 32; ++i) {
          const int k = lane + 32 * i;
          v[i] = k < nk ? ss[g * KP + k] : -INFINITY;
          mx = fmaxf(mx, v[i]);
        }
        mx = warp_max(mx);
        const float m_old = s_m[g];
        const float mn = fmaxf(m_old, mx);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < KP / 32; ++i) {
          const int k = lane + 32 * i;
          const float p = (k < nk && mn != -INFINITY) ? expf(v[i] - mn) : 0.f;
          ss[g * KP + k] = p;
          sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
          const float corr = rescale(m_old, mn);
          s_c[g] = corr;
          s_l[g] = s_l[g] * corr + sum;
          s_m[g] = mn;
        }
      }
      cp_async_wait<0>();  // V tile
      __syncthreads();

      // Phase 3: acc = acc·corr + Σ p·V over this thread's keys (KG at a time, in order).
#pragma unroll
      for (int g = 0; g < MG; ++g) {
        if (g >= ng) break;
        const float corr = s_c[g];
#pragma unroll
        for (int i = 0; i < VP; ++i) acc[g][i] *= corr;
      }
      if (pc < NP) {
        for (int k0 = pj * KG; k0 < nk; k0 += NSUB * KG) {
          float vf[KG][VP];
#pragma unroll
          for (int u = 0; u < KG; ++u)
            load_piece<VP>(reinterpret_cast<const CT*>(sV + (k0 + u) * NV + C::swz(pchunk, k0 + u)) + poff, vf[u]);
#pragma unroll
          for (int g = 0; g < MG; ++g) {
            if (g >= ng) break;
            const float4 p = *reinterpret_cast<const float4*>(ss + g * KP + k0);
#pragma unroll
            for (int i = 0; i < VP; ++i) {
              float x = acc[g][i];
              x = fmaf(p.x, vf[0][i], x);
              x = fmaf(p.y, vf[1][i], x);
              x = fmaf(p.z, vf[2][i], x);
              x = fmaf(p.w, vf[3][i], x);
              acc[g][i] = x;
            }
          }
        }
      }
    }

    // Key subsets → one sum per (head, d): xor butterfly over the subset bits of the lane,
    // then the warps in warp order through shared memory (over the K tile, now unused).
#pragma unroll
    for (int o = NPP; o < 32; o <<= 1) {
#pragma unroll
      for (int g = 0; g < MG; ++g) {
        if (g >= ng) break;
#pragma unroll
        for (int i = 0; i < VP; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
      }
    }
    float* sred = reinterpret_cast<float*>(smem + C::off_k);  // kWarps × MG × D
    if (lane < NP) {
#pragma unroll
      for (int g = 0; g < MG; ++g) {
        if (g >= ng) break;
#pragma unroll
        for (int i = 0; i < VP; i += 2)
          *reinterpret_cast<float2*>(sred + (warp * MG + g) * D + lane * VP + i) =
              make_float2(acc[g][i], acc[g][i + 1]);
      }
    }
    __syncthreads();
    T* out = static_cast<T*>(a.out);
    const int64_t prow = (int64_t(blockIdx.x) * a.Hq + qh0) * a.n_splits + split;  // partial row of head qh0
    for (int e = tid; e < ng * D; e += kThreads) {
      const int g = e / D, d = e % D;
      float A = sred[g * D + d];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) A += sred[(w * MG + g) * D + d];
      const float M = s_m[g], L = s_l[g];
      if (n_used == 1) {
        out[(tok * a.Hq + qh0 + g) * D + d] = from_f32<T>(A / L);
        if (d == 0 && a.lse) a.lse[int64_t(qh0 + g) * a.T + tok] = M + logf(L);
      } else {
        const int64_t r = prow + int64_t(g) * a.n_splits;
        a.part_acc[r * D + d] = A;
        if (d == 0) {
          a.part_ml[r * 2] = M;
          a.part_ml[r * 2 + 1] = L;
        }
      }
    }
  }  // partitions
}

// Merges the used partitions of each (token, head) of the paged kernel in partition
// order: grid (chunk, Hq), D threads. Tokens of one partition were written directly.
template <class T>
__global__ void attn_paged_combine_kernel(T* __restrict__ out, float* __restrict__ lse,
                                          const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                          const int32_t* __restrict__ token_pos, int64_t T_, int64_t tok0, int Hq,
                                          int n_splits, int D, int KP) {
  pdl_trigger();
  const int64_t tl = blockIdx.x, h = blockIdx.y, tok = tok0 + tl;
  const int ctx_len = token_pos[tok] + 1;  // written before the split kernel: no wait needed
  const int n_used = min(n_splits, (ctx_len + KP - 1) / KP);
  // Every block waits for the split grid (its partials, and so that this grid never
  // completes before it: later kernels on the stream wait for this one only).
  pdl_wait();
  if (n_used <= 1) return;
  merge_partials(out + (tok * Hq + h) * D, lse ? lse + h * T_ + tok : nullptr, part_acc, part_ml,
                 (tl * Hq + h) * n_splits, n_used, D);
}

// Merges the partitions of each (token, head) in partition order: grid (chunk, Hq), D threads.
template <class T>
__global__ void attn_combine_kernel(T* __restrict__ out, float* __restrict__ lse, const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml, int64_t T_, int64_t tok0, int Hq, int n_splits,
                                    int D) {
  const int64_t tl = blockIdx.x, h = blockIdx.y;
  merge_partials(out + ((tok0 + tl) * Hq + h) * D, lse ? lse + h * T_ + tok0 + tl : nullptr, part_acc, part_ml,
                 (tl * Hq + h) * n_splits, n_splits, D);
}


template <class T, class CT, int D, int MG>
void launch_paged_g(Context& ctx, const AttnArgs& a, dim3 grid) {
  constexpr size_t smem = PagedCfg<CT, D, MG>::bytes;
  if constexpr (smem > 48u * 1024u) {  // opt in once per device
    static std::atomic<uint64_t> set_on{0};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (bit == 0 || (set_on.load(std::memory_order_relaxed) & bit) == 0) {
      CUDA_CHECK(cudaFuncSetAttribute(attn_paged_kernel<T, CT, D, MG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem)));
      set_on.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  launch_pdl(ctx, attn_paged_kernel<T, CT, D, MG>, grid, dim3(kThreads), smem, a);
}

// CT: the element type of k/v (the paged caches, or the packed rows, which are always T).
template <class T, class CT, int D, int MG>
void launch_split_g(Context& ctx, const AttnArgs& a, dim3 grid, bool paged) {
  if (paged) {
    launch_paged_g<T, CT, D, MG>(ctx, a, grid);
  } else {
    if constexpr (std::is_same_v<T, CT>) attn_split_kernel<T, D, MG><<<grid, kThreads, 0, stream_of(ctx)>>>(a);
    else GRPO_CHECK_MSG(false, "attention_forward (cuda): k and v must have q's dtype");
  }
}

// Heads per block by the GQA group size: fewer register-resident heads when G is small.
// The per-head arithmetic is the same for every MG, so results do not depend on it.
inline int heads_per_block(int G) { return G <= 2 ? 2 : kMaxG; }  // two variants: compile time

// Blocks along z for the paged kernel: enough to fill the GPU (about 4 blocks per SM)
// and at most 4 partitions per block (2 for FP8 caches: their blocks spend twice the
// instructions per byte, and shorter blocks measured 3-10% faster on Qwen3 decode shapes,
// H200, B = 64, contexts 640/2048); never more than n_splits. Any value gives the same
// results (a partition is computed the same way whichever block takes it).
// GRPO_PAGED_PER_SM / GRPO_PAGED_MAX_PARTS override the 4 and 4 (2) (A/B runs).
inline int paged_z(int64_t n_tok, const AttnArgs& a, bool fp8) {
  static const int64_t per_sm = env_long("GRPO_PAGED_PER_SM", 4, 1, 64);
  static const int64_t max_parts_env = env_long("GRPO_PAGED_MAX_PARTS", 0, 1, 1 << 16);  // 0: by cache dtype
  const int64_t max_parts = max_parts_env > 0 ? max_parts_env : fp8 ? 2 : 4;
  const int64_t sms = sm_count();
  const int64_t pairs = n_tok * a.Hkv * a.n_hgroups;
  const int64_t z = std::max(ceil_div(a.n_splits, max_parts), ceil_div(sms * per_sm, pairs));
  return int(std::min<int64_t>(z, a.n_splits));
}

template <class T, class CT, int D>
void launch_split(Context& ctx, AttnArgs a, int64_t n_tok, bool paged) {
  dim3 grid(unsigned(n_tok), unsigned(a.Hkv * a.n_hgroups),
            unsigned(paged ? paged_z(n_tok, a, sizeof(CT) == 1) : a.n_splits));
  switch (heads_per_block(a.G)) {
    case 2: launch_split_g<T, CT, D, 2>(ctx, a, grid, paged); break;
    default: launch_split_g<T, CT, D, kMaxG>(ctx, a, grid, paged); break;
  }
  CUDA_CHECK_LAUNCH();
  if (a.n_splits > 1 && paged) {
    launch_paged_combine(ctx, std::is_same_v<T, float> ? DType::f32 : DType::bf16, a.out, a.lse, a.part_acc, a.part_ml,
                         a.token_pos, a.T, a.tok0, n_tok, a.Hq, a.n_splits, D, paged_part<CT, D>());
  } else if (a.n_splits > 1) {
    attn_combine_kernel<T><<<dim3(unsigned(n_tok), unsigned(a.Hq)), D, 0, stream_of(ctx)>>>(
        static_cast<T*>(a.out), a.lse, a.part_acc, a.part_ml, a.T, a.tok0, a.Hq, a.n_splits, D);
    CUDA_CHECK_LAUNCH();
  }
}

// The head-dim switch of run_split for q/out T and k/v elements CT (FP8 caches: D % 16 == 0,
// checked by the caller; the other head dims are never instantiated for them).
template <class T, class CT>
void launch_split_d(Context& ctx, const AttnArgs& a, int64_t n, int D, bool paged) {
  constexpr bool fp8 = sizeof(CT) == 1;
  switch (D) {
    case 8:  // llama2.c stories260K
      if constexpr (!fp8) launch_split<T, CT, 8>(ctx, a, n, paged);
      break;
    case 16: launch_split<T, CT, 16>(ctx, a, n, paged); break;
    case 32: launch_split<T, CT, 32>(ctx, a, n, paged); break;
    case 48: launch_split<T, CT, 48>(ctx, a, n, paged); break;
    case 64: launch_split<T, CT, 64>(ctx, a, n, paged); break;
    case 96: launch_split<T, CT, 96>(ctx, a, n, paged); break;
    default: launch_split<T, CT, 128>(ctx, a, n, paged); break;
  }
}

// Runs the split kernel (paged: attn_paged_kernel, else attn_split_kernel) over all
// tokens, in chunks whose partials fit the scratch. dt: q/out; kv_dt: the k/v elements
// (dt, or f8e4m3 for paged FP8 caches).
void run_split(Context& ctx, AttnArgs a, DType dt, DType kv_dt, int D, int64_t max_ctx, bool paged) {
  if (a.T == 0) return;
  GRPO_CHECK_MSG(a.Hkv > 0 && a.Hq % a.Hkv == 0, "attention: Hq must be a multiple of Hkv");
  GRPO_CHECK_MSG(D == 8 || D == 16 || D == 32 || D == 48 || D == 64 || D == 96 || D == 128,
                 "attention (cuda): head dim must be 8, 16, 32, 48, 64, 96 or 128");
  const bool fp8 = kv_dt == DType::f8e4m3;
  GRPO_CHECK_MSG(kv_dt == dt || (fp8 && paged), "attention (cuda): k/v must have q's dtype (or be an f8e4m3 cache)");
  GRPO_CHECK_MSG(!fp8 || D % 16 == 0, "attention_paged (cuda): an f8e4m3 KV cache needs a head dim that is a multiple of 16");
  a.G = a.Hq / a.Hkv;
  a.n_hgroups = int(ceil_div(a.G, heads_per_block(a.G)));
  if (max_ctx < 1) max_ctx = 1;
  const int part = !paged ? kPart : paged_part_of(int(dtype_size(kv_dt)), D);
  a.n_splits = int(ceil_div(max_ctx, part));
  GRPO_CHECK_MSG(a.n_splits <= 65535 && int64_t(a.Hkv) * a.n_hgroups <= 65535, "attention: grid too large");
  const int64_t chunk = a.n_splits > 1 ? alloc_partials(ctx, a.T, a.Hq, a.n_splits, D, &a.part_acc, &a.part_ml)
                                       : std::min<int64_t>(a.T, 0x7fffffff);
  for (int64_t t0 = 0; t0 < a.T; t0 += chunk) {
    a.tok0 = t0;
    const int64_t n = a.T - t0 < chunk ? a.T - t0 : chunk;
    GRPO_DISPATCH_FLOAT(dt, T, {
      if (fp8) launch_split_d<T, e4m3_t>(ctx, a, n, D, paged);
      else launch_split_d<T, T>(ctx, a, n, D, paged);
    });
  }
}

__global__ void kv_write_kernel(uint4* __restrict__ kc, uint4* __restrict__ vc, const uint4* __restrict__ k,
                                const uint4* __restrict__ v, const int32_t* __restrict__ slots, int64_t row16) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row16; i += blockDim.x) {
    kc[slot * row16 + i] = k[t * row16 + i];
    vc[slot * row16 + i] = v[t * row16 + i];
  }
}

template <class T>
__global__ void kv_write_scalar_kernel(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ k,
                                       const T* __restrict__ v, const int32_t* __restrict__ slots, int64_t row) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[slot * row + i] = k[t * row + i];
    vc[slot * row + i] = v[t * row + i];
  }
}

// 16 elements of T at p (16-byte aligned) as f32.
template <class T>
__device__ __forceinline__ void load16(const T* p, float* f) {
  constexpr int V = Vec16<T>::n;
#pragma unroll
  for (int j = 0; j < 16 / V; ++j) load_vec(p + j * V, f + j * V);
}

// FP8 caches: item i = 16 consecutive elements of token t's k and v rows (n16 items per
// row), read as 16-byte vectors (two for bf16, four for f32) and stored as 16 E4M3 bytes
// (RN, satfinite) in the token's slot. Flat grid-stride loop over the T·n16 items.
template <class T>
__global__ void kv_write_fp8_kernel(e4m3_t* __restrict__ kc, e4m3_t* __restrict__ vc, const T* __restrict__ k,
                                    const T* __restrict__ v, const int32_t* __restrict__ slots, int64_t n16,
                                    int64_t total) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / n16;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t dst = (slot * n16 + (i - t * n16)) * 16;
    float f[16];
    load16(k + i * 16, f);
    store_vec(kc + dst, f);
    load16(v + i * 16, f);
    store_vec(vc + dst, f);
  }
}

// FP8 caches, any row length or alignment: a block per token, an element per thread step.
template <class T>
__global__ void kv_write_fp8_scalar_kernel(uint8_t* __restrict__ kc, uint8_t* __restrict__ vc,
                                           const T* __restrict__ k, const T* __restrict__ v,
                                           const int32_t* __restrict__ slots, int64_t row) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[slot * row + i] = f32_to_e4m3(to_f32(k[t * row + i]));
    vc[slot * row + i] = f32_to_e4m3(to_f32(v[t * row + i]));
  }
}

}  // namespace

int64_t alloc_partials(Context& ctx, int64_t T, int Hq, int n_splits, int D, float** part_acc, float** part_ml) {
  ScratchAlloc sa(ctx);
  const int64_t per_tok = int64_t(Hq) * n_splits * (D + 2) * int64_t(sizeof(float)) + 512;
  const int64_t chunk = std::min<int64_t>({T, int64_t(sa.left()) / per_tok, 0x7fffffff});
  GRPO_CHECK_MSG(chunk >= 1, "attention: workspace too small for one token's partials");
  *part_acc = sa.alloc<float>(chunk * Hq * n_splits * D, "attention partial acc");
  *part_ml = sa.alloc<float>(chunk * Hq * n_splits * 2, "attention partial m/l");
  return chunk;
}

void launch_paged_combine(Context& ctx, DType dt, void* out, float* lse, const float* part_acc, const float* part_ml,
                          const int32_t* token_pos, int64_t T_, int64_t tok0, int64_t n_tok, int Hq, int n_splits,
                          int D, int part_len) {
  GRPO_DISPATCH_FLOAT(dt, T, {
    launch_pdl(ctx, attn_paged_combine_kernel<T>, dim3(unsigned(n_tok), unsigned(Hq)), dim3(unsigned(D)), 0,
               static_cast<T*>(out), lse, part_acc, part_ml, token_pos, T_, tok0, Hq,
               n_splits, D, part_len);
  });
}

void attention_forward(Context& ctx, Tensor& out, Tensor* lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnVarlen& meta) {
  GRPO_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3, "attention_forward: q, k, v must be 3-D");
  const int64_t T_ = q.shape[0];
  GRPO_CHECK_MSG(out.numel() == q.numel() && out.dtype == q.dtype, "attention_forward: out must match q");
  GRPO_CHECK_MSG(k.dtype == q.dtype && v.dtype == q.dtype && k.shape[0] == T_ && v.numel() == k.numel() &&
                     k.shape[2] == q.shape[2],
                 "attention_forward: k, v must be (T,Hkv,D) with q's dtype");
  GRPO_CHECK_MSG(meta.cu_seqlens.size() >= 2 && meta.cu_seqlens.back() == T_ && meta.cu_seqlens_dev.defined() &&
                     meta.cu_seqlens_dev.numel() == int64_t(meta.cu_seqlens.size()),
                 "attention_forward: cu_seqlens (host and device) must span the T tokens");
  if (lse) GRPO_CHECK_MSG(lse->dtype == DType::f32 && lse->numel() == q.shape[1] * T_, "attention_forward: lse (Hq,T) f32");
  GRPO_CHECK_MSG(aligned16(q.data) && aligned16(k.data) && aligned16(v.data), "attention_forward: 16-byte alignment");
  {  // bf16 with head dim 64/128: the tensor-core kernel (attention_train_fwd_tc.cu)
    TcArgs t{};
    t.q = q.data; t.k = k.data; t.v = v.data; t.out = out.data;
    t.lse = lse ? lse->ptr<float>() : nullptr;
    t.cu = meta.cu_seqlens_dev.ptr<int32_t>();
    t.n_seqs = int(meta.cu_seqlens.size() - 1);
    t.T = T_; t.Hq = int(q.shape[1]); t.Hkv = int(k.shape[1]); t.G = t.Hq / t.Hkv; t.D = int(q.shape[2]);
    t.scale = 1.f / std::sqrt(float(t.D));
    if (meta.window == 0 && attention_forward_tc(ctx, t, q.dtype)) return;
  }
  int64_t max_len = 0;
  for (size_t i = 0; i + 1 < meta.cu_seqlens.size(); ++i)
    max_len = std::max<int64_t>(max_len, meta.cu_seqlens[i + 1] - meta.cu_seqlens[i]);
  AttnArgs a{};
  a.q = q.data;
  a.out = out.data;
  a.lse = lse ? lse->ptr<float>() : nullptr;
  a.k = k.data;
  a.v = v.data;
  a.cu_seqlens = meta.cu_seqlens_dev.ptr<int32_t>();
  a.n_seqs = int(meta.cu_seqlens.size() - 1);
  a.T = T_;
  a.Hq = int(q.shape[1]);
  a.Hkv = int(k.shape[1]);
  a.window = meta.window;
  a.scale = 1.f / std::sqrt(float(q.shape[2]));
  run_split(ctx, a, q.dtype, q.dtype, int(q.shape[2]), max_len, false);
}

void kv_cache_write(Context& ctx, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const PagedAttnMeta& meta) {
  const int64_t T_ = k.shape[0], row = k.numel() / (T_ ? T_ : 1);
  const bool fp8 = k_cache.dtype == DType::f8e4m3;
  GRPO_CHECK_MSG(detail::kv_cache_dtype_ok(k_cache, v_cache, k.dtype) && v.dtype == k.dtype && v.numel() == k.numel(),
                 "kv_cache_write: k and v must share a dtype and shape; the caches k's dtype or f8e4m3");
  GRPO_CHECK_MSG(k_cache.ndim == 4 && k_cache.shape[2] * k_cache.shape[3] == row, "kv_cache_write: cache row mismatch");
  GRPO_CHECK_MSG(meta.slot_mapping.dtype == DType::i32 && meta.slot_mapping.numel() == T_, "kv_cache_write: slot_mapping (T) i32");
  if (T_ == 0) return;
  if (fp8) {  // convert to E4M3 on the way (k and v already hold the model dtype's rounded values)
    const bool vec = row % 16 == 0 && aligned16(k.data) && aligned16(v.data) && aligned16(k_cache.data) &&
                     aligned16(v_cache.data);
    GRPO_DISPATCH_FLOAT(k.dtype, T, {
      if (vec) {
        const int64_t n16 = row / 16, total = T_ * n16;
        kv_write_fp8_kernel<T><<<flat_grid(total, 128), 128, 0, stream_of(ctx)>>>(
            k_cache.ptr<e4m3_t>(), v_cache.ptr<e4m3_t>(), k.ptr<T>(), v.ptr<T>(), meta.slot_mapping.ptr<int32_t>(),
            n16, total);
      } else {
        kv_write_fp8_scalar_kernel<T><<<unsigned(T_), 128, 0, stream_of(ctx)>>>(
            k_cache.ptr<uint8_t>(), v_cache.ptr<uint8_t>(), k.ptr<T>(), v.ptr<T>(), meta.slot_mapping.ptr<int32_t>(),
            row);
      }
    });
    CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t row_bytes = size_t(row) * dtype_size(k.dtype);
  const bool vec = row_bytes % 16 == 0 && aligned16(k.data) && aligned16(v.data) && aligned16(k_cache.data) &&
                   aligned16(v_cache.data);
  if (vec) {
    const int64_t row16 = int64_t(row_bytes / 16);
    const int threads = row16 >= 128 ? 128 : 64;
    kv_write_kernel<<<unsigned(T_), threads, 0, stream_of(ctx)>>>(k_cache.ptr<uint4>(), v_cache.ptr<uint4>(),
                                                                   k.ptr<uint4>(), v.ptr<uint4>(),
                                                                   meta.slot_mapping.ptr<int32_t>(), row16);
  } else {
    GRPO_DISPATCH_FLOAT(k.dtype, T, {
      kv_write_scalar_kernel<T><<<unsigned(T_), 128, 0, stream_of(ctx)>>>(
          k_cache.ptr<T>(), v_cache.ptr<T>(), k.ptr<T>(), v.ptr<T>(), meta.slot_mapping.ptr<int32_t>(), row);
    });
  }
  CUDA_CHECK_LAUNCH();
}

void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const PagedAttnMeta& meta, Tensor* lse) {
  GRPO_CHECK_MSG(q.ndim == 3 && k_cache.ndim == 4 && v_cache.ndim == 4, "attention_paged: q (T,Hq,D), caches 4-D");
  GRPO_CHECK_MSG(out.numel() == q.numel() && out.dtype == q.dtype, "attention_paged: out must match q");
  const bool fp8 = k_cache.dtype == DType::f8e4m3;
  GRPO_CHECK_MSG(detail::kv_cache_dtype_ok(k_cache, v_cache, q.dtype) && k_cache.shape[3] == q.shape[2],
                 "attention_paged: caches must be (n_blocks,bs,Hkv,D) with q's dtype or f8e4m3");
  GRPO_CHECK_MSG(!fp8 || q.shape[2] % 16 == 0,
                 "attention_paged (cuda): an f8e4m3 KV cache needs a head dim that is a multiple of 16");
  GRPO_CHECK_MSG(meta.block_table.ndim == 2 && meta.block_table.dtype == DType::i32, "attention_paged: block_table (S,max_blocks) i32");
  GRPO_CHECK_MSG(meta.token_seq.numel() == q.shape[0] && meta.token_pos.numel() == q.shape[0],
                 "attention_paged: token_seq/token_pos must be (T)");
  GRPO_CHECK_MSG(aligned16(q.data) && aligned16(k_cache.data) && aligned16(v_cache.data), "attention_paged: alignment");
  GRPO_CHECK_MSG(meta.window >= 0, "attention_paged: window must be >= 0");
  if (meta.n_prefill_tiles > 0 && meta.window == 0 && !lse && attention_tc_supported(q.dtype, int(q.shape[2]))) {
    // A mostly-prefill step with the runner's query tiles: the tensor-core kernel
    // (attention_prefill_tc.cu); the tiles cover every row of q once.
    const Tensor& tl = meta.prefill_tiles;
    GRPO_CHECK_MSG(tl.dtype == DType::i32 && tl.ndim == 2 && tl.shape[1] == 4 && tl.shape[0] >= meta.n_prefill_tiles &&
                       tl.device == Device::cuda,
                   "attention_paged: prefill_tiles must be (>= n_prefill_tiles, 4) i32 on the device");
    GRPO_CHECK_MSG(meta.n_prefill_tiles <= q.shape[0], "attention_paged: more prefill tiles than query rows");
    PagedTcArgs t{};
    t.q = q.data; t.out = out.data; t.k_cache = k_cache.data; t.v_cache = v_cache.data;
    t.block_table = meta.block_table.ptr<int32_t>();
    t.tiles = tl.ptr<int32_t>();
    t.n_tiles = meta.n_prefill_tiles;
    t.max_blocks = int(meta.block_table.shape[1]);
    t.block_size = int(k_cache.shape[1]);
    t.Hq = int(q.shape[1]); t.Hkv = int(k_cache.shape[2]); t.G = t.Hkv > 0 ? t.Hq / t.Hkv : 0; t.D = int(q.shape[2]);
    t.scale = 1.f / std::sqrt(float(t.D));
    t.kv_fp8 = fp8;
    if (attention_paged_prefill_tc(ctx, t, q.dtype)) return;
  }
  AttnArgs a{};
  a.q = q.data;
  a.out = out.data;
  a.k = k_cache.data;
  a.v = v_cache.data;
  a.token_seq = meta.token_seq.ptr<int32_t>();
  a.token_pos = meta.token_pos.ptr<int32_t>();
  a.block_table = meta.block_table.ptr<int32_t>();
  a.max_blocks = int(meta.block_table.shape[1]);
  a.block_size = int(k_cache.shape[1]);
  a.T = q.shape[0];
  a.Hq = int(q.shape[1]);
  a.Hkv = int(k_cache.shape[2]);
  a.window = meta.window;
  a.scale = 1.f / std::sqrt(float(q.shape[2]));
  a.lse = lse ? lse->ptr<float>() : nullptr;
  if (meta.window == 0 && attention_paged_decode_tc(ctx, out, q, k_cache, v_cache, meta, a.lse)) return;  // bf16, D 64/128
  run_split(ctx, a, q.dtype, k_cache.dtype, int(q.shape[2]), meta.max_context, true);
}

}  // namespace grpo::cuda
