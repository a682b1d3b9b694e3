// Bandwidth-oriented bf16 GEMM for decode-sized batches (linear_small_m.cu):
//   out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias (N)], accumulate: out += that, for M <= 64.
// grpo::cuda::linear_forward uses it for bf16 x/w/out where small_m_preferred says so and it
// applies (unless GRPO_SMALL_M_GEMM=0); cuBLASLt handles everything else. Plain C++ so that tests and
// benchmarks can call it directly.
//
// Results depend only on (the row's content, N, K, the split chosen for (N, K) on this
// device): never on M or on the other rows, and are identical run to run.
#pragma once
#include <cstdint>

#include "core/context.h"

namespace grpo::cuda {

// Tile configuration: nt weight rows per block (64 or 128) and split, the number of blocks
// of a thread-block cluster that share the K range (1, 2, 4 or 8). 0 = the heuristic's choice.
// The split changes the summation order, so results are only comparable bit for bit
// under one split; nt does not change any result bit.
struct SmallMConfig {
  int nt = 0;
  int split = 0;
};

// The heuristic's configuration for an (N, K) weight on the current device (SM count).
SmallMConfig small_m_config(int64_t N, int64_t K);

// GRPO_SMALL_M_GEMM (read once; "0" disables, anything else or unset enables), or the
// value set by set_small_m_gemm_enabled (benchmarks and tests A/B both paths).
bool small_m_gemm_enabled();
void set_small_m_gemm_enabled(bool on);

// Where linear_forward sends bf16 products to this kernel instead of cuBLASLt: measured on an
// H200 (bench_kernels' small-M sweep, docs/BENCHMARKS.md) it is faster for M <= 16 with
// N <= 4096 (q/k/v, o and down projections: 4–7 µs against 6–11 µs) and slower at M = 64 and
// for wide N (gate_up, the LM head), where cuBLASLt's tiles reuse x better.
bool small_m_preferred(int64_t M, int64_t N);

// Runs the product and returns true, or returns false without doing anything when the
// kernel does not apply: x, w or out not bf16, M outside 1..64, K not a multiple of 8,
// a pointer not 16-byte aligned, a bias that is not bf16/f32 with N elements. Explicit
// cfg fields must be valid values (checked).
bool linear_small_m(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                    bool accumulate, SmallMConfig cfg = {});

}  // namespace grpo::cuda
