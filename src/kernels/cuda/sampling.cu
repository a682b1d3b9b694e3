// CUDA token sampler following kernels/sampling.h step by step, one 1024-thread block
// per row, no sort. Every pass walks the row's V logits from global memory (L2).
//   raw lse          block max, then Σ exp(z − max) (f32 terms, f64 sum)
//   processed        y = z / T (banned, −inf stay −inf); m = max y; best = argmax (lowest id)
//   top-k            radix bisection on the order-preserving bits of y finds the k-th key K;
//                    ties at K are kept in id order up to k (block scan over ids)
//   top-p            the same bisection over the mass Σ q (q = exp(y − m)) inside the top-k
//                    set finds the shortest rank prefix with mass >= top_p·Q
//   min-p            drops kept ids with q < min_p except `best`
//   token            greedy: best; else inverse CDF over kept ids in ascending id order:
//                    threads own contiguous id segments, segment sums are scanned (f64),
//                    the thread whose segment crosses u·S walks it
//   top-n            n passes, each the best (score, id) ranked after the previous pick
// Rows with no top-k/top-p/min-p filter and no top-n list (the GRPO default) take a split
// path instead: one pass over the logits in chunks of kPartChunk = 4096 ids (many blocks per
// row), then one finishing block per row (both launched with PDL).
//   part    per chunk, from one read of its ids (16 contiguous ids per thread, in registers):
//           raw max m0_c, processed max m_c and argmax (lowest id), number of valid ids, then
//           s0_c = Σ exp(z − m0_c) and q_c = Σ exp(y − m_c) (f32 terms, f64 sums). The order of
//           q_c is fixed: each thread sums its 16 ids in id order, a warp takes an inclusive
//           shuffle scan of its 32 thread sums (lane 31 holds the warp total), the chunk adds
//           the 8 warp totals in order.
//   finish  per row: the chunk partials give m0, m, the argmax and the valid count; the chunk
//           masses in row units Q_c = q_c · exp(m_c − m) (f64) are added in chunk order into
//           prefixes P_c, S = P_last, lse = m0 + log Σ s0_c · exp(m0_c − m0). The first chunk
//           with P_c > u·S (binary search; P is monotone) is re-read and re-summed exactly as
//           the part kernel summed it, so the boundary after its last thread is P_c bitwise;
//           the first thread whose boundary exceeds u·S walks its 16 ids (fallback: the
//           chunk's last weighted id, reachable only through f64 rounding).
//   Filtered rows take the filtered split path below (radix select over key digits, many
//   blocks per row); every row when top-n lists are asked for (or V > 1024 chunks, or
//   GRPO_FILTERED_SPLIT=0) runs the one-block path inside the finish kernel.
// The terms are relative to the chunk max (the CPU's to the row max), so a token can differ
// from the CPU's only when u falls within f32 rounding of a bucket edge (as sampling.h allows).
// GRPO_SPLIT_SAMPLER_V1=1 (read once per process) selects the previous split path for A/B runs:
// three plain launches (chunk statistics, chunk sums relative to the row maxima, finish).
// A "rank prefix" is {i : key_i > K or (key_i == K and i <= idc)}. All reductions have a
// fixed order (no atomics whose order affects a value), so results repeat exactly run to
// run, and a row's results depend only on its logits and parameters, never on the batch.
// A row whose every id is banned gets token −1 (the dispatcher's caller must not send one;
// the CPU aborts).
#include <cmath>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/sampling.h"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBannedSmem = 256;

struct Shared {
  double d[kWarps];
  float f[kWarps];
  int32_t i[kWarps];
  int64_t idx;
  int32_t banned[kBannedSmem];
};

