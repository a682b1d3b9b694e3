// The sampler's split path for filtered rows (top-k / top-p / min-p, no top-n lists).
// The one-block path bisects the 32 key bits with a pass over the row per bit (~70 passes
// for top-k plus top-p). Here many blocks per row run a radix select over 8-bit digits of the
// order-preserving key instead, with the masses in fixed point so that every sum is an
// integer sum (exact, so independent of the order in which blocks and threads add):
//   init    per row, from the part kernel's chunk statistics: m0, m, best, valid count, lse0
//   hist    stages 0-3 (top-k) and 4-7 (top-p): a 256-bin histogram of digit d among the ids
//           whose higher digits equal the prefix found so far (counts for top-k; for top-p the
//           masses ⌊q·2^s⌉ of the ids inside the top-k set, q = exp(y − m) as the one-block
//           path computes it, s = 63 − ⌈log2 V⌉ so no sum overflows), added per warp and digit
//           in shared memory, then the block's nonzero bins into the row's histogram (L2
//           atomics); the last digit also keeps one histogram per chunk. About one wave of
//           blocks: each takes consecutive chunks of its row, or strides over the row's
//           candidate list. The row's last block to finish (arrival counter) takes the largest
//           digit whose suffix weight reaches the target (k, or p·Q with Q the stage-4 total)
//           and after the last digit resolves the ties at the found key in id order: the first
//           chunk whose tie weight reaches the rest, then a block scan over that chunk's ids.
//   compact after the first digit of top-k (or of top-p without top-k, which also counts ids
//           per digit), when the ids from the found digit up (the bucket and every id ranked
//           above it) are at most a quarter of the row, they go to a per-row candidate list (any
//           order: every later use is an integer sum or a set test), which the later digits,
//           top-p after top-k and the draw read instead of the row.
//   sample  fixed-point kept mass per chunk (from the list when there is one); the last block finds
//           the first chunk, then the first id, whose running mass exceeds u·S (ascending ids),
//           and writes the token and both logprobs (lp = y − m − log S).
// The kept set and the token are those of kernels/sampling.h except where a comparison falls
// within the fixed-point rounding (≤ V·2^−(s+1) of mass, ~2e-9 of S at V = 151,936): the
// same kind of edge as the unfiltered split path's. GRPO_FILTERED_SPLIT=0 (read once per
// process) sends filtered rows back to the one-block path.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sampling_common.cuh"
#include "kernels/sampling.h"

