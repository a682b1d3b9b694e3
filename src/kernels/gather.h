// Row gather: picks rows of a (T, C) activation, e.g. the last token of each
// sequence before the LM head, so that logits are computed only where needed.
#pragma once
#include "core/context.h"

#define GRPO_GATHER_OPS                                                                       \
  /* out (R,C) = x (T,C)[rows (R) i32]; rows are validated at the boundary (0 <= row < T) */  \
  void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& rows);    \
  /* dx (T,C) overwritten: zero, then dout (R,C) added at rows (in order r = 0..R-1) */       \
  void gather_rows_backward(Context& ctx, Tensor& dx, const Tensor& dout, const Tensor& rows);

namespace grpo { GRPO_GATHER_OPS }
namespace grpo::cpu { GRPO_GATHER_OPS }
namespace grpo::cuda { GRPO_GATHER_OPS }
