// Dispatcher for the embedding lookup.
#include "kernels/embedding.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void embedding_forward(Context& ctx, Tensor& out, const Tensor& ids, const Tensor& table) {
  GRPO_CHECK_I32(ctx, ids);
  GRPO_CHECK_ACT(ctx, table);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_MSG(table.ndim == 2, "embedding_forward: table must be (V,C)");
  GRPO_CHECK_SHAPE2(out, ids.numel(), table.shape[1]);
  GRPO_CHECK_MSG(out.dtype == table.dtype, "embedding_forward: out must have the table's dtype");
  GRPO_DISPATCH(ctx, embedding_forward, ctx, out, ids, table);
}

void embedding_backward(Context& ctx, Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  GRPO_CHECK_I32(ctx, ids);
  GRPO_CHECK_F32(ctx, dtable);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_MSG(dtable.ndim == 2, "embedding_backward: dtable must be (V,C)");
  GRPO_CHECK_SHAPE2(dout, ids.numel(), dtable.shape[1]);
  GRPO_DISPATCH(ctx, embedding_backward, ctx, dtable, dout, ids);
}

}  // namespace grpo
