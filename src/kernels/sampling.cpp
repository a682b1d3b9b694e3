// Dispatcher for token sampling: validates shapes, dtypes and devices once,
// then calls the backend (see kernels/sampling.h for the definition).
#include "kernels/sampling.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits, const SamplingRows& rows,
                   bool top_processed) {
  GRPO_CHECK_F32(ctx, logits);
  GRPO_CHECK_MSG(logits.ndim == 2, "logits must be (R, V)");
  const int64_t R = logits.shape[0];
  GRPO_CHECK_F32(ctx, rows.temperature);
  GRPO_CHECK_NUMEL(rows.temperature, R);
  GRPO_CHECK_F32(ctx, rows.top_p);
  GRPO_CHECK_NUMEL(rows.top_p, R);
  GRPO_CHECK_I32(ctx, rows.top_k);
  GRPO_CHECK_NUMEL(rows.top_k, R);
  GRPO_CHECK_F32(ctx, rows.min_p);
  GRPO_CHECK_NUMEL(rows.min_p, R);
  GRPO_CHECK_DEV(ctx, rows.rng_key);
  GRPO_CHECK_MSG(rows.rng_key.dtype == DType::i64 && rows.rng_key.numel() == R, "rng_key must be (R) i64");
  GRPO_CHECK_DEV(ctx, rows.rng_pos);
  GRPO_CHECK_MSG(rows.rng_pos.dtype == DType::i64 && rows.rng_pos.numel() == R, "rng_pos must be (R) i64");
  if (rows.banned.defined()) {
    GRPO_CHECK_I32(ctx, rows.banned);
    GRPO_CHECK_MSG(rows.banned.ndim == 2 && rows.banned.shape[0] == R, "banned must be (R, NB) i32");
  }
  GRPO_CHECK_I32(ctx, out.tokens);
  GRPO_CHECK_NUMEL(out.tokens, R);
  GRPO_CHECK_F32(ctx, out.logprob_raw);
  GRPO_CHECK_NUMEL(out.logprob_raw, R);
  GRPO_CHECK_F32(ctx, out.logprob_processed);
  GRPO_CHECK_NUMEL(out.logprob_processed, R);
  if (out.top_ids.defined()) {
    GRPO_CHECK_I32(ctx, out.top_ids);
    GRPO_CHECK_F32(ctx, out.top_logprobs);
    GRPO_CHECK_MSG(out.top_ids.ndim == 2 && out.top_ids.shape[0] == R, "top_ids must be (R, n)");
    GRPO_CHECK_MSG(out.top_ids.shape[1] <= logits.shape[1], "top_ids asks for more ids than the vocabulary has");
    GRPO_CHECK_MSG(out.top_logprobs.ndim == 2 && out.top_logprobs.shape[0] == R &&
                       out.top_logprobs.shape[1] == out.top_ids.shape[1],
                   "top_logprobs must have top_ids' shape");
  }
  if (out.probs.defined()) {
    GRPO_CHECK_F32(ctx, out.probs);
    GRPO_CHECK_MSG(out.probs.ndim == 2 && out.probs.shape[0] == R && out.probs.shape[1] == logits.shape[1],
                   "probs must be (R, V) like logits");
  }
  if (R == 0) return;
  GRPO_DISPATCH(ctx, sample_tokens, ctx, out, logits, rows, top_processed);
}

}  // namespace grpo
