// Causal grouped-query attention. Two forms:
// - varlen (training and reference): packed sequences, q/k/v contiguous;
//   query head h uses kv head h / (Hq/Hkv); scale 1/sqrt(D).
// - paged (engine): keys/values live in a block pool; each query token says
//   which sequence it belongs to and its absolute position, and attends to
//   keys at positions 0..pos of that sequence. Prefill, chunked prefill and
//   decode all go through it. Steps that are mostly prefill may also carry a
//   tile list (prefill_tiles): then the CUDA backend runs a tensor-core kernel
//   over 64-row query tiles (bf16, head dim 64/128) instead of a per-token
//   kernel (tensor-core for bf16 GQA groups of 4..16, CUDA cores otherwise);
//   the CPU backend ignores it.
// Both forms take an optional sliding window W (`window` > 0): a query at position p
// then attends only keys at positions p-W+1..p (transformers' sliding_window mask,
// kv_idx > q_idx - W). window = 0 is plain causal attention. The window is a property
// of the layer, so the model sets it on a copy of the step's metadata per layer.
#pragma once
#include <vector>

#include "core/context.h"

namespace grpo {

struct AttnVarlen {
  std::vector<int32_t> cu_seqlens;  // (S+1) on the host: sequence s spans tokens [cu[s], cu[s+1])
  Tensor cu_seqlens_dev;            // (S+1) i32 on ctx.device() (same values)
  int max_seqlen = 0;
  int window = 0;                   // sliding window W (0: full causal)
};

struct PagedAttnMeta {
  Tensor token_seq;    // (T) i32: row of block_table for each query token
  Tensor token_pos;    // (T) i32: absolute position of the query token in its sequence
  Tensor block_table;  // (S, max_blocks) i32: physical block ids of each sequence
  Tensor slot_mapping; // (T) i32: block·block_size + offset where the token's k/v are written
  int block_size = 16;
  int max_context = 0; // max over tokens of token_pos + 1 (for kernel sizing)
  int window = 0;      // sliding window W (0: full causal)
  // Optional query tiles for the tensor-core prefill kernel (CUDA, bf16, head dim 64/128).
  // Tile i = (row0, n_rows, seq, pos0): rows row0 .. row0+n_rows-1 of q/out (1 <= n_rows
  // <= 64) are consecutive tokens of one sequence (row `seq` of block_table) at positions
  // pos0 .. pos0+n_rows-1. The tiles must cover every row of q exactly once, in any order;
  // token_seq/token_pos must agree with them. n_prefill_tiles = 0: no tile list.
  Tensor prefill_tiles;  // (n, 4) i32 on the device, n >= n_prefill_tiles
  int n_prefill_tiles = 0;
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
  /* out (T,Hq,D) from q (T,Hq,D) against the cache (after kv_cache_write of this step); lse   \
     (Hq,T) f32 optional: each row's log-sum-exp of its scaled scores, as attention_forward's */ \
  void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache,        \
                       const Tensor& v_cache, const PagedAttnMeta& meta, Tensor* lse = nullptr);

namespace grpo { GRPO_ATTENTION_OPS }
namespace grpo::cpu { GRPO_ATTENTION_OPS }
namespace grpo::cuda { GRPO_ATTENTION_OPS }
