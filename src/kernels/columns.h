// Column-range ops on row-major 2-D activations: adding a narrow (M, n) result
// into columns [col0, col0 + n) of a wide (M, N) one and reading such a range
// out scaled. LoRA uses them to land per-projection adapter outputs in the
// fused q/k/v and gate/up outputs, and to take those projections' gradients
// back out of the fused gradients.
#pragma once
#include "core/context.h"

#define GRPO_COLUMNS_OPS                                                                        \
  /* out[:, col0:col0+n] += scale · src, out (M,N), src (M,n); sum formed in f32 */             \
  void columns_add(Context& ctx, Tensor& out, const Tensor& src, int64_t col0, float scale);   \
  /* dst (M,n) = scale · src[:, col0:col0+n], src (M,N) */                                      \
  void columns_copy(Context& ctx, Tensor& dst, const Tensor& src, int64_t col0, float scale);

namespace grpo { GRPO_COLUMNS_OPS }
namespace grpo::cpu { GRPO_COLUMNS_OPS }
namespace grpo::cuda { GRPO_COLUMNS_OPS }