namespace grpo::cuda::sampler {

namespace {

constexpr int kBins = 256;

struct FiltRow {
  double lse0;       // raw log-normaliser
  double target;     // top-p: p · Q in fixed-point units
  uint64_t above;    // weight ranked above the current bucket (count or fixed-point mass)
  int64_t idK, idP;  // last id kept among the ties at kK / kP (INT64_MAX: no tie rule yet)
  float m;           // processed row max
  int32_t best;      // processed argmax (lowest id)
  uint32_t kK, kP;   // top-k / top-p keys (their known high digits while the search runs)
  int32_t active, use_k, use_p;
  uint32_t arrived;  // blocks of the current kernel that finished (the last one resets it)
  uint32_t cand_n;   // ids in the row's candidate list (filt_compact_kernel)
  int32_t list;      // the list holds every id the filters can keep (set with the first digit of
                     // top-k, or of top-p without top-k)
};

// Scratch of the filtered path, by value.
struct FiltBufs {
  FiltRow* st;                  // (R)
  unsigned long long* hist;     // (R, chunks, 256): last-digit tie weights per chunk (zero between uses)
  unsigned long long* rowhist;  // (R, 2, 256): digit histograms (double-buffered by stage)
  unsigned long long* rowcnt;   // (R, 256): id counts per first top-p digit (without top-k)
  unsigned long long* csum;     // (R, chunks): kept mass per chunk
  uint32_t* cand;               // (R, V): candidate ids (any order)
  double scale;                 // 2^s of the fixed-point masses
};

struct FiltShared {
  uint32_t ban[kPartThreads];
  unsigned long long bins[kBins];
  unsigned long long cnt[kBins];
  unsigned long long tot[kBins];
  unsigned long long w8[kPartWarps];
  unsigned long long cw[kMaxParts];
  float f8[kPartWarps];
  int32_t i8[kPartWarps];
  double d8[kPartWarps];
  int flag, pick, chunk;
  unsigned long long cum_before;
  unsigned long long n_from;
  unsigned long long id;
};

// 256-thread block reductions (every thread gets the result); fixed order.
__device__ __forceinline__ unsigned long long scan256_excl(unsigned long long x, unsigned long long* total,
                                                           FiltShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) sh.w8[warp] = incl;
  __syncthreads();
  unsigned long long base = 0, tot = 0;
  for (int w = 0; w < kPartWarps; ++w) {
    if (w < warp) base += sh.w8[w];
    tot += sh.w8[w];
  }
  *total = tot;
  return base + incl - x;
}
__device__ __forceinline__ double sum256_d(double v, FiltShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh.d8[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kPartWarps; ++w) r += sh.d8[w];
  return r;
}
__device__ __forceinline__ void argmax256(float& v, int32_t& id, FiltShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(v, id);
  __syncthreads();
  if (lane == 0) { sh.f8[warp] = v; sh.i8[warp] = id; }
  __syncthreads();
  for (int w = 0; w < kPartWarps; ++w)
    if (sh.f8[w] > v || (sh.f8[w] == v && sh.i8[w] < id)) { v = sh.f8[w]; id = sh.i8[w]; }
}

// Fixed-point mass of a processed logit (0 for −inf).
__device__ __forceinline__ unsigned long long q_fix(float y, float m, double scale) {
  return y == -INFINITY ? 0ull : __double2ull_rn(double(expf(y - m)) * scale);
}

// Inside the top-k set (valid ids only).
__device__ __forceinline__ bool in_top_k(const FiltRow& s, uint32_t key, int64_t i) {
  return !s.use_k || key > s.kK || (key == s.kK && i <= s.idK);
}
__device__ __forceinline__ bool in_top_p(const FiltRow& s, uint32_t key, int64_t i) {
  return !s.use_p || key > s.kP || (key == s.kP && i <= s.idP);
}

// The row's last block of a (blocks per row, rows) grid gets true (after every block's writes
// are visible to it) and resets the counter for the next kernel.
__device__ __forceinline__ bool last_block_of_row(FiltRow* s, int n_blocks, FiltShared& sh) {
  __syncthreads();  // the block's writes happen before thread 0's fence (fences are cumulative)
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned prev = atomicAdd(&s->arrived, 1u);
    sh.flag = prev == unsigned(n_blocks - 1);
    if (sh.flag) s->arrived = 0u;
  }
  __syncthreads();
  if (!sh.flag) return false;
  __threadfence();
  return true;
}

// First chunk (in order) whose running weight, added to base, satisfies cond; the chunk
// weights come from w_of(c). Sets sh.chunk (−1 if none) and sh.cum_before.
template <class WOf, class Cond>
__device__ void find_chunk(int n_chunks, unsigned long long base, WOf w_of, Cond cond, FiltShared& sh) {
  for (int c = threadIdx.x; c < n_chunks; c += kPartThreads) sh.cw[c] = w_of(c);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long cum = base;
    sh.chunk = -1;
    for (int c = 0; c < n_chunks; ++c) {
      if (sh.cw[c] > 0 && cond(cum + sh.cw[c])) {
        sh.chunk = c;
        break;
      }
      cum += sh.cw[c];
    }
    sh.cum_before = cum;
  }
  __syncthreads();
}

// This thread's kPer ids of the chunk from id cb: loaded logits v, their ban bits, and the
// sum of their weights w(v, banned, id). Call from every thread (ban_mask has barriers).
template <class W>
__device__ unsigned long long chunk_weights(const SplitArgs& a, int64_t r, int64_t cb, W w, float (&v)[kPer],
                                            uint32_t& ban, FiltShared& sh) {
  const int64_t i0 = cb + int64_t(threadIdx.x) * kPer;
  load_ids(a.logits + r * a.V, a.V, i0, v);
  ban = ban_mask(sh.ban, a.banned ? a.banned + r * a.nb : nullptr, a.nb, cb);
  unsigned long long own = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) own += w(v[k], (ban >> k) & 1u, i0 + k);
  return own;
}

