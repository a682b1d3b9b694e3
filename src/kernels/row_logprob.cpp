// Dispatcher for logits_row_logprobs (see kernels/row_logprob.h).
#include "kernels/row_logprob.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void logits_row_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& ids,
                         const Tensor& temperature) {
  GRPO_CHECK_F32(ctx, logits);
  GRPO_CHECK_MSG(logits.ndim == 2, "logits must be (R, V)");
  const int64_t R = logits.shape[0];
  GRPO_CHECK_I32(ctx, ids);
  GRPO_CHECK_NUMEL(ids, R);
  GRPO_CHECK_F32(ctx, temperature);
  GRPO_CHECK_NUMEL(temperature, R);
  GRPO_CHECK_F32(ctx, logp);
  GRPO_CHECK_NUMEL(logp, R);
  if (R == 0) return;
  GRPO_DISPATCH(ctx, logits_row_logprobs, ctx, logp, logits, ids, temperature);
}

}  // namespace grpo
