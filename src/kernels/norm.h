// RMSNorm: y = x / sqrt(mean(x²) + eps) · w, computed in f32. Also used per
// head for Qwen3's q/k norm (x viewed as (T·H, D)).
#pragma once
#include "core/context.h"

#define GRPO_NORM_OPS                                                                       \
  /* out (N,C) from x (N,C), w (C); rstd (N) f32 optional (saved for backward) */           \
  void rmsnorm_forward(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x,            \
                       const Tensor& w, float eps);                                          \
  /* dx (N,C) overwritten; dw (C) f32 accumulated (may be null); rstd from forward */        \
  void rmsnorm_backward(Context& ctx, Tensor& dx, Tensor* dw, const Tensor& dout,            \
                        const Tensor& x, const Tensor& w, const Tensor& rstd);

namespace grpo { GRPO_NORM_OPS }
namespace grpo::cpu { GRPO_NORM_OPS }
namespace grpo::cuda { GRPO_NORM_OPS }
