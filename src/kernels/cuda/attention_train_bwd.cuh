// Private to attention_train_bwd*.cu: the argument block of the attention backward kernels
// and the packed-sequence lookup they share.
#pragma once
#include "kernels/cuda/cuda_check.cuh"

namespace grpo::cuda {

struct BwdArgs {
  const void *q, *k, *v, *out, *dout;  // (T,Hq,D), (T,Hkv,D) ×2, (T,Hq,D) ×2
  void *dq, *dk, *dv;
  const float* lse;    // (Hq,T)
  float* delta;        // (Hq,T): Σ_d dout·out, filled before the dq/dk/dv kernels
  const int32_t* cu;   // (S+1) packed sequence starts
  int n_seqs;
  int64_t T;
  int Hq, Hkv, G, D;
  int window;          // sliding window W: query i sees key j when i - W < j <= i (0: j <= i)
  float scale;
};

// Index of the sequence holding packed token t: the last s with cu[s] <= t.
__device__ __forceinline__ int find_seq(const int32_t* cu, int n_seqs, int64_t t) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Shared-memory tiled dq and dk/dv kernels (attention_train_bwd_tiled.cu) for D in {32, 64, 128};
// returns false (doing nothing) for other head dims. a.delta must be filled.
bool attention_backward_tiled(Context& ctx, const BwdArgs& a, DType dt);

}  // namespace grpo::cuda