// First id of chunk c (ascending) at which base + the running weight satisfies cond
// (INT64_MAX if none). w(v, banned, id) gives an id's weight from its loaded logit.
template <class W, class Cond>
__device__ int64_t walk_chunk(const SplitArgs& a, int64_t r, int c, unsigned long long base, W w, Cond cond,
                              FiltShared& sh) {
  const int64_t cb = int64_t(c) * kPartChunk, i0 = cb + int64_t(threadIdx.x) * kPer;
  float v[kPer];
  uint32_t ban;
  const unsigned long long own = chunk_weights(a, r, cb, w, v, ban, sh);
  unsigned long long tot;
  const unsigned long long b0 = base + scan256_excl(own, &tot, sh);
  if (threadIdx.x == 0) sh.id = ~0ull;
  __syncthreads();
  if (own > 0 && !cond(b0) && cond(b0 + own)) {
    unsigned long long run = b0;
    bool done = false;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const unsigned long long wk = w(v[k], (ban >> k) & 1u, i0 + k);  // recomputed: fewer registers
      run += wk;
      if (!done && wk > 0 && cond(run)) {
        atomicMin(&sh.id, (unsigned long long)(i0 + k));
        done = true;
      }
    }
  }
  __syncthreads();
  const unsigned long long id = sh.id;
  __syncthreads();
  return id == ~0ull ? INT64_MAX : int64_t(id);
}

// grid (R), 256 threads: row statistics from the part kernel's chunk partials.
__global__ void __launch_bounds__(kPartThreads) filt_init_kernel(SplitArgs a, const ChunkPart* __restrict__ parts,
                                                                 FiltBufs f) {
  pdl_trigger();
  pdl_wait();
  __shared__ FiltShared sh;
  const int64_t r = blockIdx.x;
  FiltRow* s = f.st + r;
  f.rowhist[r * 2 * kBins + threadIdx.x] = 0ull;  // both row-histogram buffers
  f.rowhist[r * 2 * kBins + kBins + threadIdx.x] = 0ull;
  f.rowcnt[r * kBins + threadIdx.x] = 0ull;
  for (int i = threadIdx.x; i < a.n_chunks * kBins; i += kPartThreads) f.hist[r * a.n_chunks * kBins + i] = 0ull;
  for (int c = threadIdx.x; c < a.n_chunks; c += kPartThreads) f.csum[r * a.n_chunks + c] = 0ull;
  if (!filt_split_row(a, r)) {
    if (threadIdx.x == 0) s->active = 0;
    return;
  }
  const int n = a.n_chunks;
  const ChunkPart* pr = parts + r * n;
  float m0 = -INFINITY, m = -INFINITY;
  int32_t best = INT32_MAX;
  double nv = 0.0;
  for (int c = threadIdx.x; c < n; c += kPartThreads) {
    const ChunkPart p = pr[c];
    m0 = fmaxf(m0, p.m0);
    nv += double(p.n_valid);
    if (p.m > m || (p.m == m && p.best < best)) { m = p.m; best = p.best; }
  }
  float m0v = m0;
  int32_t dummy = 0;
  argmax256(m0v, dummy, sh);
  argmax256(m, best, sh);
  nv = sum256_d(nv, sh);
  double e0 = 0.0;
  for (int c = threadIdx.x; c < n; c += kPartThreads) {
    const ChunkPart p = pr[c];
    if (p.m0 != -INFINITY) e0 += p.s0 * exp(double(p.m0) - double(m0v));
  }
  e0 = sum256_d(e0, sh);
  if (threadIdx.x != 0) return;
  if (nv == 0.0) {  // every id banned: caller bug
    a.tokens[r] = -1;
    a.lp_raw[r] = NAN;
    a.lp_proc[r] = NAN;
    s->active = 0;
    return;
  }
  const int32_t k = a.top_k[r];
  s->lse0 = double(m0v) + log(e0);
  s->target = 0.0;
  s->above = 0;
  s->idK = INT64_MAX;
  s->idP = INT64_MAX;
  s->m = m;
  s->best = best;
  s->kK = 0;
  s->kP = 0;
  s->use_k = k > 0 && double(k) < nv;
  s->use_p = a.top_p[r] < 1.f;
  s->arrived = 0;
  s->cand_n = 0;
  s->list = 0;
  s->active = 1;
}