__device__ __forceinline__ uint32_t okey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ double block_sum_d(double v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh.d[warp] = v;
  __syncthreads();
  double r = sh.d[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// Warp argmax of (v, id): larger v wins, then lower id. Every lane gets the winner.
__device__ __forceinline__ void warp_argmax(float& v, int32_t& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
  }
}

// Block argmax of (v, id), the same order. Every thread gets the winner.
__device__ void block_argmax(float& v, int32_t& id, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(v, id);
  __syncthreads();
  if (lane == 0) { sh.f[warp] = v; sh.i[warp] = id; }
  __syncthreads();
  v = sh.f[lane];
  id = sh.i[lane];
  warp_argmax(v, id);
}

// Exclusive prefix of x over threads in order; *total gets the block total.
__device__ double block_exclusive_scan_d(double x, double* total, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  double excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0.0;
  __syncthreads();
  if (lane == 31) sh.d[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    double w = sh.d[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    sh.d[lane] = w;  // inclusive warp-total prefix
  }
  __syncthreads();
  *total = sh.d[kWarps - 1];
  return (warp > 0 ? sh.d[warp - 1] : 0.0) + excl;
}

// Threads own contiguous id segments. Returns the first id (ascending) at which the running
// sum of w reaches thr_of(total) (>= , or > when strict), -1 if rounding leaves none; *last
// gets the last id with w > 0 (or -1) and *total the sum.
template <class W, class Thr>
__device__ int64_t scan_find(int64_t V, W w, Thr thr_of, bool strict, Shared& sh, double* total, int64_t* last) {
  const int64_t seg = (V + kThreads - 1) / kThreads;
  const int64_t b = int64_t(threadIdx.x) * seg, e = b + seg < V ? b + seg : V;
  double s = 0.0;
  int64_t my_last = -1;
  for (int64_t i = b; i < e; ++i) {
    const double wi = w(i);
    if (wi > 0.0) { s += wi; my_last = i; }
  }
  const double pre = block_exclusive_scan_d(s, total, sh);
  const double thr = thr_of(*total);
  if (threadIdx.x == 0) sh.idx = INT64_MAX;
  __syncthreads();
  const bool hit = s > 0.0 && (strict ? (pre <= thr && pre + s > thr) : (pre < thr && pre + s >= thr));
  if (hit) {
    double c = pre;
    int64_t found = my_last;
    for (int64_t i = b; i < e; ++i) {
      const double wi = w(i);
      if (wi <= 0.0) continue;
      c += wi;
      if (strict ? c > thr : c >= thr) { found = i; break; }
    }
    atomicMin(reinterpret_cast<unsigned long long*>(&sh.idx), static_cast<unsigned long long>(found));
  }
  // last id with weight: block max over threads (ids are < 2^31)
  float lv = float(my_last);
  int32_t li = int32_t(my_last);
  block_argmax(lv, li, sh);  // contains barriers; sh.idx is settled after them
  *last = li;
  const int64_t r = sh.idx == INT64_MAX ? -1 : sh.idx;
  __syncthreads();
  return r;
}

// Processed logit of id i: −inf when banned, else z / temperature (temp 1: z itself).
__device__ __forceinline__ float processed(const float* z, int64_t i, float temp, const int32_t* bl, int nb) {
  const float v = z[i];
  for (int k = 0; k < nb; ++k)
    if (bl[k] == i) return -INFINITY;
  if (v == -INFINITY || temp == 1.f) return v;
  return v / temp;
}

// Row r's logits, banned ids and temperature (t_raw <= 0: greedy, processed with temp 1).
struct SampleRow {
  const float* z;
  const int32_t* bl;
  float t_raw, temp;
};
__device__ __forceinline__ SampleRow sample_row(int64_t r, const float* logits, int64_t V, const float* temperature,
                                                const int32_t* banned, int nb) {
  SampleRow w;
  w.z = logits + r * V;
  w.bl = banned ? banned + r * nb : nullptr;
  w.t_raw = temperature[r];
  w.temp = w.t_raw > 0.f ? w.t_raw : 1.f;
  return w;
}

__device__ void sample_row_full(
    int64_t r, Shared& sh, const float* __restrict__ logits, int64_t V, const float* __restrict__ temperature,
    const float* __restrict__ top_p, const int32_t* __restrict__ top_k, const float* __restrict__ min_p,
    const int64_t* __restrict__ rng_key, const int64_t* __restrict__ rng_pos, const int32_t* __restrict__ banned,
    int nb, int32_t* __restrict__ tokens, float* __restrict__ lp_raw, float* __restrict__ lp_proc,
    int32_t* __restrict__ top_ids, float* __restrict__ top_lps, int n_top, bool top_processed) {
  const float* z = logits + r * V;
  const int32_t* bl = banned ? banned + r * nb : nullptr;
  if (bl && nb <= kBannedSmem) {
    for (int k = threadIdx.x; k < nb; k += kThreads) sh.banned[k] = bl[k];
    __syncthreads();
    bl = sh.banned;
  }
  const float t_raw = temperature[r];
  const float temp = t_raw > 0.f ? t_raw : 1.f;
  auto yv = [&](int64_t i) -> float { return processed(z, i, temp, bl, nb); };

  // Raw log-softmax normaliser.
  float m0 = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) m0 = fmaxf(m0, z[i]);
  m0 = block_max(m0, sh.f);
  double s0 = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) s0 += double(expf(z[i] - m0));
  s0 = block_sum_d(s0, sh);
  const double lse0 = double(m0) + log(s0);

  // Processed logits: max, argmax (lowest id on ties), number of valid ids.
  float m = -INFINITY;
  int32_t best = INT32_MAX;
  double n_valid = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float y = yv(i);
    if (y == -INFINITY) continue;
    n_valid += 1.0;
    if (y > m || (y == m && int32_t(i) < best)) { m = y; best = int32_t(i); }
  }
  block_argmax(m, best, sh);
  n_valid = block_sum_d(n_valid, sh);
  if (n_valid == 0.0) {  // every id banned: caller bug
    if (threadIdx.x == 0) { tokens[r] = -1; lp_raw[r] = NAN; lp_proc[r] = NAN; }
    return;
  }
  auto qv = [&](float y) -> float { return y == -INFINITY ? 0.f : expf(y - m); };

  // Rank-prefix filters. Defaults keep every valid id.
  const int32_t k = top_k[r];
  const float p = top_p[r], mp = min_p[r];
  const bool use_k = k > 0 && double(k) < n_valid, use_p = p < 1.f;
  uint32_t kK = 0, kP = 0;
  int64_t idK = INT64_MAX, idP = INT64_MAX;
  auto in_k = [&](float y, int64_t i) {
    if (y == -INFINITY) return false;
    if (!use_k) return true;
    const uint32_t key = okey(y);
    return key > kK || (key == kK && i <= idK);
  };
  if (use_k) {
    for (int b = 31; b >= 0; --b) {  // largest K with #(key >= K) >= k
      const uint32_t cand = kK | (1u << b);
      double c = 0.0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const float y = yv(i);
        if (y != -INFINITY && okey(y) >= cand) c += 1.0;
      }
      if (block_sum_d(c, sh) >= double(k)) kK = cand;
    }
    double c_gt = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float y = yv(i);
      if (y != -INFINITY && okey(y) > kK) c_gt += 1.0;
    }
    c_gt = block_sum_d(c_gt, sh);
    double tot;
    int64_t last;
    const int64_t f = scan_find(
        V, [&](int64_t i) { const float y = yv(i); return (y != -INFINITY && okey(y) == kK) ? 1.0 : 0.0; },
        [&](double) { return double(k) - c_gt; }, false, sh, &tot, &last);
    idK = f >= 0 ? f : last;
  }
  auto in_kp = [&](float y, int64_t i) {
    if (!in_k(y, i)) return false;
    if (!use_p) return true;
    const uint32_t key = okey(y);
    return key > kP || (key == kP && i <= idP);
  };
  if (use_p) {
    double Q = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float y = yv(i);
      if (in_k(y, i)) Q += double(qv(y));
    }
    Q = block_sum_d(Q, sh);
    const double target = double(p) * Q;
    for (int b = 31; b >= 0; --b) {  // largest K with mass(key >= K) >= target
      const uint32_t cand = kP | (1u << b);
      double s = 0.0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) {
        const float y = yv(i);
        if (in_k(y, i) && okey(y) >= cand) s += double(qv(y));
      }
      if (block_sum_d(s, sh) >= target) kP = cand;
    }
    double s_gt = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float y = yv(i);
      if (in_k(y, i) && okey(y) > kP) s_gt += double(qv(y));
    }
    s_gt = block_sum_d(s_gt, sh);
    double tot;
    int64_t last;
    const int64_t f = scan_find(
        V, [&](int64_t i) { const float y = yv(i); return (in_k(y, i) && okey(y) == kP) ? double(qv(y)) : 0.0; },
        [&](double) { return target - s_gt; }, false, sh, &tot, &last);
    idP = f >= 0 ? f : last;
  }
  auto kept = [&](int64_t i, float y) {
    if (!in_kp(y, i)) return false;
    return !(mp > 0.f) || int32_t(i) == best || !(qv(y) < mp);
  };

  // Inverse CDF in ascending id order (the scan total is S = Σ_kept q).
  const float u = sampling_uniform(uint64_t(rng_key[r]), uint64_t(rng_pos[r]));
  double S;
  int64_t last_kept;
  const int64_t f = scan_find(
      V, [&](int64_t i) { const float y = yv(i); return kept(i, y) ? double(qv(y)) : 0.0; },
      [&](double tot) { return double(u) * tot; }, true, sh, &S, &last_kept);
  const int64_t t = t_raw > 0.f ? (f >= 0 ? f : last_kept) : int64_t(best);
  const double log_S = log(S);
  if (threadIdx.x == 0) {
    tokens[r] = int32_t(t);
    lp_raw[r] = float(double(z[t]) - lse0);
    lp_proc[r] = float(double(yv(t)) - double(m) - log_S);
  }

  // Top-n lists: pick j+1 is the best (score, id) ranked strictly after pick j.
  float prev_v = INFINITY;
  int32_t prev_i = -1;
  for (int j = 0; j < n_top; ++j) {
    float bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      float s;
      if (top_processed) {
        const float y = yv(i);
        s = kept(i, y) ? y : -INFINITY;
      } else {
        s = z[i];
      }
      const bool after = s < prev_v || (s == prev_v && int32_t(i) > prev_i);
      if (after && (s > bv || (s == bv && int32_t(i) < bi))) { bv = s; bi = int32_t(i); }
    }
    block_argmax(bv, bi, sh);
    if (threadIdx.x == 0) {
      top_ids[r * n_top + j] = bi;
      const double off = top_processed ? double(m) + log_S : lse0;
      top_lps[r * n_top + j] = bv == -INFINITY ? -INFINITY : float(double(bv) - off);
    }
    prev_v = bv;
    prev_i = bi;
  }
}


