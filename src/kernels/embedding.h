// Token embedding lookup.
#pragma once
#include "core/context.h"

#define GRPO_EMBEDDING_OPS                                                                   \
  /* out (T,C) = table (V,C)[ids (T) i32]; ids are validated at the boundary */              \
  void embedding_forward(Context& ctx, Tensor& out, const Tensor& ids, const Tensor& table);  \
  /* dtable (V,C) f32 += scatter of dout (T,C) by ids (deterministic order on both backends) */ \
  void embedding_backward(Context& ctx, Tensor& dtable, const Tensor& dout, const Tensor& ids);

namespace grpo { GRPO_EMBEDDING_OPS }
namespace grpo::cpu { GRPO_EMBEDDING_OPS }
namespace grpo::cuda { GRPO_EMBEDDING_OPS }
