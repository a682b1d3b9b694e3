// CUDA logits_row_logprobs (kernels/row_logprob.h): one 256-thread block per row;
// a block max, then Σ exp(y − max) with f32 terms and f64 partial sums reduced in
// a fixed order (no atomics), so a row's value does not depend on the batch.
#include <cfloat>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/row_logprob.h"

namespace grpo::cuda {

namespace {

constexpr int kRowThreads = 256;

__global__ void row_logprob_kernel(float* __restrict__ logp, const float* __restrict__ logits,
                                   const int32_t* __restrict__ ids, const float* __restrict__ temperature,
                                   int64_t V) {
  __shared__ float s_max[kRowThreads];
  __shared__ double s_sum[kRowThreads];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * V;
  const float t = temperature[r];
  const float inv_t = t > 0.f ? 1.f / t : 1.f;
  float m = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) m = fmaxf(m, z[v] * inv_t);
  s_max[threadIdx.x] = m;
  __syncthreads();
  for (int w = kRowThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s_max[threadIdx.x] = fmaxf(s_max[threadIdx.x], s_max[threadIdx.x + w]);
    __syncthreads();
  }
  m = s_max[0];
  double s = 0;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) s += double(__expf(z[v] * inv_t - m));
  s_sum[threadIdx.x] = s;
  __syncthreads();
  for (int w = kRowThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s_sum[threadIdx.x] += s_sum[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int32_t id = ids[r];
    logp[r] = (id >= 0 && id < V) ? float(double(z[id] * inv_t - m) - log(s_sum[0])) : __int_as_float(0x7fc00000);
  }
}

}  // namespace

void logits_row_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& ids,
                         const Tensor& temperature) {
  const int64_t R = logits.shape[0], V = logits.shape[1];
  GRPO_CHECK_MSG(R <= int64_t(INT32_MAX), "logits_row_logprobs: too many rows");
  row_logprob_kernel<<<unsigned(R), kRowThreads, 0, stream_of(ctx)>>>(
      logp.ptr<float>(), logits.ptr<float>(), ids.ptr<int32_t>(), temperature.ptr<float>(), V);
  CUDA_CHECK_LAUNCH();
}

}  // namespace grpo::cuda
