// Private to attention*.cu: the tensor-core paged decode kernel (attention_decode.cu) and the
// partition combine launcher it shares with the CUDA-core paged kernel (attention.cu).
#pragma once
#include "kernels/attention.h"
#include "kernels/cuda/cuda_check.cuh"

namespace grpo::cuda {

// attention_paged for bf16 q/out with bf16 or FP8 E4M3 caches (both the same dtype; FP8 read as
// the exact values: bit for bit the output over a bf16 cache holding them), head dim 64/128,
// 4 to 16 query heads per kv head (1 to 16 in batch-invariant contexts, which also take runs of
// rows of one sequence per block: the same bits), every query token computed on its own; returns
// false (doing nothing) when the shape is not supported.
// lse (Hq,T) f32 or null: each row's log-sum-exp (natural log of the scaled scores).
bool attention_paged_decode_tc(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache,
                               const Tensor& v_cache, const PagedAttnMeta& meta, float* lse = nullptr);

// Carves the (acc, m, l) partials of as many tokens as the scratch holds (at most T) out of the
// workspace, for n_splits partitions of Hq heads of head dim D, and returns that token count
// (the tokens per launch). Aborts with a message naming the workspace when not even one fits.
int64_t alloc_partials(Context& ctx, int64_t T, int Hq, int n_splits, int D, float** part_acc, float** part_ml);

// Merges the partition partials of tokens tok0 .. tok0+n_tok−1 in partition order (tokens whose
// context fits one partition were written directly and are skipped): partial row of (token
// tl of the launch, head h, partition p) is (tl·Hq + h)·n_splits + p; m in natural-log units.
// lse (Hq,T) or null: the merged rows' log-sum-exp.
// Launched with programmatic dependent launch after the partition kernel.
void launch_paged_combine(Context& ctx, DType dt, void* out, float* lse, const float* part_acc, const float* part_ml,
                          const int32_t* token_pos, int64_t T, int64_t tok0, int64_t n_tok, int Hq, int n_splits,
                          int D, int part_len);

}  // namespace grpo::cuda
