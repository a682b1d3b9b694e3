// CPU reference of logits_row_logprobs (kernels/row_logprob.h): max, then the
// sum of exp(y − max) in double, per row.
#include <cmath>

#include "core/check.h"
#include "kernels/row_logprob.h"

namespace grpo::cpu {

void logits_row_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& ids,
                         const Tensor& temperature) {
  const int64_t R = logits.shape[0], V = logits.shape[1];
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* z = logits.ptr<float>() + r * V;
      const int32_t id = ids.ptr<int32_t>()[r];
      GRPO_CHECK_MSG(id >= 0 && id < V, "logits_row_logprobs: id outside the vocabulary");
      const float t = temperature.ptr<float>()[r];
      const float inv_t = t > 0.f ? 1.f / t : 1.f;
      float m = -INFINITY;
      for (int64_t v = 0; v < V; ++v) m = std::fmax(m, z[v] * inv_t);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(z[v] * inv_t - m));
      logp.ptr<float>()[r] = float(double(z[id] * inv_t - m) - std::log(s));
    }
  });
}

}  // namespace grpo::cpu
