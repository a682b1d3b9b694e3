// Optimizer kernels over flat f32 buffers.
#pragma once
#include "core/context.h"

namespace grpo {
struct AdamWParams {
  float lr = 1e-6f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // grads are multiplied by this first (clipping factor)
};
}  // namespace grpo

#define GRPO_OPTIM_OPS                                                                              \
  /* master, grad, m, v (n) f32; param (n) is the compute copy (bf16 or f32) written from master;   \
     param may alias master when both are f32 (then pass the same tensor) */                        \
  void adamw_step(Context& ctx, Tensor& master, Tensor& param, const Tensor& grad, Tensor& m,         \
                  Tensor& v, const AdamWParams& p);                                                 \
  /* returns Σ grad² (f64 on the host); deterministic */                                            \
  double sum_squares(Context& ctx, const Tensor& grad);

namespace grpo { GRPO_OPTIM_OPS }
namespace grpo::cpu { GRPO_OPTIM_OPS }
namespace grpo::cuda { GRPO_OPTIM_OPS }