// Warp reduction of a chunk's statistics: raw max m0, valid count nv, processed max m and
// its argmax best (lowest id on ties); every lane gets the warp's values.
__device__ __forceinline__ void warp_chunk_stats(float& m0, int& nv, float& m, int32_t& best) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    nv += __shfl_xor_sync(0xffffffffu, nv, o);
    const float ov = __shfl_xor_sync(0xffffffffu, m, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best, o);
    if (ov > m || (ov == m && oi < best)) { m = ov; best = oi; }
  }
}

// ---- split path v1 (GRPO_SPLIT_SAMPLER_V1=1): stats, sums, finish ----
constexpr int kChunk = 8192;
constexpr int kSplitThreads = 256;

struct ChunkStats {
  float m0;      // raw max
  float m;       // processed max (−inf: no valid id)
  int32_t best;  // processed argmax, lowest id on ties (INT32_MAX: none)
  int32_t n_valid;
  double s0;     // Σ exp(z − m0_row)
  double q;      // Σ exp(y − m_row) over valid ids
};

__device__ __forceinline__ bool row_filtered(int64_t r, const float* top_p, const int32_t* top_k, const float* min_p,
                                             int n_top) {
  return n_top > 0 || top_k[r] > 0 || top_p[r] < 1.f || min_p[r] > 0.f;
}


// Reduction helpers for 256-thread blocks (8 warps), fixed order.
struct SplitShared {
  float f[8], f2[8];
  int32_t i[8], n[8];
  double d[8], d2[8];
};