// Warp-aggregated add of (w, digit) into the block's histogram: a row's keys crowd into few
// digits (flat logits: a handful of exponents at digit 0), so one shared-memory add per
// distinct digit of the warp, not per id. Call from all 32 lanes.
__device__ __forceinline__ void warp_hist_add(unsigned long long* bins, unsigned long long w, int dg, bool counts) {
  const int lane = threadIdx.x & 31;
  unsigned todo = __ballot_sync(0xffffffffu, w > 0);
  if (todo == 0u) return;
  if (counts) {
    const unsigned peers = __match_any_sync(0xffffffffu, w > 0 ? dg : -1);
    if (w > 0 && lane == __ffs(peers) - 1) atomicAdd(&bins[dg], (unsigned long long)__popc(peers));
    return;
  }
  while (todo) {  // warp-uniform
    const int src = __ffs(todo) - 1;
    const int dsrc = __shfl_sync(0xffffffffu, dg, src);
    const bool mine = w > 0 && dg == dsrc;
    todo &= ~__ballot_sync(0xffffffffu, mine);
    unsigned long long x = mine ? w : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (lane == src) atomicAdd(&bins[dsrc], x);
  }
}

// grid (chunks, R), 256 threads: digit stage % 4 of the top-k (stage < 4) or top-p search.
// The first digit of a search reads the whole row (chunk blockIdx.x), except top-p after
// top-k, and every later digit reads the row's candidate list (blocks stride over it).
__global__ void __launch_bounds__(kPartThreads) filt_hist_kernel(SplitArgs a, FiltBufs f, int stage, int cpb) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  FiltRow* srow = f.st + r;
  const FiltRow s = *srow;
  const bool pstage = stage >= 4;
  if (!s.active || !(pstage ? s.use_p : s.use_k)) return;
  __shared__ FiltShared sh;
  const int d = stage & 3, tid = threadIdx.x;
  const int n = a.n_chunks;
  const uint32_t prefix = pstage ? s.kP : s.kK;
  const int lo = 24 - 8 * d;  // lowest bit of digit d
  const float temp = a.temperature[r] > 0.f ? a.temperature[r] : 1.f;
  const float* z = a.logits + r * a.V;
  const double scale = f.scale;
  // Weight of an id (processed logit y) in this stage's histogram, and its digit.
  auto weight = [&](float y, int64_t i, int* digit) -> unsigned long long {
    if (y == -INFINITY) return 0ull;
    const uint32_t key = okey(y);
    if (d > 0 && (key >> (lo + 8)) != (prefix >> (lo + 8))) return 0ull;
    if (pstage && !in_top_k(s, key, i)) return 0ull;
    *digit = int((key >> lo) & 255u);
    return pstage ? q_fix(y, s.m, scale) : 1ull;
  };
  // The block's nonzero bins go into the row's histogram (integer adds at L2: exact whatever
  // their order); the last digit also adds into per-chunk histograms, whose bin at the found
  // key orders the ties by chunk.
  unsigned long long* hrow = f.hist + (r * n) * kBins;
  unsigned long long* rh = f.rowhist + (r * 2 + (stage & 1)) * kBins;
  // The first top-p digit without top-k also counts ids per digit, for the list decision.
  const bool count_p = pstage && d == 0 && !s.use_k;
  sh.bins[tid] = 0ull;
  sh.cnt[tid] = 0ull;
  if (!(s.list && (d > 0 || pstage))) {  // the whole row: chunks [cpb·x, cpb·x + cpb)
    const int c_end = min(n, (int(blockIdx.x) + 1) * cpb);
    for (int c = int(blockIdx.x) * cpb; c < c_end; ++c) {
      const int64_t cb = int64_t(c) * kPartChunk, i0 = cb + int64_t(tid) * kPer;
      float v[kPer];
      load_ids(z, a.V, i0, v);
      const uint32_t ban = ban_mask(sh.ban, a.banned ? a.banned + r * a.nb : nullptr, a.nb, cb);  // barriers
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        int dg = 0;
        const unsigned long long w = weight(proc_val(v[k], (ban >> k) & 1u, temp), i0 + k, &dg);
        warp_hist_add(sh.bins, w, dg, !pstage);
        if (count_p) warp_hist_add(sh.cnt, w > 0 ? 1ull : 0ull, dg, true);
      }
      if (d == 3) {  // this chunk's tie histogram, and the row's
        __syncthreads();
        if (sh.bins[tid] != 0ull) {
          atomicAdd(&hrow[int64_t(c) * kBins + tid], sh.bins[tid]);
          atomicAdd(rh + tid, sh.bins[tid]);
        }
        sh.bins[tid] = 0ull;
      }
    }
  } else {
    __syncthreads();
    const uint32_t cn = s.cand_n;
    const uint32_t* cl = f.cand + r * a.V;
    for (uint32_t base = blockIdx.x * kPartThreads; base < cn; base += gridDim.x * kPartThreads) {
      const uint32_t i = base + tid;
      unsigned long long w = 0;
      int dg = 0;
      int64_t id = 0;
      if (i < cn) {
        id = cl[i];
        w = weight(proc_val(z[id], false, temp), id, &dg);
      }
      if (d == 3) {
        if (w > 0) {
          atomicAdd(&hrow[(id / kPartChunk) * kBins + dg], w);
          atomicAdd(rh + dg, w);
        }
      } else {
        warp_hist_add(sh.bins, w, dg, !pstage);
      }
    }
  }
  __syncthreads();
  if (d < 3 && sh.bins[tid] != 0ull) atomicAdd(rh + tid, sh.bins[tid]);
  if (count_p && sh.cnt[tid] != 0ull) atomicAdd(f.rowcnt + r * kBins + tid, sh.cnt[tid]);
  if (!last_block_of_row(srow, int(gridDim.x), sh)) return;

  // The row's last block: bin totals, then the digit. It also clears the other row-histogram
  // buffer for the next stage (the previous stage, its last user, has completed).
  f.rowhist[(r * 2 + ((stage + 1) & 1)) * kBins + tid] = 0ull;
  const unsigned long long t = __ldcg(rh + tid);
  sh.tot[tid] = t;
  double need = double(a.top_k[r]);
  if (pstage) {
    need = s.target;
    if (d == 0) {
      unsigned long long Q;
      scan256_excl(t, &Q, sh);
      need = double(a.top_p[r]) * double(Q);
    }
  }
  __syncthreads();
  // Suffix weights: thread j takes bin 255 − j, so its inclusive scan is Σ_{b >= 255−j}.
  const unsigned long long x = sh.tot[kBins - 1 - tid];
  unsigned long long all;
  const unsigned long long suf = scan256_excl(x, &all, sh) + x;
  if (tid == 0) sh.pick = kBins - 1;
  __syncthreads();
  if (double(s.above + suf) >= need) atomicMin(&sh.pick, tid);  // largest digit that reaches need
  __syncthreads();
  const int j = sh.pick;
  const int b = kBins - 1 - j;
  const uint32_t key = prefix | (uint32_t(b) << lo);
  if (tid == j) sh.cum_before = s.above + suf - x;
  // Ids from the found first digit up: counts of the top-k search, the count histogram of
  // the top-p search without top-k.
  unsigned long long n_from = 0;
  if (count_p) {
    const unsigned long long xc = __ldcg(f.rowcnt + r * kBins + kBins - 1 - tid);
    unsigned long long allc;
    const unsigned long long sufc = scan256_excl(xc, &allc, sh) + xc;
    if (tid == j) sh.n_from = sufc;
  }
  __syncthreads();
  const unsigned long long above = sh.cum_before;
  if (count_p) n_from = sh.n_from;
  if (d < 3) {
    if (tid == 0) {
      if (pstage) { srow->kP = key; srow->target = need; }
      else srow->kK = key;
      srow->above = above;
      // After the first digit of top-k (or of top-p without top-k): compact when the ids from
      // the found digit up are at most a quarter of the row; else every stage reads the row.
      if (!pstage && d == 0) srow->list = 4 * (above + sh.tot[b]) <= uint64_t(a.V);
      if (count_p) srow->list = 4 * n_from <= uint64_t(a.V);
    }
    return;
  }
  // Last digit: the key is complete; keep its ties in id order up to the target.
  auto cond = [&](unsigned long long c) { return double(c) >= need; };
  find_chunk(n, above, [&](int c) { return __ldcg(hrow + int64_t(c) * kBins + b); }, cond, sh);
  const int c = sh.chunk < 0 ? n - 1 : sh.chunk;
  const unsigned long long cum = sh.cum_before;
  const int64_t id = walk_chunk(
      a, r, c, cum,
      [&](float v, bool banned, int64_t i) -> unsigned long long {
        const float y = proc_val(v, banned, temp);
        if (y == -INFINITY || okey(y) != key) return 0ull;
        if (pstage && !in_top_k(s, key, i)) return 0ull;
        return pstage ? q_fix(y, s.m, scale) : 1ull;
      },
      cond, sh);
  for (int i = tid; i < n * kBins; i += kPartThreads) hrow[i] = 0ull;  // for the next search
  if (tid == 0) {
    if (pstage) {
      srow->kP = key;
      srow->idP = id == INT64_MAX ? int64_t(a.V) : id;
      srow->target = need;
    } else {
      srow->kK = key;
      srow->idK = id == INT64_MAX ? int64_t(a.V) : id;
    }
    srow->above = 0;
  }
}

