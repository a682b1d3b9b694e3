// The sampler's split path for unfiltered rows (no top-k/top-p/min-p, no top-n lists: the GRPO
// default): one pass over the logits in chunks of kPartChunk = 4096 ids (many blocks per row),
// then one finishing block per row, both launched with PDL.
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
// The terms are relative to the chunk max (the CPU's to the row max), so a token can differ
// from the CPU's only when u falls within f32 rounding of a bucket edge (as sampling.h allows).
// The finishing kernel also runs the one-block path (sampling_one_block.cuh) for the rows that
// neither split path takes, and skips the rows the filtered path (sampling_filtered.cu) writes.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sampling_common.cuh"
#include "kernels/cuda/sampling_one_block.cuh"
#include "kernels/sampling.h"

namespace grpo::cuda::sampler {

namespace {

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

// Weight of a processed logit relative to the reference rq (a finite chunk maximum or 0).
__device__ __forceinline__ float q_term(float y, float rq) { return y == -INFINITY ? 0.f : expf(y - rq); }

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
__global__ void __launch_bounds__(kThreads) sample_finish_kernel(SplitArgs a, const ChunkPart* __restrict__ parts,
                                                                 int split) {
  pdl_trigger();
  pdl_wait();
  __shared__ Shared sh;
  __shared__ FinishShared fs;
  const int64_t r = blockIdx.x;
  if (!split || row_filtered(r, a.top_p, a.top_k, a.min_p, a.n_top)) {
    if (split && filt_split_row(a, r)) return;  // the filtered split path's kernels write this row
    sample_row_full(r, sh, a.logits, a.V, a.temperature, a.top_p, a.top_k, a.min_p, a.rng_key, a.rng_pos, a.banned,
                    a.nb, a.tokens, a.lp_raw, a.lp_proc, a.top_ids, a.top_lps, a.n_top, a.top_processed,
                    a.probs);
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

}  // namespace

void launch_split_sampler(Context& ctx, const SplitArgs& a, int64_t R, ChunkPart* parts) {
  if (parts)
    launch_pdl(ctx, sample_part_kernel, dim3(unsigned(a.n_chunks), unsigned(R)), dim3(kPartThreads), 0, a, parts);
  launch_pdl(ctx, sample_finish_kernel, dim3(unsigned(R)), dim3(kThreads), 0, a,
             static_cast<const ChunkPart*>(parts), parts ? 1 : 0);
}

}  // namespace grpo::cuda::sampler