__global__ void __launch_bounds__(kSplitThreads) sample_stats_kernel(
    const float* __restrict__ logits, int64_t V, int n_chunks, const float* __restrict__ temperature,
    const float* __restrict__ top_p, const int32_t* __restrict__ top_k, const float* __restrict__ min_p,
    const int32_t* __restrict__ banned, int nb, int n_top, ChunkStats* __restrict__ stats) {
  const int64_t r = blockIdx.y;
  if (row_filtered(r, top_p, top_k, min_p, n_top)) return;
  __shared__ SplitShared sh;
  const SampleRow w = sample_row(r, logits, V, temperature, banned, nb);
  const float *z = w.z, temp = w.temp;
  const int32_t* bl = w.bl;
  const int64_t b = int64_t(blockIdx.x) * kChunk, e = min(V, b + kChunk);
  float m0 = -INFINITY, m = -INFINITY;
  int32_t best = INT32_MAX, nv = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += kSplitThreads) {
    m0 = fmaxf(m0, z[i]);
    const float y = processed(z, i, temp, bl, nb);
    if (y == -INFINITY) continue;
    ++nv;
    if (y > m || (y == m && int32_t(i) < best)) { m = y; best = int32_t(i); }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_chunk_stats(m0, nv, m, best);
  if (lane == 0) { sh.f[warp] = m0; sh.f2[warp] = m; sh.i[warp] = best; sh.n[warp] = nv; }
  __syncthreads();
  if (threadIdx.x == 0) {
    ChunkStats c{-INFINITY, -INFINITY, INT32_MAX, 0, 0.0, 0.0};
    for (int w = 0; w < kSplitThreads / 32; ++w) {
      c.m0 = fmaxf(c.m0, sh.f[w]);
      c.n_valid += sh.n[w];
      if (sh.f2[w] > c.m || (sh.f2[w] == c.m && sh.i[w] < c.best)) { c.m = sh.f2[w]; c.best = sh.i[w]; }
    }
    stats[r * n_chunks + blockIdx.x] = c;
  }
}

__device__ __forceinline__ void row_maxima(const ChunkStats* st, int n_chunks, float* m0, float* m) {
  float a = -INFINITY, c = -INFINITY;
  for (int k = 0; k < n_chunks; ++k) {
    a = fmaxf(a, st[k].m0);
    c = fmaxf(c, st[k].m);
  }
  *m0 = a;
  *m = c;
}

__global__ void __launch_bounds__(kSplitThreads) sample_sums_kernel(
    const float* __restrict__ logits, int64_t V, int n_chunks, const float* __restrict__ temperature,
    const float* __restrict__ top_p, const int32_t* __restrict__ top_k, const float* __restrict__ min_p,
    const int32_t* __restrict__ banned, int nb, int n_top, ChunkStats* __restrict__ stats) {
  const int64_t r = blockIdx.y;
  if (row_filtered(r, top_p, top_k, min_p, n_top)) return;
  __shared__ SplitShared sh;
  const SampleRow w = sample_row(r, logits, V, temperature, banned, nb);
  const float *z = w.z, temp = w.temp;
  const int32_t* bl = w.bl;
  float m0, m;
  row_maxima(stats + r * n_chunks, n_chunks, &m0, &m);
  const int64_t b = int64_t(blockIdx.x) * kChunk, e = min(V, b + kChunk);
  double s0 = 0.0, q = 0.0;
  for (int64_t i = b + threadIdx.x; i < e; i += kSplitThreads) {
    s0 += double(expf(z[i] - m0));
    const float y = processed(z, i, temp, bl, nb);
    if (y != -INFINITY) q += double(expf(y - m));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
    q += __shfl_xor_sync(0xffffffffu, q, o);
  }
  if (lane == 0) { sh.d[warp] = s0; sh.d2[warp] = q; }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = 0.0, c = 0.0;
    for (int w = 0; w < kSplitThreads / 32; ++w) { a += sh.d[w]; c += sh.d2[w]; }
    stats[r * n_chunks + blockIdx.x].s0 = a;
    stats[r * n_chunks + blockIdx.x].q = c;
  }
}

__global__ void __launch_bounds__(kThreads) sample_finish_kernel(
    const float* __restrict__ logits, int64_t V, int n_chunks, const ChunkStats* __restrict__ stats,
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int32_t* __restrict__ top_k,
    const float* __restrict__ min_p, const int64_t* __restrict__ rng_key, const int64_t* __restrict__ rng_pos,
    const int32_t* __restrict__ banned, int nb, int32_t* __restrict__ tokens, float* __restrict__ lp_raw,
    float* __restrict__ lp_proc, int32_t* __restrict__ top_ids, float* __restrict__ top_lps, int n_top,
    bool top_processed) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  if (row_filtered(r, top_p, top_k, min_p, n_top)) {
    sample_row_full(r, sh, logits, V, temperature, top_p, top_k, min_p, rng_key, rng_pos, banned, nb, tokens, lp_raw,
                    lp_proc, top_ids, top_lps, n_top, top_processed);
    return;
  }
  const ChunkStats* st = stats + r * n_chunks;
  const SampleRow w = sample_row(r, logits, V, temperature, banned, nb);
  const float *z = w.z, t_raw = w.t_raw, temp = w.temp;
  const int32_t* bl = w.bl;
  float m0, m;
  row_maxima(st, n_chunks, &m0, &m);
  double s0 = 0.0, S = 0.0;
  int32_t best = INT32_MAX, n_valid = 0;
  float bm = -INFINITY;
  for (int k = 0; k < n_chunks; ++k) {
    s0 += st[k].s0;
    S += st[k].q;
    n_valid += st[k].n_valid;
    if (st[k].m > bm || (st[k].m == bm && st[k].best < best)) { bm = st[k].m; best = st[k].best; }
  }
  if (n_valid == 0) {  // every id banned: caller bug
    if (threadIdx.x == 0) { tokens[r] = -1; lp_raw[r] = NAN; lp_proc[r] = NAN; }
    return;
  }
  const double lse0 = double(m0) + log(s0);
  int64_t t = best;
  if (t_raw > 0.f) {
    const float u = sampling_uniform(uint64_t(rng_key[r]), uint64_t(rng_pos[r]));
    const double thr = double(u) * S;
    // First chunk whose running sum exceeds thr (the last chunk with mass if rounding leaves none).
    double pre = 0.0;
    int c = -1, last_c = -1;
    for (int k = 0; k < n_chunks; ++k) {
      if (st[k].q <= 0.0) continue;
      last_c = k;
      if (pre + st[k].q > thr) { c = k; break; }
      pre += st[k].q;
    }
    if (c < 0) {  // walk the last chunk with mass from its own start: take its last weighted id
      c = last_c;
      pre = -INFINITY;
    }
    const int64_t b = int64_t(c) * kChunk, e = min(V, b + kChunk);
    double tot;
    int64_t last;
    const int64_t f = scan_find(
        e - b,
        [&](int64_t i) { const float y = processed(z, b + i, temp, bl, nb); return y == -INFINITY ? 0.0 : double(expf(y - m)); },
        [&](double) { return pre == -INFINITY ? INFINITY : thr - pre; }, true, sh, &tot, &last);
    t = b + (f >= 0 ? f : last);
  }
  if (threadIdx.x == 0) {
    tokens[r] = int32_t(t);
    lp_raw[r] = float(double(z[t]) - lse0);
    lp_proc[r] = float(double(processed(z, t, temp, bl, nb)) - double(m) - log(S));
  }
}