// grid (chunks, R), 256 threads: after the first digit of a search read the whole row
// (stage 0: top-k; stage 4: top-p without top-k), the ids whose first digit is at least the
// one found — the bucket and every id ranked above it, so every id the filter can keep —
// go to the row's candidate list (warp-aggregated appends; the list's order is free, every
// later use of it is an integer sum or a set test).
__global__ void __launch_bounds__(kPartThreads) filt_compact_kernel(SplitArgs a, FiltBufs f, int after) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  FiltRow* srow = f.st + r;
  const FiltRow s = *srow;
  const bool p = after >= 4;  // top-p without top-k (after stage 4), else top-k (after stage 0)
  if (!s.active || !s.list || (p ? (!s.use_p || s.use_k) : !s.use_k)) return;
  __shared__ FiltShared sh;
  const int tid = threadIdx.x, lane = tid & 31;
  const uint32_t b0 = (p ? s.kP : s.kK) >> 24;
  const float temp = a.temperature[r] > 0.f ? a.temperature[r] : 1.f;
  const int64_t cb = int64_t(blockIdx.x) * kPartChunk, i0 = cb + int64_t(tid) * kPer;
  float v[kPer];
  load_ids(a.logits + r * a.V, a.V, i0, v);
  const uint32_t ban = ban_mask(sh.ban, a.banned ? a.banned + r * a.nb : nullptr, a.nb, cb);
  uint32_t* cl = f.cand + r * a.V;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float y = proc_val(v[k], (ban >> k) & 1u, temp);
    const bool keep = y != -INFINITY && (okey(y) >> 24) >= b0;
    const unsigned m = __ballot_sync(0xffffffffu, keep);
    if (m == 0u) continue;
    const int leader = __ffs(m) - 1;
    uint32_t base = 0;
    if (lane == leader) base = atomicAdd(&srow->cand_n, uint32_t(__popc(m)));
    base = __shfl_sync(0xffffffffu, base, leader);
    if (keep) cl[base + __popc(m & ((1u << lane) - 1u))] = uint32_t(i0 + k);
  }
}

