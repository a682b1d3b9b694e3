// Causal grouped-query attention. Two forms:
// - varlen (training and reference): packed sequences, q/k/v contiguous;
//   query head h uses kv head h / (Hq/Hkv); scale 1/sqrt(D).
// - paged (engine): keys/values live in a block pool; each query token says
//   which sequence it belongs to and its absolute position, and attends to
//   keys at positions 0..pos of that sequence. Prefill, chunked prefill and
//   decode all go through it.
#pragma once
#include <vector>

#include "core/context.h"

namespace grpo {

struct AttnVarlen {
  std::vector<int32_t> cu_seqlens;  // (S+1) on the host: sequence s spans tokens [cu[s], cu[s+1])
  Tensor cu_seqlens_dev;            // (S+1) i32 on ctx.device() (same values)
  int max_seqlen = 0;
};

struct PagedAttnMeta {
  Tensor token_seq;    // (T) i32: row of block_table for each query token
  Tensor token_pos;    // (T) i32: absolute position of the query token in its sequence
  Tensor block_table;  // (S, max_blocks) i32: physical block ids of each sequence
  Tensor slot_mapping; // (T) i32: block·block_size + offset where the token's k/v are written
  int block_size = 16;
  int max_context = 0; // max over tokens of token_pos + 1 (for kernel sizing)
};

}  // namespace grpo

#define GRPO_ATTENTION_OPS                                                                      \
  /* out (T,Hq,D); lse (Hq,T) f32 optional (saved for backward) */                               \
  void attention_forward(Context& ctx, Tensor& out, Tensor* lse, const Tensor& q, const Tensor& k, \
                         const Tensor& v, const AttnVarlen& meta);                               \
  /* dq (T,Hq,D), dk, dv (T,Hkv,D) overwritten */                                                \
  void attention_backward(Context& ctx, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,  \
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,  \
                          const Tensor& lse, const AttnVarlen& meta);                            \
  /* writes k, v (T,Hkv,D) into k_cache, v_cache (n_blocks, block_size, Hkv, D) at slot_mapping */ \
  void kv_cache_write(Context& ctx, Tensor& k_cache, Tensor& v_cache, const Tensor& k,          \
                      const Tensor& v, const PagedAttnMeta& meta);                               \
  /* out (T,Hq,D) from q (T,Hq,D) against the cache (after kv_cache_write of this step) */       \
  void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache,        \
                       const Tensor& v_cache, const PagedAttnMeta& meta);

namespace grpo { GRPO_ATTENTION_OPS }
namespace grpo::cpu { GRPO_ATTENTION_OPS }
namespace grpo::cuda { GRPO_ATTENTION_OPS }
