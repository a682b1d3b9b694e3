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
// path instead, three launches over chunks of kChunk ids (many blocks per row):
//   stats   per chunk: raw max, processed max and argmax (lowest id), number of valid ids
//   sums    per chunk: Σ exp(z − m0) and Σ q (f64), with the row maxima combined in chunk order
//   finish  per row: chunk sums combined in chunk order give lse and S; the first chunk whose
//           running sum exceeds u·S is walked as above (fallback: its last weighted id).
//   Filtered rows run the one-block path inside the finish kernel.
// A "rank prefix" is {i : key_i > K or (key_i == K and i <= idc)}. All reductions have a
// fixed order, so results repeat exactly run to run. Sums are f64 as on the CPU, but in
// segment order, so a token can differ from the CPU's only when u falls within rounding
// of a bucket edge. A row whose every id is banned gets token −1 (the dispatcher's
// caller must not send one; the CPU aborts).
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

// Block argmax of (v, id): larger v wins, then lower id. Every thread gets the winner.
__device__ void block_argmax(float& v, int32_t& id, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
  }
  __syncthreads();
  if (lane == 0) { sh.f[warp] = v; sh.i[warp] = id; }
  __syncthreads();
  v = sh.f[lane];
  id = sh.i[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
  }
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


// ---- split path (unfiltered rows) ----
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
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    nv += __shfl_xor_sync(0xffffffffu, nv, o);
    const float ov = __shfl_xor_sync(0xffffffffu, m, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best, o);
    if (ov > m || (ov == m && oi < best)) { m = ov; best = oi; }
  }
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

}  // namespace

void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits, const SamplingRows& rows,
                   bool top_processed) {
  GRPO_CHECK_MSG(logits.ndim == 2 && logits.dtype == DType::f32, "sample_tokens: logits must be (R,V) f32");
  const int64_t R = logits.shape[0], V = logits.shape[1];
  GRPO_CHECK_MSG(V < INT32_MAX, "sample_tokens: vocabulary too large");
  if (R == 0) return;
  GRPO_CHECK_MSG(R <= 0x7fffffff, "sample_tokens: too many rows");
  const int nb = rows.banned.defined() ? int(rows.banned.shape[1]) : 0;
  const int n_top = out.top_ids.defined() ? int(out.top_ids.shape[1]) : 0;
  const int n_chunks = int((V + kChunk - 1) / kChunk);
  ScratchAlloc sa(ctx);
  ChunkStats* stats = sa.alloc<ChunkStats>(R * n_chunks, "sampler chunk statistics");
  const int32_t* bl = nb ? rows.banned.ptr<int32_t>() : nullptr;
  GRPO_CHECK_MSG(R <= 65535, "sample_tokens: at most 65535 rows per launch");
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
      rows.top_k.ptr<int32_t>(), rows.min_p.ptr<float>(), rows.rng_key.ptr<int64_t>(), rows.rng_pos.ptr<int64_t>(),
      bl, nb, out.tokens.ptr<int32_t>(), out.logprob_raw.ptr<float>(), out.logprob_processed.ptr<float>(),
      n_top ? out.top_ids.ptr<int32_t>() : nullptr, n_top ? out.top_logprobs.ptr<float>() : nullptr, n_top,
      top_processed);
  CUDA_CHECK_LAUNCH();
}

}  // namespace grpo::cuda
