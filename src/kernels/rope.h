// Rotary position embedding in Hugging Face's rotate_half convention: for
// i < D/2 the pair is (x[i], x[i + D/2]). The table holds cos and sin for
// every position, already including rope scaling (model/rope_table builds it).
#pragma once
#include "core/context.h"

#define GRPO_ROPE_OPS                                                                        \
  /* x (T,H,D) rotated in place; positions (T) i32; cos, sin (P, D/2) f32 */                 \
  void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos,     \
                    const Tensor& sin);                                                      \
  /* dx (T,H,D) in place: the inverse rotation (rotation by -θ) */                           \
  void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos,   \
                     const Tensor& sin);

namespace grpo { GRPO_ROPE_OPS }
namespace grpo::cpu { GRPO_ROPE_OPS }
namespace grpo::cuda { GRPO_ROPE_OPS }
