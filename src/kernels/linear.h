// Dense layers (GEMM). Weights are stored as in Hugging Face: w (N, K), so
// out = x · wᵀ. CUDA uses cuBLASLt (bf16 in, f32 accumulate).
#pragma once
#include "core/context.h"

#define GRPO_LINEAR_OPS                                                                          \
  /* out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias (N)]; accumulate: out += instead of = */            \
  void linear_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w,              \
                      const Tensor* bias, bool accumulate);                                      \
  /* dx (M,K) = dout·w (or += when accumulate_dx); dw (N,K) f32 += doutᵀ·x; db (N) f32 += Σ dout \
     Any of dx, dw, db may be null. */                                                           \
  void linear_backward(Context& ctx, Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dout,     \
                       const Tensor& x, const Tensor& w, bool accumulate_dx);

namespace grpo { GRPO_LINEAR_OPS }
namespace grpo::cpu { GRPO_LINEAR_OPS }
namespace grpo::cuda { GRPO_LINEAR_OPS }
