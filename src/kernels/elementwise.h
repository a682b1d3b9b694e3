// Elementwise ops: residual adds, SwiGLU, q/k/v split, casts, scaling.
#pragma once
#include "core/context.h"

#define GRPO_ELEMENTWISE_OPS                                                                  \
  /* a += b (same shape and dtype) */                                                         \
  void add_inplace(Context& ctx, Tensor& a, const Tensor& b);                                 \
  /* x *= s */                                                                                \
  void scale_inplace(Context& ctx, Tensor& x, float s);                                       \
  /* dst = src converted (f32 <-> bf16 <-> f16), same numel */                                \
  void cast(Context& ctx, Tensor& dst, const Tensor& src);                                    \
  /* out (N,F) = silu(gate) * up with gate_up (N,2F): gate = [:, :F], up = [:, F:] */         \
  void swiglu_forward(Context& ctx, Tensor& out, const Tensor& gate_up);                      \
  /* dgate_up (N,2F) overwritten from dout (N,F) */                                           \
  void swiglu_backward(Context& ctx, Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up); \
  /* qkv (T, (Hq+2·Hkv)·D) -> q (T,Hq,D), k (T,Hkv,D), v (T,Hkv,D) */                         \
  void qkv_split(Context& ctx, Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);           \
  /* inverse of qkv_split (for gradients): dqkv (T,(Hq+2·Hkv)·D) overwritten */                \
  void qkv_merge(Context& ctx, Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);

namespace grpo { GRPO_ELEMENTWISE_OPS }
namespace grpo::cpu { GRPO_ELEMENTWISE_OPS }
namespace grpo::cuda { GRPO_ELEMENTWISE_OPS }
