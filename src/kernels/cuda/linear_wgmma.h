// Hopper (sm_90a) bf16 GEMM for decode-sized batches on wgmma + TMA (linear_wgmma.cu):
//   out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias (N)], accumulate: out += that, for 1 <= M <= 64.
// Same contract and epilogue rounding as linear_small_m (linear_small_m.h), so either kernel can
// serve linear_forward; this one is meant for M up to 64, where the mma.sync kernel is
// issue-bound. It is not wired into linear_forward: callers (benchmarks, tests, a future
// dispatch) call linear_wgmma directly. Plain C++ so that tests and benchmarks can include it.
//
// Results depend only on (the row's content, N, K, split): never on M, on the other rows, on
// nt or on stages, and are identical run to run (fixed-order split-K reduction, no atomics).
#pragma once
#include <cstdint>

#include "core/context.h"

namespace grpo::cuda {

// nt: weight rows per block = the wgmma n (64, 128 or 256); split: blocks of a thread-block
// cluster that share one nt tile and cut K between them (1, 2, 4 or 8); stages: depth of the
// TMA ring in 64-wide K chunks (2..16, bounded by shared memory; a ring at least as deep as a
// block's chunk count puts all of them in flight at once). 0 = the heuristic's choice.
// split changes the summation order (results are comparable bit for bit only under one
// split); nt and stages change no result bit.
struct WgmmaGemmConfig {
  int nt = 0;
  int split = 0;
  int stages = 0;
};

// The heuristic's configuration for an (N, K) weight on the current device (SM count);
// independent of M, so that a row's result never depends on the batch it is computed in.
WgmmaGemmConfig wgmma_gemm_config(int64_t N, int64_t K);

// Whether the current device can run the kernel (compute capability 9.0, the build's sm_90a
// code, and the driver's tensor-map encoder is reachable).
bool wgmma_gemm_available();

// Runs the product and returns true, or returns false without doing anything when the kernel
// does not apply: x, w or out not bf16 or not 2-D with matching shapes, M outside 1..64, K not
// a multiple of 8 or below 64, a pointer not 16-byte aligned, a bias that is not bf16/f32 with N elements,
// or a device other than sm_90. Explicit cfg fields must be valid values (checked).
bool linear_wgmma(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, bool accumulate,
                  WgmmaGemmConfig cfg = {});

}  // namespace grpo::cuda
