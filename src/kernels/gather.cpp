// Dispatcher for the row gather.
#include "kernels/gather.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& rows) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_I32(ctx, rows);
  GRPO_CHECK_MSG(x.ndim == 2, "gather_rows_forward: x must be (T,C)");
  GRPO_CHECK_SHAPE2(out, rows.numel(), x.shape[1]);
  GRPO_CHECK_MSG(out.dtype == x.dtype, "gather_rows_forward: out must have x's dtype");
  GRPO_DISPATCH(ctx, gather_rows_forward, ctx, out, x, rows);
}

void gather_rows_backward(Context& ctx, Tensor& dx, const Tensor& dout, const Tensor& rows) {
  GRPO_CHECK_ACT(ctx, dx);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_I32(ctx, rows);
  GRPO_CHECK_MSG(dx.ndim == 2, "gather_rows_backward: dx must be (T,C)");
  GRPO_CHECK_SHAPE2(dout, rows.numel(), dx.shape[1]);
  GRPO_CHECK_MSG(dout.dtype == dx.dtype, "gather_rows_backward: dout must have dx's dtype");
  GRPO_DISPATCH(ctx, gather_rows_backward, ctx, dx, dout, rows);
}

}  // namespace grpo