// ---- split path v2 (default): part (one read of the logits), finish ----
constexpr int kPartThreads = 256;
constexpr int kPartWarps = kPartThreads / 32;
constexpr int kPer = 16;                         // contiguous ids per thread
constexpr int kPartChunk = kPartThreads * kPer;  // ids per part block
constexpr int kMaxParts = kThreads;              // chunks per row the finish block holds (one per thread)

struct ChunkPart {
  float m0;        // raw max (−inf: every raw logit −inf)
  float m;         // processed max (−inf: no valid id)
  int32_t best;    // processed argmax, lowest id on ties (INT32_MAX: none)
  int32_t n_valid;
  double s0;       // Σ exp(z − m0) over the chunk
  double q;        // Σ exp(y − m) over the chunk's valid ids, in the order of the file header
};

// Everything both v2 kernels read or write, by value.
struct SplitArgs {
  const float* logits;
  int64_t V;
  int n_chunks;
  const float* temperature;
  const float* top_p;
  const int32_t* top_k;
  const float* min_p;
  const int64_t* rng_key;
  const int64_t* rng_pos;
  const int32_t* banned;  // (R, nb) or null
  int nb;
  int32_t* tokens;
  float* lp_raw;
  float* lp_proc;
  int32_t* top_ids;
  float* top_lps;
  int n_top;
  bool top_processed;
  int filt_stages;  // 0: filtered rows take the one-block path; else 4 | 1 (top-k stages
                    // launched) | 2 (top-p stages launched)
};

// Row r takes the filtered split path: it is filtered and every search it needs was launched.
__device__ __forceinline__ bool filt_split_row(const SplitArgs& a, int64_t r) {
  if (a.filt_stages == 0 || !row_filtered(r, a.top_p, a.top_k, a.min_p, 0)) return false;
  return (a.top_k[r] <= 0 || (a.filt_stages & 1)) && (!(a.top_p[r] < 1.f) || (a.filt_stages & 2));
}

// Processed logit of a loaded z: −inf when banned or −inf, else z / temp (temp 1: z itself).
__device__ __forceinline__ float proc_val(float v, bool is_banned, float temp) {
  if (is_banned || v == -INFINITY) return -INFINITY;
  return temp == 1.f ? v : v / temp;
}
// Weight of a processed logit relative to the reference rq (a finite chunk maximum or 0).
__device__ __forceinline__ float q_term(float y, float rq) { return y == -INFINITY ? 0.f : expf(y - rq); }

