// Rotary position embedding in Hugging Face's rotate_half convention: for
// i < D/2 the pair is (x[i], x[i + D/2]). The table holds cos and sin for
// every position, already including rope scaling (model/rope_table builds it).
#pragma once
#include "core/context.h"
#include "kernels/attention.h"

#define GRPO_ROPE_OPS                                                                        \
  /* x (T,H,D) rotated in place; positions (T) i32; cos, sin (P, D/2) f32 */                 \
  void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos,     \
                    const Tensor& sin);                                                      \
  /* dx (T,H,D) in place: the inverse rotation (rotation by -θ) */                           \
  void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos,   \
                     const Tensor& sin);                                                     \
  /* The engine's per-layer step: q (T,Hq,D) and k (T,Hkv,D) rotated in place, then the   */ \
  /* rotated k rows and v rows written to their cache slots (= rope_forward(q),            */ \
  /* rope_forward(k), kv_cache_write; one fused kernel on CUDA)                            */ \
  void rope_qk_cache_write(Context& ctx, Tensor& q, Tensor& k, const Tensor& v,              \
                           const Tensor& positions, const Tensor& cos, const Tensor& sin,    \
                           Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta);            \
  /* The same from the fused projection: qkv (T,(Hq+2·Hkv)·D) = [q | k | v] per row; rotated  */ \
  /* q written to q (T,Hq,D); rotated k and v rows go to the cache slots only                */ \
  void rope_qkv_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& positions, \
                            const Tensor& cos, const Tensor& sin, Tensor& k_cache,               \
                            Tensor& v_cache, const PagedAttnMeta& meta);                          \
  /* Qwen3's q/k-norm step from the fused projection: q and k heads RMS-normalised with     */ \
  /* q_norm / k_norm (D), then rotated; q to q (T,Hq,D), k and v rows to the cache slots    */ \
  void qk_norm_rope_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& q_norm, \
                                const Tensor& k_norm, float eps, const Tensor& positions,    \
                                const Tensor& cos, const Tensor& sin, Tensor& k_cache,       \
                                Tensor& v_cache, const PagedAttnMeta& meta);

namespace grpo { GRPO_ROPE_OPS }
namespace grpo::cpu { GRPO_ROPE_OPS }
namespace grpo::cuda { GRPO_ROPE_OPS }
