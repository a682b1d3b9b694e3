// Dispatcher for attention. Metadata shapes are checked here; their values
// (positions inside the block table, slots inside the pool) are the engine's
// invariants and are asserted on the CPU only where cheap. A KV cache holds
// the activations' dtype or f8e4m3 (see kv_cache_dtype_ok in validate.h).
#include "kernels/attention.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

namespace {
void varlen_check(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const AttnVarlen& meta) {
  GRPO_CHECK_ACT(ctx, q);
  GRPO_CHECK_ACT(ctx, k);
  GRPO_CHECK_ACT(ctx, v);
  GRPO_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3, "attention: q (T,Hq,D), k, v (T,Hkv,D)");
  GRPO_CHECK_MSG(k.shape[0] == q.shape[0] && v.shape[0] == q.shape[0] && k.shape[2] == q.shape[2] &&
                     v.shape[1] == k.shape[1] && v.shape[2] == k.shape[2],
                 "attention: q (T,Hq,D), k, v (T,Hkv,D)");
  GRPO_CHECK_MSG(k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0, "attention: Hq must be a multiple of Hkv");
  GRPO_CHECK_MSG(meta.window >= 0, "attention: window must be >= 0 (0: full causal)");
  GRPO_CHECK_MSG(meta.cu_seqlens.size() >= 2 && meta.cu_seqlens.front() == 0 && meta.cu_seqlens.back() == q.shape[0],
                 "attention: cu_seqlens must run from 0 to T");
  for (size_t i = 0; i + 1 < meta.cu_seqlens.size(); ++i)
    GRPO_CHECK_MSG(meta.cu_seqlens[i] <= meta.cu_seqlens[i + 1], "attention: cu_seqlens must be non-decreasing");
  if (ctx.device() != Device::cpu) {
    GRPO_CHECK_I32(ctx, meta.cu_seqlens_dev);
    GRPO_CHECK_NUMEL(meta.cu_seqlens_dev, int64_t(meta.cu_seqlens.size()));
  }
}

// act: the dtype of the activations the op writes into / attends with the cache.
void paged_check(Context& ctx, const char* op, const Tensor& k_cache, const Tensor& v_cache, DType act,
                 const PagedAttnMeta& meta, int64_t T, int64_t Hkv, int64_t D) {
  GRPO_CHECK_KV_CACHE(ctx, op, k_cache, v_cache, act);
  GRPO_CHECK_MSG(k_cache.ndim == 4 && k_cache.shape[1] == meta.block_size && k_cache.shape[2] == Hkv &&
                     k_cache.shape[3] == D,
                 "paged attention: cache must be (n_blocks, block_size, Hkv, D)");
  GRPO_CHECK_MSG(v_cache.ndim == 4 && v_cache.numel() == k_cache.numel(), "paged attention: v_cache must match k_cache");
  GRPO_CHECK_I32(ctx, meta.token_seq);
  GRPO_CHECK_I32(ctx, meta.token_pos);
  GRPO_CHECK_I32(ctx, meta.block_table);
  GRPO_CHECK_I32(ctx, meta.slot_mapping);
  GRPO_CHECK_NUMEL(meta.token_seq, T);
  GRPO_CHECK_NUMEL(meta.token_pos, T);
  GRPO_CHECK_NUMEL(meta.slot_mapping, T);
  GRPO_CHECK_MSG(meta.block_table.ndim == 2, "paged attention: block_table must be (S, max_blocks)");
  GRPO_CHECK_MSG(meta.window >= 0, "paged attention: window must be >= 0 (0: full causal)");
}
}  // namespace

void attention_forward(Context& ctx, Tensor& out, Tensor* lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnVarlen& meta) {
  varlen_check(ctx, q, k, v, meta);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_MSG(out.numel() == q.numel() && out.dtype == q.dtype, "attention_forward: out must be like q");
  if (lse) {
    GRPO_CHECK_F32(ctx, *lse);
    GRPO_CHECK_SHAPE2(*lse, q.shape[1], q.shape[0]);
  }
  GRPO_DISPATCH(ctx, attention_forward, ctx, out, lse, q, k, v, meta);
}

