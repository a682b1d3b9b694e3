// CUDA spec_verify (kernels/spec_verify.h): one 256-thread block per row. Reductions go
// through shared memory in a fixed tree order (no atomics), so a row's results repeat run to
// run and do not depend on the batch. The residual draw: threads own contiguous id segments,
// segment sums (f64) are scanned in thread order, and the thread whose segment crosses u·Σw
// walks it in ascending id order.
#include <cfloat>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/spec_verify.h"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 256;

struct VerifyShared {
  float f[kThreads];
  double d[kThreads];
  long long l[kThreads];
};

__device__ float block_max_f(float v, VerifyShared& sh) {
  sh.f[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh.f[threadIdx.x] = fmaxf(sh.f[threadIdx.x], sh.f[threadIdx.x + w]);
    __syncthreads();
  }
  const float r = sh.f[0];
  __syncthreads();
  return r;
}

__device__ double block_sum(double v, VerifyShared& sh) {
  sh.d[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh.d[threadIdx.x] += sh.d[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh.d[0];
  __syncthreads();
  return r;
}

__device__ long long block_max_l(long long v, VerifyShared& sh) {
  sh.l[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh.l[threadIdx.x] = max(sh.l[threadIdx.x], sh.l[threadIdx.x + w]);
    __syncthreads();
  }
  const long long r = sh.l[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) spec_verify_kernel(
    const float* __restrict__ logits, const float* __restrict__ P, const float* __restrict__ Q, int64_t V,
    int64_t Vq, const int32_t* __restrict__ q_index, const int32_t* __restrict__ p_rows, const int32_t* __restrict__ q_rows, const int32_t* __restrict__ draft,
    const int64_t* __restrict__ rng_key, const int64_t* __restrict__ rng_pos, int32_t* __restrict__ token,
    int32_t* __restrict__ accepted, float* __restrict__ lp_raw, float* __restrict__ lp_proc) {
  __shared__ VerifyShared sh;
  const int64_t i = blockIdx.x;
  const int64_t pr = p_rows[i];
  const int32_t qr = q_rows[i];
  const int32_t x = draft[i];
  const float* p = P + pr * V;
  const float* q = qr >= 0 ? Q + int64_t(qr) * Vq : nullptr;
  const float* z = logits + pr * V;
  const uint64_t key = uint64_t(rng_key[i]), pos = uint64_t(rng_pos[i]);
  auto qv = [&](int64_t j) -> double {
    if (!q) return j == x ? 1.0 : 0.0;
    if (!q_index) return double(q[j]);
    const int32_t c = q_index[j];
    return c < 0 ? 0.0 : double(q[c]);
  };
  auto wv = [&](int64_t j) -> double { return fmax(0.0, double(p[j]) - qv(j)); };

  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) m = fmaxf(m, z[j]);
  m = block_max_f(m, sh);
  double s = 0;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) s += double(expf(z[j] - m));
  s = block_sum(s, sh);

  const double u_a = sampling_uniform(spec_accept_key(key), pos);
  const bool acc = u_a * qv(x) < double(p[x]);
  int64_t t = x;
  if (!acc) {
    const int64_t seg = (V + kThreads - 1) / kThreads;
    const int64_t j0 = min(V, int64_t(threadIdx.x) * seg), j1 = min(V, j0 + seg);
    double mine = 0;
    long long last = -1;
    for (int64_t j = j0; j < j1; ++j) {
      const double w = wv(j);
      mine += w;
      if (w > 0) last = j;
    }
    last = block_max_l(last, sh);
    // Exclusive scan of the segment sums in thread order (thread 0, serially: fixed order).
    sh.d[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
      double run = 0;
      for (int k = 0; k < kThreads; ++k) {
        const double v = sh.d[k];
        sh.d[k] = run;
        run += v;
      }
    }
    __syncthreads();
    const double excl = sh.d[threadIdx.x];
    const double W = block_sum(threadIdx.x == kThreads - 1 ? excl + mine : 0.0, sh);
    if (W > 0) {
      const double target = double(sampling_uniform(spec_residual_key(key), pos)) * W;
      long long found = -1;
      if (excl <= target && target < excl + mine) {
        double cum = excl;
        for (int64_t j = j0; j < j1; ++j) {
          cum += wv(j);
          if (cum > target) { found = j; break; }
        }
      }
      found = block_max_l(found, sh);
      t = found >= 0 ? found : last;
    }
  }
  if (threadIdx.x == 0) {
    token[i] = int32_t(t);
    accepted[i] = acc ? 1 : 0;
    lp_raw[i] = float(double(z[t]) - double(m) - log(s));
    lp_proc[i] = float(log(double(p[t])));
  }
}

}  // namespace

void spec_verify(Context& ctx, SpecVerifyOutputs& out, const Tensor& logits, const Tensor& P, const Tensor& Q,
                 const SpecVerifyRows& rows) {
  const int64_t N = rows.draft.numel(), V = P.shape[1];
  GRPO_CHECK_MSG(N <= int64_t(INT32_MAX), "spec_verify: too many rows");
  spec_verify_kernel<<<unsigned(N), kThreads, 0, stream_of(ctx)>>>(
      logits.ptr<float>(), P.ptr<float>(), Q.defined() ? Q.ptr<float>() : nullptr, V, Q.defined() ? Q.shape[1] : 0,
      rows.q_index.defined() ? rows.q_index.ptr<int32_t>() : nullptr, rows.p_rows.ptr<int32_t>(),
      rows.q_rows.ptr<int32_t>(), rows.draft.ptr<int32_t>(), rows.rng_key.ptr<int64_t>(),
      rows.rng_pos.ptr<int64_t>(), out.token.ptr<int32_t>(), out.accepted.ptr<int32_t>(), out.lp_raw.ptr<float>(),
      out.lp_proc.ptr<float>());
  CUDA_CHECK_LAUNCH();
}

}  // namespace grpo::cuda
