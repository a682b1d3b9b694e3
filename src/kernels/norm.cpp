// Dispatcher for RMSNorm.
#include "kernels/norm.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void rmsnorm_forward(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x, const Tensor& w, float eps) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, w);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_MSG(x.ndim == 2, "rmsnorm_forward: x must be (N,C)");
  GRPO_CHECK_SHAPE2(out, x.shape[0], x.shape[1]);
  GRPO_CHECK_MSG(out.dtype == x.dtype && w.dtype == x.dtype, "rmsnorm_forward: x, w, out must share a dtype");
  GRPO_CHECK_NUMEL(w, x.shape[1]);
  if (rstd) {
    GRPO_CHECK_F32(ctx, *rstd);
    GRPO_CHECK_NUMEL(*rstd, x.shape[0]);
  }
  GRPO_DISPATCH(ctx, rmsnorm_forward, ctx, out, rstd, x, w, eps);
}

void rmsnorm_backward(Context& ctx, Tensor& dx, Tensor* dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, w);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_ACT(ctx, dx);
  GRPO_CHECK_MSG(x.ndim == 2, "rmsnorm_backward: x must be (N,C)");
  GRPO_CHECK_SHAPE2(dout, x.shape[0], x.shape[1]);
  GRPO_CHECK_SHAPE2(dx, x.shape[0], x.shape[1]);
  GRPO_CHECK_NUMEL(w, x.shape[1]);
  GRPO_CHECK_F32(ctx, rstd);
  GRPO_CHECK_NUMEL(rstd, x.shape[0]);
  if (dw) {
    GRPO_CHECK_F32(ctx, *dw);
    GRPO_CHECK_NUMEL(*dw, x.shape[1]);
  }
  GRPO_DISPATCH(ctx, rmsnorm_backward, ctx, dx, dw, dout, x, w, rstd);
}

}  // namespace grpo