// The kPer logits from id i0 (a multiple of kPer), −inf past V. Vector and scalar loads give
// the same values, so a row's results do not depend on its alignment inside the batch.
__device__ __forceinline__ void load_ids(const float* __restrict__ z, int64_t V, int64_t i0, float (&v)[kPer]) {
  if (i0 + kPer <= V && (reinterpret_cast<uintptr_t>(z + i0) & 15u) == 0) {
    const float4* p = reinterpret_cast<const float4*>(z + i0);
#pragma unroll
    for (int j = 0; j < kPer / 4; ++j) {
      const float4 a = p[j];
      v[4 * j] = a.x;
      v[4 * j + 1] = a.y;
      v[4 * j + 2] = a.z;
      v[4 * j + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = i0 + k < V ? z[i0 + k] : -INFINITY;
  }
}

// Bit k of the result: id cb + kPer·threadIdx.x + k is banned (threads >= kPartThreads get 0).
// Call from every thread of the block (barriers unless nb == 0); ORs commute, so the order in
// which threads set bits does not matter. sh_ban holds kPartThreads words.
__device__ uint32_t ban_mask(uint32_t* sh_ban, const int32_t* __restrict__ bl, int nb, int64_t cb) {
  if (nb == 0) return 0u;
  if (threadIdx.x < kPartThreads) sh_ban[threadIdx.x] = 0u;
  __syncthreads();
  for (int k = threadIdx.x; k < nb; k += blockDim.x) {
    const int32_t id = bl[k];
    const int64_t d = int64_t(id) - cb;
    if (id >= 0 && d >= 0 && d < kPartChunk) atomicOr(&sh_ban[d / kPer], 1u << unsigned(d % kPer));
  }
  __syncthreads();
  return threadIdx.x < kPartThreads ? sh_ban[threadIdx.x] : 0u;
}

// Inclusive scan over the 32 lanes (the fixed order of q_c, see the file header).
__device__ __forceinline__ double warp_incl_scan_d(double x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x = __dadd_rn(x, y);
  }
  return x;
}

struct PartShared {
  uint32_t ban[kPartThreads];
  float m0[kPartWarps], m[kPartWarps];
  int32_t best[kPartWarps], nv[kPartWarps];
  double s0[kPartWarps], q[kPartWarps];
};

// grid (n_chunks, R): chunk blockIdx.x of row blockIdx.y -> parts[row * n_chunks + chunk].
__global__ void __launch_bounds__(kPartThreads, 4) sample_part_kernel(SplitArgs a, ChunkPart* __restrict__ parts) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  if (row_filtered(r, a.top_p, a.top_k, a.min_p, 0) && !filt_split_row(a, r)) return;
  __shared__ PartShared sh;
  const float* z = a.logits + r * a.V;
  const float t_raw = a.temperature[r], temp = t_raw > 0.f ? t_raw : 1.f;
  const int64_t cb = int64_t(blockIdx.x) * kPartChunk, i0 = cb + int64_t(threadIdx.x) * kPer;
  float v[kPer];
  load_ids(z, a.V, i0, v);
  const uint32_t ban = ban_mask(sh.ban, a.banned ? a.banned + r * a.nb : nullptr, a.nb, cb);

  // Chunk maxima, argmax (ids ascend within a thread, so > keeps the lowest id) and count.
  float m0 = -INFINITY, m = -INFINITY;
  int32_t best = INT32_MAX, nv = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    m0 = fmaxf(m0, v[k]);
    const float y = proc_val(v[k], (ban >> k) & 1u, temp);
    if (y != -INFINITY) {
      ++nv;
      if (y > m) { m = y; best = int32_t(i0 + k); }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_chunk_stats(m0, nv, m, best);
  if (lane == 0) { sh.m0[warp] = m0; sh.m[warp] = m; sh.best[warp] = best; sh.nv[warp] = nv; }
  __syncthreads();
  float cm0 = -INFINITY, cm = -INFINITY;
  int32_t cbest = INT32_MAX, cnv = 0;
  for (int w = 0; w < kPartWarps; ++w) {
    cm0 = fmaxf(cm0, sh.m0[w]);
    cnv += sh.nv[w];
    if (sh.m[w] > cm || (sh.m[w] == cm && sh.best[w] < cbest)) { cm = sh.m[w]; cbest = sh.best[w]; }
  }

  // Sums relative to the chunk maxima (a reference of 0 when a maximum is −inf: every term is 0).
  const float r0 = cm0 == -INFINITY ? 0.f : cm0, rq = cm == -INFINITY ? 0.f : cm;
  double s0 = 0.0, q = 0.0;
  if (temp == 1.f && ban == 0u && r0 == rq) {
    // y == z and both references agree: the q terms are the raw terms (q_term of −inf is
    // expf(−inf) = 0 either way), summed in the same order.
#pragma unroll
    for (int k = 0; k < kPer; ++k) s0 += double(expf(v[k] - r0));
    q = s0;
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      s0 += double(expf(v[k] - r0));
      q += double(q_term(proc_val(v[k], (ban >> k) & 1u, temp), rq));
    }
  }
  const double qi = warp_incl_scan_d(q, lane);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s0 += __shfl_xor_sync(0xffffffffu, s0, o);
  if (lane == 31) sh.q[warp] = qi;
  if (lane == 0) sh.s0[warp] = s0;
  __syncthreads();
  if (threadIdx.x == 0) {
    ChunkPart p;
    p.m0 = cm0;
    p.m = cm;
    p.best = cbest;
    p.n_valid = cnv;
    double a0 = 0.0, aq = 0.0;
    for (int w = 0; w < kPartWarps; ++w) {
      a0 += sh.s0[w];
      aq = __dadd_rn(aq, sh.q[w]);
    }
    p.s0 = a0;
    p.q = aq;
    parts[r * a.n_chunks + blockIdx.x] = p;
  }
}

struct FinishShared {
  double P[kMaxParts];   // Q_c, then the prefixes P_c
  double sc[kMaxParts];  // exp(m_c − m)
  double W[kPartWarps];  // warp totals of the walked chunk
  uint32_t ban[kPartThreads];
  double pre, thr, S;
  int c, hit, last;
  int64_t tok;
};

