// The sampler's one-block path: one 1024-thread block per row follows kernels/sampling.h step
// by step, no sort. Every pass walks the row's V logits from global memory (L2).
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
// It serves rows with top-n lists, rows whose filter search was not launched (filter hint,
// GRPO_FILTERED_SPLIT=0) and vocabularies beyond kMaxParts chunks; the finishing kernel of
// sampling_split.cu runs it. A "rank prefix" is {i : key_i > K or (key_i == K and i <= idc)}.
#pragma once
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sampling_common.cuh"
#include "kernels/sampling.h"

namespace grpo::cuda::sampler {

namespace {

struct Shared {
  double d[kWarps];
  float f[kWarps];
  int32_t i[kWarps];
  int64_t idx;
  int32_t banned[kBannedSmem];
};

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

__device__ void sample_row_full(
    int64_t r, Shared& sh, const float* __restrict__ logits, int64_t V, const float* __restrict__ temperature,
    const float* __restrict__ top_p, const int32_t* __restrict__ top_k, const float* __restrict__ min_p,
    const int64_t* __restrict__ rng_key, const int64_t* __restrict__ rng_pos, const int32_t* __restrict__ banned,
    int nb, int32_t* __restrict__ tokens, float* __restrict__ lp_raw, float* __restrict__ lp_proc,
    int32_t* __restrict__ top_ids, float* __restrict__ top_lps, int n_top, bool top_processed,
    float* __restrict__ probs) {
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
  if (probs) {
    float* pr = probs + r * V;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float y = yv(i);
      pr[i] = kept(i, y) ? float(double(qv(y)) / S) : 0.f;
    }
  }
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

}  // namespace

}  // namespace grpo::cuda::sampler
