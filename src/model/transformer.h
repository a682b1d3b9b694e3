// Inference forward of the decoder-only transformer (Llama/Qwen2/Qwen3/
// Mistral) over a paged KV cache. One code path for both backends: every
// step is an op from kernels/. The engine builds the ForwardBatch (which
// tokens, their positions, their sequences' block tables); this file only
// runs the layers.
#pragma once
#include <vector>

#include "core/context.h"
#include "kernels/attention.h"
#include "model/lora.h"
#include "model/weights.h"

namespace grpo {

// Paged KV cache: per layer one K and one V block pool. Sized by the engine
// from a memory budget.
struct KVCache {
  int n_blocks = 0;
  int block_size = 16;
  std::vector<Tensor> k;  // L × (n_blocks, block_size, Hkv, D)
  std::vector<Tensor> v;  // L × (n_blocks, block_size, Hkv, D)
  size_t bytes_per_block() const;  // over all layers, K and V
};
KVCache kv_cache_allocate(const ModelConfig& cfg, Device dev, DType dt, int n_blocks, int block_size);

// Precomputed rotary tables (with the config's rope scaling), f32 on the device.
struct RopeTable {
  Tensor cos;  // (P, D/2)
  Tensor sin;  // (P, D/2)
};
RopeTable rope_table_build(const ModelConfig& cfg, Device dev, int max_positions);

struct ForwardBatch {
  Tensor tokens;      // (T) i32 on the device
  Tensor positions;   // (T) i32 on the device
  PagedAttnMeta attn; // sequence/block metadata for the T tokens
  Tensor logit_rows;  // (R) i32: rows of T whose logits are wanted (e.g. each sequence's last token)
  // LoRA, unmerged: rows [begin, end) of the T tokens run with adapter w added after
  // each base GEMM (rows grouped by adapter; rows in no group use the base alone).
  // The scratch must have been allocated with lora_r >= every adapter's r.
  struct LoraRows {
    const LoraWeights* w = nullptr;
    int begin = 0, end = 0;
  };
  std::vector<LoraRows> lora;
};

// Scratch activations for up to max_tokens tokens; reused across steps.
struct ForwardScratch {
  int max_tokens = 0;
  int max_logit_rows = 0;
  Tensor x, xn, qkv, q, attn, gate_up, mlp_act, rows;  // sized for max_tokens
  int lora_r = 0;
  Tensor lora_h, lora_tmp;  // (max_tokens·lora_r), (max_tokens·max(q_dim, C, F)) when lora_r > 0
};
// lora_r: the largest LoRA rank the forward will run (0: no adapters).
ForwardScratch forward_scratch_allocate(const ModelConfig& cfg, Device dev, DType dt, int max_tokens,
                                        int max_logit_rows, int lora_r = 0);

// Runs all layers for the batch, writing each token's K/V into the cache, and
// writes logits (R, V) f32 for batch.logit_rows. On return the first R rows of
// scratch.xn hold those rows after the final RMSNorm (the LM head's input), which
// the engine's bitwise logprobs read.
void transformer_forward(Context& ctx, const ModelWeights& w, KVCache& cache, const RopeTable& rope,
                         const ForwardBatch& batch, ForwardScratch& scratch, Tensor& logits);

// Makes most of the forward's cuBLASLt algorithm choices ahead of the first steps: runs the
// GEMMs of a layer (every layer has the same shapes) and of the LM head on the scratch buffers
// once per row bucket above 64 (gemm_row_bucket) up to scratch.max_tokens (the LM head up to the
// logit rows of `logits`), with the operands, flags and buffers transformer_forward passes.
// Eager prefills, speculative catch-ups and verify steps otherwise meet a new bucket now and
// then in the middle of a run and pay its heuristic queries there (H200: draft rounds of 64
// sequences took 6-12 ms the first time against about 1 ms later; with the prewarm the slowest
// drafting step of the same benchmark took 3.7 ms). Row counts whose bucket's algorithm does not
// run them still ask once for their exact count. Leaves the scratch and `logits` garbage (every
// forward writes before it reads). CUDA only; nothing in batch-invariant contexts (no cuBLASLt
// there).
void transformer_gemm_prewarm(Context& ctx, const ModelWeights& w, ForwardScratch& scratch, Tensor& logits);

}  // namespace grpo
