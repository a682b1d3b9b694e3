// Dispatcher for spec_verify (see kernels/spec_verify.h).
#include "kernels/spec_verify.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void spec_verify(Context& ctx, SpecVerifyOutputs& out, const Tensor& logits, const Tensor& P, const Tensor& Q,
                 const SpecVerifyRows& rows) {
  GRPO_CHECK_F32(ctx, logits);
  GRPO_CHECK_F32(ctx, P);
  GRPO_CHECK_MSG(logits.ndim == 2 && P.ndim == 2 && P.shape[0] == logits.shape[0] && P.shape[1] == logits.shape[1],
                 "spec_verify: logits and P must both be (R_p, V)");
  if (rows.q_index.defined()) {
    GRPO_CHECK_I32(ctx, rows.q_index);
    GRPO_CHECK_MSG(rows.q_index.numel() == P.shape[1], "spec_verify: q_index must be (V) with P's V");
  }
  if (Q.defined()) {
    GRPO_CHECK_F32(ctx, Q);
    GRPO_CHECK_MSG(Q.ndim == 2 && (rows.q_index.defined() ? Q.shape[1] <= P.shape[1] : Q.shape[1] == P.shape[1]),
                   "spec_verify: Q must be (R_q, V) with P's V, or (R_q, V_q) with a q_index");
  }
  const int64_t N = rows.draft.numel();
  GRPO_CHECK_I32(ctx, rows.p_rows);
  GRPO_CHECK_NUMEL(rows.p_rows, N);
  GRPO_CHECK_I32(ctx, rows.q_rows);
  GRPO_CHECK_NUMEL(rows.q_rows, N);
  GRPO_CHECK_I32(ctx, rows.draft);
  GRPO_CHECK_DEV(ctx, rows.rng_key);
  GRPO_CHECK_MSG(rows.rng_key.dtype == DType::i64 && rows.rng_key.numel() == N, "rng_key must be (N) i64");
  GRPO_CHECK_DEV(ctx, rows.rng_pos);
  GRPO_CHECK_MSG(rows.rng_pos.dtype == DType::i64 && rows.rng_pos.numel() == N, "rng_pos must be (N) i64");
  GRPO_CHECK_I32(ctx, out.token);
  GRPO_CHECK_NUMEL(out.token, N);
  GRPO_CHECK_I32(ctx, out.accepted);
  GRPO_CHECK_NUMEL(out.accepted, N);
  GRPO_CHECK_F32(ctx, out.lp_raw);
  GRPO_CHECK_NUMEL(out.lp_raw, N);
  GRPO_CHECK_F32(ctx, out.lp_proc);
  GRPO_CHECK_NUMEL(out.lp_proc, N);
  if (N == 0) return;
  GRPO_DISPATCH(ctx, spec_verify, ctx, out, logits, P, Q, rows);
}

}  // namespace grpo