// grid (R), kThreads: one row per block. split == 0: every row takes the one-block path.
__global__ void __launch_bounds__(kThreads) sample_finish_v2_kernel(SplitArgs a, const ChunkPart* __restrict__ parts,
                                                                    int split) {
  pdl_trigger();
  pdl_wait();
  __shared__ Shared sh;
  __shared__ FinishShared fs;
  const int64_t r = blockIdx.x;
  if (!split || row_filtered(r, a.top_p, a.top_k, a.min_p, a.n_top)) {
    if (split && filt_split_row(a, r)) return;  // the filtered split path's kernels write this row
    sample_row_full(r, sh, a.logits, a.V, a.temperature, a.top_p, a.top_k, a.min_p, a.rng_key, a.rng_pos, a.banned,
                    a.nb, a.tokens, a.lp_raw, a.lp_proc, a.top_ids, a.top_lps, a.n_top, a.top_processed);
    return;
  }
  const int n = a.n_chunks;  // <= kMaxParts (host)
  const ChunkPart* pr = parts + r * n;
  const float* z = a.logits + r * a.V;
  const int32_t* bl = a.banned ? a.banned + r * a.nb : nullptr;
  const float t_raw = a.temperature[r], temp = t_raw > 0.f ? t_raw : 1.f;

  // Row maxima, argmax (lowest id on ties) and valid count from the partials (thread k: chunk k).
  const bool own = int(threadIdx.x) < n;
  ChunkPart p{-INFINITY, -INFINITY, INT32_MAX, 0, 0.0, 0.0};
  if (own) p = pr[threadIdx.x];
  const float m0 = block_max(p.m0, sh.f);
  float m = p.m;
  int32_t best = p.best;
  block_argmax(m, best, sh);
  const double nv = block_sum_d(double(p.n_valid), sh);
  if (nv == 0.0) {  // every id banned: caller bug
    if (threadIdx.x == 0) { a.tokens[r] = -1; a.lp_raw[r] = NAN; a.lp_proc[r] = NAN; }
    return;
  }

  // Chunk masses in row units; the raw normaliser (fixed-order block sum).
  double e0 = 0.0;
  if (own) {
    const double sc = p.m == -INFINITY ? 0.0 : exp(double(p.m) - double(m));
    fs.sc[threadIdx.x] = sc;
    fs.P[threadIdx.x] = __dmul_rn(p.q, sc);
    if (p.m0 != -INFINITY) e0 = p.s0 * exp(double(p.m0) - double(m0));
  }
  const double s0 = block_sum_d(e0, sh);  // its barriers also publish fs.P and fs.sc
  const double lse0 = double(m0) + log(s0);
  const float u = sampling_uniform(uint64_t(a.rng_key[r]), uint64_t(a.rng_pos[r]));
  if (threadIdx.x == 0) {
    double acc = 0.0;
    for (int k = 0; k < n; ++k) {
      acc = __dadd_rn(acc, fs.P[k]);
      fs.P[k] = acc;
    }
    fs.S = acc;
    // First chunk with P_c > u·S (exists: u < 1 and S >= 1, the row max's own term).
    const double thr = __dmul_rn(double(u), acc);
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (fs.P[mid] > thr) hi = mid;
      else lo = mid + 1;
    }
    fs.c = lo;
    fs.pre = lo > 0 ? fs.P[lo - 1] : 0.0;
    fs.thr = thr;
    fs.hit = INT32_MAX;
    fs.last = -1;
  }
  __syncthreads();

  int64_t t = best;
  if (t_raw > 0.f) {
    // Re-sum chunk c exactly as the part kernel did (threads < kPartThreads); boundary after
    // thread j: pre + sc·(Σ earlier warp totals + inclusive lane sum), P_c after the last.
    const int c = fs.c;
    const double pre = fs.pre, thr = fs.thr, sc = fs.sc[c];
    const float pm = pr[c].m;  // finite: chunk c has mass
    const float rq = pm == -INFINITY ? 0.f : pm;
    const bool act = threadIdx.x < kPartThreads;
    const int64_t cb = int64_t(c) * kPartChunk, i0 = cb + int64_t(threadIdx.x) * kPer;
    float e[kPer];
    if (act) load_ids(z, a.V, i0, e);
    const uint32_t ban = ban_mask(fs.ban, bl, a.nb, cb);
    double q = 0.0;
    int64_t my_last = -1;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      e[k] = act ? q_term(proc_val(e[k], (ban >> k) & 1u, temp), rq) : 0.f;
      q += double(e[k]);
      if (e[k] > 0.f) my_last = i0 + k;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const double incl = warp_incl_scan_d(q, lane);
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    if (act && lane == 31) fs.W[warp] = incl;
    __syncthreads();
    double base = 0.0;
    if (act)
      for (int w = 0; w < warp; ++w) base = __dadd_rn(base, fs.W[w]);
    const double bound = __dadd_rn(pre, __dmul_rn(sc, __dadd_rn(base, incl)));
    if (act && q > 0.0 && bound > thr) atomicMin(&fs.hit, int(threadIdx.x));  // min: order-free
    if (my_last >= 0) atomicMax(&fs.last, int(my_last));                      // max: order-free
    __syncthreads();
    if (int(threadIdx.x) == fs.hit) {
      const double inner = __dadd_rn(base, excl);
      double part = 0.0;
      int64_t found = my_last;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (!(e[k] > 0.f)) continue;
        part += double(e[k]);
        if (__dadd_rn(pre, __dmul_rn(sc, __dadd_rn(inner, part))) > thr) { found = i0 + k; break; }
      }
      fs.tok = found;
    }
    __syncthreads();
    t = fs.hit == INT32_MAX ? int64_t(fs.last) : fs.tok;
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = int32_t(t);
    a.lp_raw[r] = float(double(z[t]) - lse0);
    a.lp_proc[r] = float(double(proc_val(z[t], false, temp)) - double(m) - log(fs.S));
  }
}


// ---- split path for filtered rows (top-k / top-p / min-p, no top-n lists) ----
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

bool filtered_split_enabled() {
  static const bool on = env_long("GRPO_FILTERED_SPLIT", 1, 0, 1) == 1;
  return on;
}

bool split_sampler_v1() {
  static const bool on = env_long("GRPO_SPLIT_SAMPLER_V1", 0, 0, 1) == 1;
  return on;
}

}  // namespace

