// Private to attention*.cu: the argument blocks and entry points of the tensor-core attention
// kernels (bf16, head dim 64 or 128) for packed training batches (attention_train_fwd_tc.cu,
// attention_train_bwd_tc.cu) and for the engine's prefill over the paged KV cache
// (attention_prefill_tc.cu).
#pragma once
#include "kernels/cuda/attention_train_bwd.cuh"

namespace grpo::cuda {

struct TcArgs {
  const void *q, *k, *v;     // (T,Hq,D), (T,Hkv,D) ×2
  void* out;                 // forward: (T,Hq,D)
  float* lse;                // forward: (Hq,T) or null; backward: read
  const void* dout;          // backward: (T,Hq,D)
  void *dq, *dk, *dv;        // backward outputs
  const float* delta;        // backward: (Hq,T) Σ_d dout·out
  const int32_t* cu;         // (S+1) packed sequence starts
  int32_t* tok_start;        // backward: (T) scratch from the caller; attention_backward_tc fills it with the
                             // first token of each token's sequence
  int n_seqs;
  int64_t T;
  int Hq, Hkv, G, D;
  float scale;
};

// Paged prefill (attention_paged with a tile list, see PagedAttnMeta::prefill_tiles): q/out
// bf16; the caches bf16, or FP8 E4M3 with kv_fp8 (read as their exact values: the output is
// bit for bit the one over a bf16 cache holding the widened values).
struct PagedTcArgs {
  const void* q;               // (T,Hq,D)
  void* out;                   // (T,Hq,D)
  const void *k_cache, *v_cache;  // (n_blocks, block_size, Hkv, D)
  const int32_t* block_table;  // (S, max_blocks)
  const int32_t* tiles;        // (n_tiles, 4): row0, n_rows (1..64), seq, pos0
  int n_tiles, max_blocks, block_size;
  int Hq, Hkv, G, D;
  float scale;
  bool kv_fp8 = false;         // caches hold FP8 E4M3 (kv_cache_dtype = fp8), q/out bf16
};

bool attention_tc_supported(DType dt, int D);
// Each returns false (doing nothing) when the dtype/head dim is not supported.
bool attention_forward_tc(Context& ctx, const TcArgs& a, DType dt);
bool attention_backward_tc(Context& ctx, const TcArgs& a, DType dt);
bool attention_paged_prefill_tc(Context& ctx, const PagedTcArgs& a, DType dt);

}  // namespace grpo::cuda