// grid (chunks, R), 256 threads: kept mass per chunk (from the candidate list when the row
// has one, else chunk blockIdx.x of the row); the row's last block draws the token.
__global__ void __launch_bounds__(kPartThreads) filt_sample_kernel(SplitArgs a, FiltBufs f, int cpb) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  FiltRow* srow = f.st + r;
  const FiltRow s = *srow;
  if (!s.active) return;
  __shared__ FiltShared sh;
  const int n = a.n_chunks, tid = threadIdx.x;
  const float temp = a.temperature[r] > 0.f ? a.temperature[r] : 1.f, mp = a.min_p[r];
  const double scale = f.scale;
  auto kept_y = [&](float y, int64_t i) -> unsigned long long {
    if (y == -INFINITY) return 0ull;
    const uint32_t key = okey(y);
    if (!in_top_k(s, key, i) || !in_top_p(s, key, i)) return 0ull;
    const float q = expf(y - s.m);
    if (mp > 0.f && int32_t(i) != s.best && q < mp) return 0ull;
    return __double2ull_rn(double(q) * scale);
  };
  auto kept_w = [&](float v, bool banned, int64_t i) { return kept_y(proc_val(v, banned, temp), i); };
  const float* z = a.logits + r * a.V;
  unsigned long long* crow = f.csum + r * n;
  if (s.list) {  // every kept id is a candidate; per-chunk sums in shared memory first
    for (int c = tid; c < n; c += kPartThreads) sh.cw[c] = 0ull;
    __syncthreads();
    const uint32_t cn = s.cand_n;
    const uint32_t* cl = f.cand + r * a.V;
    for (uint32_t i = blockIdx.x * kPartThreads + tid; i < cn; i += gridDim.x * kPartThreads) {
      const int64_t id = cl[i];
      const unsigned long long w = kept_y(proc_val(z[id], false, temp), id);
      if (w > 0) atomicAdd(&sh.cw[id / kPartChunk], w);
    }
    __syncthreads();
    for (int c = tid; c < n; c += kPartThreads)
      if (sh.cw[c] != 0ull) atomicAdd(crow + c, sh.cw[c]);
  } else {
    const int c_end = min(n, (int(blockIdx.x) + 1) * cpb);
    for (int c = int(blockIdx.x) * cpb; c < c_end; ++c) {
      float v[kPer];
      uint32_t ban;
      const unsigned long long own = chunk_weights(a, r, int64_t(c) * kPartChunk, kept_w, v, ban, sh);
      unsigned long long tot;
      scan256_excl(own, &tot, sh);
      if (tid == 0) crow[c] = tot;
    }
  }
  if (!last_block_of_row(srow, int(gridDim.x), sh)) return;

  unsigned long long S_part = 0;
  for (int c = tid; c < n; c += kPartThreads) S_part += __ldcg(crow + c);
  unsigned long long S;
  scan256_excl(S_part, &S, sh);
  int64_t t = s.best;
  if (a.temperature[r] > 0.f) {
    const float u = sampling_uniform(uint64_t(a.rng_key[r]), uint64_t(a.rng_pos[r]));
    const double thr = double(u) * double(S);
    auto cond = [&](unsigned long long c) { return double(c) > thr; };
    find_chunk(n, 0ull, [&](int c) { return __ldcg(crow + c); }, cond, sh);
    if (sh.chunk >= 0) {
      const int64_t id = walk_chunk(a, r, sh.chunk, sh.cum_before, kept_w, cond, sh);
      if (id != INT64_MAX) t = id;
    }
  }
  if (tid == 0) {
    const double log_S = log(double(S) / scale);
    a.tokens[r] = int32_t(t);
    a.lp_raw[r] = float(double(z[t]) - s.lse0);
    a.lp_proc[r] = float(double(proc_val(z[t], false, temp)) - double(s.m) - log_S);
  }
}

}  // namespace