void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits, const SamplingRows& rows,
                   bool top_processed) {
  GRPO_CHECK_MSG(logits.ndim == 2 && logits.dtype == DType::f32, "sample_tokens: logits must be (R,V) f32");
  const int64_t R = logits.shape[0], V = logits.shape[1];
  GRPO_CHECK_MSG(V < INT32_MAX, "sample_tokens: vocabulary too large");
  if (R == 0) return;
  GRPO_CHECK_MSG(R <= 65535, "sample_tokens: at most 65535 rows per launch");
  const int nb = rows.banned.defined() ? int(rows.banned.shape[1]) : 0;
  const int n_top = out.top_ids.defined() ? int(out.top_ids.shape[1]) : 0;
  const int32_t* bl = nb ? rows.banned.ptr<int32_t>() : nullptr;
  ScratchAlloc sa(ctx);
  if (split_sampler_v1()) {
    const int n_chunks = int((V + kChunk - 1) / kChunk);
    ChunkStats* stats = sa.alloc<ChunkStats>(R * n_chunks, "sampler chunk statistics");
    const dim3 sgrid{unsigned(n_chunks), unsigned(R), 1u};
    sample_stats_kernel<<<sgrid, kSplitThreads, 0, stream_of(ctx)>>>(
        logits.ptr<float>(), V, n_chunks, rows.temperature.ptr<float>(), rows.top_p.ptr<float>(),
        rows.top_k.ptr<int32_t>(), rows.min_p.ptr<float>(), bl, nb, n_top, stats);
    CUDA_CHECK_LAUNCH();
    sample_sums_kernel<<<sgrid, kSplitThreads, 0, stream_of(ctx)>>>(
        logits.ptr<float>(), V, n_chunks, rows.temperature.ptr<float>(), rows.top_p.ptr<float>(),
        rows.top_k.ptr<int32_t>(), rows.min_p.ptr<float>(), bl, nb, n_top, stats);
    CUDA_CHECK_LAUNCH();
    sample_finish_kernel<<<unsigned(R), kThreads, 0, stream_of(ctx)>>>(
        logits.ptr<float>(), V, n_chunks, stats, rows.temperature.ptr<float>(), rows.top_p.ptr<float>(),
        rows.top_k.ptr<int32_t>(), rows.min_p.ptr<float>(), rows.rng_key.ptr<int64_t>(),
        rows.rng_pos.ptr<int64_t>(), bl, nb, out.tokens.ptr<int32_t>(), out.logprob_raw.ptr<float>(),
        out.logprob_processed.ptr<float>(), n_top ? out.top_ids.ptr<int32_t>() : nullptr,
        n_top ? out.top_logprobs.ptr<float>() : nullptr, n_top, top_processed);
    CUDA_CHECK_LAUNCH();
    return;
  }
  SplitArgs a;
  a.logits = logits.ptr<float>();
  a.V = V;
  a.n_chunks = int((V + kPartChunk - 1) / kPartChunk);
  a.temperature = rows.temperature.ptr<float>();
  a.top_p = rows.top_p.ptr<float>();
  a.top_k = rows.top_k.ptr<int32_t>();
  a.min_p = rows.min_p.ptr<float>();
  a.rng_key = rows.rng_key.ptr<int64_t>();
  a.rng_pos = rows.rng_pos.ptr<int64_t>();
  a.banned = bl;
  a.nb = nb;
  a.tokens = out.tokens.ptr<int32_t>();
  a.lp_raw = out.logprob_raw.ptr<float>();
  a.lp_proc = out.logprob_processed.ptr<float>();
  a.top_ids = n_top ? out.top_ids.ptr<int32_t>() : nullptr;
  a.top_lps = n_top ? out.top_logprobs.ptr<float>() : nullptr;
  a.n_top = n_top;
  a.top_processed = top_processed;
  // With top-n lists every row is filtered: no part pass. Vocabularies above kMaxParts chunks
  // (4,194,304 ids) also take the one-block path.
  const bool split = n_top == 0 && a.n_chunks <= kMaxParts;
  // rows.filter_hint (host): -1 unknown, else which filters some row uses (0: none, so the
  // filtered kernels are not launched). A row whose filter's search is not launched takes the
  // one-block path, so any hint gives correct results.
  const int hint = rows.filter_hint;
  const bool any_k = hint < 0 || (hint & kFilterTopK), any_p = hint < 0 || (hint & kFilterTopP);
  a.filt_stages = split && hint != 0 && filtered_split_enabled() ? 4 | (any_k ? 1 : 0) | (any_p ? 2 : 0) : 0;
  ChunkPart* parts = nullptr;
  if (split) {
    parts = sa.alloc<ChunkPart>(R * a.n_chunks, "sampler chunk partials");
    launch_pdl(ctx, sample_part_kernel, dim3(unsigned(a.n_chunks), unsigned(R)), dim3(kPartThreads), 0, a, parts);
  }
  launch_pdl(ctx, sample_finish_v2_kernel, dim3(unsigned(R)), dim3(kThreads), 0, a,
             static_cast<const ChunkPart*>(parts), split ? 1 : 0);
  if (a.filt_stages == 0) return;
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
  static const long per_sm = env_long("GRPO_FILT_BLOCKS_PER_SM", 4, 1, 64);
  const int64_t per_row = std::max<int64_t>(1, (int64_t(sm_count()) * per_sm + R - 1) / R);
  const int cpb = int((a.n_chunks + per_row - 1) / per_row);
  const dim3 grid(unsigned((a.n_chunks + cpb - 1) / cpb), unsigned(R)), chunks(unsigned(a.n_chunks), unsigned(R));
  const dim3 block(kPartThreads);
  launch_pdl(ctx, filt_init_kernel, dim3(unsigned(R)), block, 0, a, static_cast<const ChunkPart*>(parts), f);
  for (int stage = any_k ? 0 : 4; stage < (any_p ? 8 : 4); ++stage) {
    launch_pdl(ctx, filt_hist_kernel, grid, block, 0, a, f, stage, cpb);
    if (stage == 0 || stage == 4) launch_pdl(ctx, filt_compact_kernel, chunks, block, 0, a, f, stage);
  }
  launch_pdl(ctx, filt_sample_kernel, grid, block, 0, a, f, cpb);
}

}  // namespace grpo::cuda
