// Dispatcher for the column-range ops (kernels/columns.h).
#include "kernels/columns.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

namespace {
void columns_check(Context& ctx, const Tensor& wide, const Tensor& narrow, int64_t col0, const char* op) {
  GRPO_CHECK_ACT(ctx, wide);
  GRPO_CHECK_ACT(ctx, narrow);
  GRPO_CHECK_MSG(wide.dtype == narrow.dtype, op);
  GRPO_CHECK_MSG(wide.ndim == 2 && narrow.ndim == 2 && wide.shape[0] == narrow.shape[0], op);
  GRPO_CHECK_MSG(col0 >= 0 && col0 + narrow.shape[1] <= wide.shape[1], op);
}
}  // namespace

void columns_add(Context& ctx, Tensor& out, const Tensor& src, int64_t col0, float scale) {
  columns_check(ctx, out, src, col0, "columns_add: out (M,N), src (M,n) of one dtype, col0 + n <= N");
  GRPO_DISPATCH(ctx, columns_add, ctx, out, src, col0, scale);
}

void columns_copy(Context& ctx, Tensor& dst, const Tensor& src, int64_t col0, float scale) {
  columns_check(ctx, src, dst, col0, "columns_copy: src (M,N), dst (M,n) of one dtype, col0 + n <= N");
  GRPO_DISPATCH(ctx, columns_copy, ctx, dst, src, col0, scale);
}

}  // namespace grpo
