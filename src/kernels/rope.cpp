// Dispatcher for rotary embeddings. Positions must lie inside the table
// (the caller sizes the table from the model's maximum context). The fused
// cache writes accept caches of the activations' dtype or f8e4m3 (validate.h).
#include "kernels/rope.h"

#include <string>

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

namespace {
void rope_check(Context& ctx, const Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_I32(ctx, positions);
  GRPO_CHECK_F32(ctx, cos);
  GRPO_CHECK_F32(ctx, sin);
  GRPO_CHECK_MSG(x.ndim == 3 && x.shape[2] % 2 == 0, "rope: x must be (T,H,D) with even D");
  GRPO_CHECK_NUMEL(positions, x.shape[0]);
  GRPO_CHECK_MSG(cos.ndim == 2 && cos.shape[1] == x.shape[2] / 2, "rope: cos must be (P, D/2)");
  GRPO_CHECK_MSG(sin.ndim == 2 && sin.shape[0] == cos.shape[0] && sin.shape[1] == cos.shape[1], "rope: sin shape");
}

// The fused writes from the q/k/v projection rows: q (T,Hq,D), qkv (T,(Hq+2·Hkv)·D), the caches
// and the slot mapping (messages name the op).
void qkv_cache_write_check(Context& ctx, const char* op, const Tensor& q, const Tensor& qkv, const Tensor& positions,
                           const Tensor& cos, const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                           const PagedAttnMeta& meta) {
  rope_check(ctx, q, positions, cos, sin);
  GRPO_CHECK_ACT(ctx, qkv);
  GRPO_CHECK_KV_CACHE(ctx, op, k_cache, v_cache, q.dtype);
  GRPO_CHECK_MSG(k_cache.ndim == 4 && k_cache.shape[3] == q.shape[2] && v_cache.numel() == k_cache.numel(),
                 (std::string(op) + ": caches must be (n_blocks, block_size, Hkv, D)").c_str());
  GRPO_CHECK_MSG(qkv.ndim == 2 && qkv.shape[0] == q.shape[0] && qkv.dtype == q.dtype &&
                     qkv.shape[1] == (q.shape[1] + 2 * k_cache.shape[2]) * q.shape[2],
                 (std::string(op) + ": qkv must be (T, (Hq + 2·Hkv)·D) of q's dtype").c_str());
  GRPO_CHECK_I32(ctx, meta.slot_mapping);
  GRPO_CHECK_NUMEL(meta.slot_mapping, q.shape[0]);
}
}  // namespace

void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_check(ctx, x, positions, cos, sin);
  GRPO_DISPATCH(ctx, rope_forward, ctx, x, positions, cos, sin);
}

void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_check(ctx, dx, positions, cos, sin);
  GRPO_DISPATCH(ctx, rope_backward, ctx, dx, positions, cos, sin);
}

void rope_qk_cache_write(Context& ctx, Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& cos, const Tensor& sin, Tensor& k_cache, Tensor& v_cache,
                         const PagedAttnMeta& meta) {
  rope_check(ctx, q, positions, cos, sin);
  rope_check(ctx, k, positions, cos, sin);
  GRPO_CHECK_ACT(ctx, v);
  GRPO_CHECK_MSG(k.shape[0] == q.shape[0] && k.shape[2] == q.shape[2] && v.numel() == k.numel() &&
                     v.dtype == k.dtype && q.dtype == k.dtype,
                 "rope_qk_cache_write: q (T,Hq,D), k and v (T,Hkv,D) of one dtype");
  GRPO_CHECK_KV_CACHE(ctx, "rope_qk_cache_write", k_cache, v_cache, k.dtype);
  GRPO_CHECK_MSG(k_cache.ndim == 4 && k_cache.shape[2] == k.shape[1] && k_cache.shape[3] == k.shape[2] &&
                     v_cache.numel() == k_cache.numel(),
                 "rope_qk_cache_write: caches must be (n_blocks, block_size, Hkv, D)");
  GRPO_CHECK_I32(ctx, meta.slot_mapping);
  GRPO_CHECK_NUMEL(meta.slot_mapping, q.shape[0]);
  GRPO_DISPATCH(ctx, rope_qk_cache_write, ctx, q, k, v, positions, cos, sin, k_cache, v_cache, meta);
}

void rope_qkv_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                          const Tensor& sin, Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  qkv_cache_write_check(ctx, "rope_qkv_cache_write", q, qkv, positions, cos, sin, k_cache, v_cache, meta);
  GRPO_DISPATCH(ctx, rope_qkv_cache_write, ctx, q, qkv, positions, cos, sin, k_cache, v_cache, meta);
}

void qk_norm_rope_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                              float eps, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                              Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  GRPO_CHECK_ACT(ctx, q_norm);
  GRPO_CHECK_ACT(ctx, k_norm);
  GRPO_CHECK_MSG(q_norm.numel() == q.shape[2] && k_norm.numel() == q.shape[2] && q_norm.dtype == q.dtype &&
                     k_norm.dtype == q.dtype,
                 "qk_norm_rope_cache_write: q_norm and k_norm must be (D) of q's dtype");
  qkv_cache_write_check(ctx, "qk_norm_rope_cache_write", q, qkv, positions, cos, sin, k_cache, v_cache, meta);
  GRPO_DISPATCH(ctx, qk_norm_rope_cache_write, ctx, q, qkv, q_norm, k_norm, eps, positions, cos, sin, k_cache,
                v_cache, meta);
}

}  // namespace grpo