void attention_backward(Context& ctx, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttnVarlen& meta) {
  varlen_check(ctx, q, k, v, meta);
  for (const Tensor* t : {static_cast<const Tensor*>(&dq), &dout, &out}) {
    GRPO_CHECK_ACT(ctx, *t);
    GRPO_CHECK_MSG(t->numel() == q.numel(), "attention_backward: dq, dout, out must be (T,Hq,D)");
  }
  for (const Tensor* t : {static_cast<const Tensor*>(&dk), static_cast<const Tensor*>(&dv)}) {
    GRPO_CHECK_ACT(ctx, *t);
    GRPO_CHECK_MSG(t->numel() == k.numel(), "attention_backward: dk, dv must be (T,Hkv,D)");
  }
  GRPO_CHECK_F32(ctx, lse);
  GRPO_CHECK_SHAPE2(lse, q.shape[1], q.shape[0]);
  GRPO_DISPATCH(ctx, attention_backward, ctx, dq, dk, dv, dout, q, k, v, out, lse, meta);
}

void kv_cache_write(Context& ctx, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const PagedAttnMeta& meta) {
  GRPO_CHECK_ACT(ctx, k);
  GRPO_CHECK_ACT(ctx, v);
  GRPO_CHECK_MSG(k.ndim == 3 && v.ndim == 3 && v.numel() == k.numel() && v.dtype == k.dtype,
                 "kv_cache_write: k, v (T,Hkv,D) of one dtype");
  paged_check(ctx, "kv_cache_write", k_cache, v_cache, k.dtype, meta, k.shape[0], k.shape[1], k.shape[2]);
  if (ctx.device() == Device::cpu) {
    const int64_t n_slots = k_cache.shape[0] * k_cache.shape[1];
    for (int64_t t = 0; t < k.shape[0]; ++t)
      GRPO_CHECK_MSG(meta.slot_mapping.ptr<int32_t>()[t] < n_slots, "kv_cache_write: slot outside the pool");
  }
  GRPO_DISPATCH(ctx, kv_cache_write, ctx, k_cache, v_cache, k, v, meta);
}

void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const PagedAttnMeta& meta, Tensor* lse) {
  GRPO_CHECK_ACT(ctx, q);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_MSG(q.ndim == 3 && out.numel() == q.numel() && out.dtype == q.dtype, "attention_paged: q, out (T,Hq,D)");
  GRPO_CHECK_MSG(k_cache.ndim == 4, "attention_paged: cache must be (n_blocks, block_size, Hkv, D)");
  paged_check(ctx, "attention_paged", k_cache, v_cache, q.dtype, meta, q.shape[0], k_cache.shape[2], q.shape[2]);
  GRPO_CHECK_MSG(q.shape[1] % k_cache.shape[2] == 0, "attention_paged: Hq must be a multiple of Hkv");
  if (ctx.device() == Device::cpu) {
    const int64_t max_blocks = meta.block_table.shape[1], S = meta.block_table.shape[0];
    for (int64_t t = 0; t < q.shape[0]; ++t) {
      const int32_t s = meta.token_seq.ptr<int32_t>()[t], p = meta.token_pos.ptr<int32_t>()[t];
      GRPO_CHECK_MSG(s >= 0 && s < S, "attention_paged: token_seq outside the block table");
      GRPO_CHECK_MSG(p >= 0 && p / meta.block_size < max_blocks, "attention_paged: token_pos beyond the block table");
    }
  }
  if (lse) {
    GRPO_CHECK_F32(ctx, *lse);
    GRPO_CHECK_SHAPE2(*lse, q.shape[1], q.shape[0]);
  }
  GRPO_DISPATCH(ctx, attention_paged, ctx, out, q, k_cache, v_cache, meta, lse);
}

}  // namespace grpo
