// Dispatcher for the fused LM head + log-probabilities.
#include "kernels/logprob.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

namespace {
void logprob_check(Context& ctx, const Tensor& h, const Tensor& w, const Tensor& targets, float temperature) {
  GRPO_CHECK_ACT(ctx, h);
  GRPO_CHECK_ACT(ctx, w);
  GRPO_CHECK_I32(ctx, targets);
  GRPO_CHECK_MSG(h.ndim == 2 && w.ndim == 2 && h.shape[1] == w.shape[1], "token_logprobs: h (N,C), w (V,C)");
  GRPO_CHECK_MSG(h.dtype == w.dtype, "token_logprobs: h and w dtypes differ");
  GRPO_CHECK_NUMEL(targets, h.shape[0]);
  GRPO_CHECK_MSG(temperature > 0.f, "token_logprobs: temperature must be > 0");
}
}  // namespace

void token_logprobs_forward(Context& ctx, Tensor& logp, Tensor& lse, Tensor* entropy, const Tensor& h,
                            const Tensor& w, const Tensor& targets, float temperature) {
  logprob_check(ctx, h, w, targets, temperature);
  const int64_t N = h.shape[0];
  GRPO_CHECK_F32(ctx, logp);
  GRPO_CHECK_NUMEL(logp, N);
  GRPO_CHECK_F32(ctx, lse);
  GRPO_CHECK_NUMEL(lse, N);
  if (entropy) {
    GRPO_CHECK_F32(ctx, *entropy);
    GRPO_CHECK_NUMEL(*entropy, N);
  }
  GRPO_DISPATCH(ctx, token_logprobs_forward, ctx, logp, lse, entropy, h, w, targets, temperature);
}

void token_logprobs_backward(Context& ctx, Tensor& dh, Tensor* dw, const Tensor& dlogp, const Tensor& h,
                             const Tensor& w, const Tensor& targets, const Tensor& lse, float temperature) {
  logprob_check(ctx, h, w, targets, temperature);
  const int64_t N = h.shape[0];
  GRPO_CHECK_ACT(ctx, dh);
  GRPO_CHECK_SHAPE2(dh, N, h.shape[1]);
  GRPO_CHECK_F32(ctx, dlogp);
  GRPO_CHECK_NUMEL(dlogp, N);
  GRPO_CHECK_F32(ctx, lse);
  GRPO_CHECK_NUMEL(lse, N);
  if (dw) {
    GRPO_CHECK_F32(ctx, *dw);
    GRPO_CHECK_SHAPE2(*dw, w.shape[0], w.shape[1]);
  }
  GRPO_DISPATCH(ctx, token_logprobs_backward, ctx, dh, dw, dlogp, h, w, targets, lse, temperature);
}

}  // namespace grpo
