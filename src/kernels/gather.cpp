// Dispatcher for the row gather (embedding lookup, row picks).
#include "kernels/gather.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& src, const Tensor& idx) {
  GRPO_CHECK_ACT(ctx, src);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_I32(ctx, idx);
  GRPO_CHECK_MSG(src.ndim == 2, "gather_rows_forward: src must be (N,C)");
  GRPO_CHECK_SHAPE2(out, idx.numel(), src.shape[1]);
  GRPO_CHECK_MSG(out.dtype == src.dtype, "gather_rows_forward: out must have src's dtype");
  GRPO_DISPATCH(ctx, gather_rows_forward, ctx, out, src, idx);
}

void gather_ids(Context& ctx, Tensor& out, const Tensor& table, const Tensor& idx) {
  GRPO_CHECK_I32(ctx, out);
  GRPO_CHECK_I32(ctx, table);
  GRPO_CHECK_I32(ctx, idx);
  GRPO_CHECK_MSG(out.numel() == idx.numel(), "gather_ids: out must have idx's length");
  GRPO_DISPATCH(ctx, gather_ids, ctx, out, table, idx);
}

void gather_rows_backward(Context& ctx, Tensor& dsrc, const Tensor& dout, const Tensor& idx, bool accumulate) {
  GRPO_CHECK_ACT(ctx, dsrc);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_I32(ctx, idx);
  GRPO_CHECK_MSG(dsrc.ndim == 2, "gather_rows_backward: dsrc must be (N,C)");
  GRPO_CHECK_SHAPE2(dout, idx.numel(), dsrc.shape[1]);
  GRPO_CHECK_MSG(dsrc.dtype == DType::f32 || dsrc.dtype == dout.dtype,
                 "gather_rows_backward: dsrc must be f32 or have dout's dtype");
  GRPO_DISPATCH(ctx, gather_rows_backward, ctx, dsrc, dout, idx, accumulate);
}

}  // namespace grpo