void launch_filtered_sampler(Context& ctx, ScratchAlloc& sa, const SplitArgs& a, int64_t R,
                             const ChunkPart* parts, bool any_k, bool any_p) {
  const int64_t V = a.V;
  FiltBufs f;
  f.st = sa.alloc<FiltRow>(R, "sampler filtered-row state");
  f.hist = sa.alloc<unsigned long long>(R * a.n_chunks * kBins, "sampler tie histograms");
  f.rowhist = sa.alloc<unsigned long long>(R * 2 * kBins, "sampler row histograms");
  f.rowcnt = sa.alloc<unsigned long long>(R * kBins, "sampler row id counts");
  f.csum = sa.alloc<unsigned long long>(R * a.n_chunks, "sampler kept-mass partials");
  f.cand = sa.alloc<uint32_t>(R * V, "sampler candidate lists");
  int ceil_log2 = 0;
  while ((int64_t(1) << ceil_log2) < V) ++ceil_log2;
  f.scale = std::ldexp(1.0, 63 - ceil_log2);  // V terms of at most 2^s stay below 2^63
  // Histogram and draw kernels: about one wave of blocks over all rows (four 256-thread blocks
  // per SM), each taking cpb consecutive chunks of its row or striding over its candidates.
  // GRPO_FILT_BLOCKS_PER_SM moves the target (measured 4 / 8 / 16: 0.203 / 0.214 / 0.221 ms at
  // R = 64, V = 151,936, top-p 0.9 + top-k 50; docs/BENCHMARKS.md).
  static const long per_sm = env_long("GRPO_FILT_BLOCKS_PER_SM", 4, 1, 64);
  const int64_t per_row = std::max<int64_t>(1, (int64_t(sm_count()) * per_sm + R - 1) / R);
  const int cpb = int((a.n_chunks + per_row - 1) / per_row);
  const dim3 grid(unsigned((a.n_chunks + cpb - 1) / cpb), unsigned(R)), chunks(unsigned(a.n_chunks), unsigned(R));
  const dim3 block(kPartThreads);
  launch_pdl(ctx, filt_init_kernel, dim3(unsigned(R)), block, 0, a, parts, f);
  for (int stage = any_k ? 0 : 4; stage < (any_p ? 8 : 4); ++stage) {
    launch_pdl(ctx, filt_hist_kernel, grid, block, 0, a, f, stage, cpb);
    if (stage == 0 || stage == 4) launch_pdl(ctx, filt_compact_kernel, chunks, block, 0, a, f, stage);
  }
  launch_pdl(ctx, filt_sample_kernel, grid, block, 0, a, f, cpb);
}

}  // namespace grpo::cuda::sampler
