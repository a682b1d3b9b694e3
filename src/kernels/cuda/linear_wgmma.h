// Hopper (sm_90a) bf16 GEMM for decode-sized batches on wgmma + TMA (linear_wgmma.cu):
//   out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias (N)], accumulate: out += that, for 1 <= M <= 64.
// Same contract and epilogue rounding as linear_small_m (linear_small_m.h), so either kernel can
// serve linear_forward; this one is meant for M up to 64, where the mma.sync kernel is
// issue-bound. linear_forward (linear.cu) dispatches to it; linear_swiglu_forward dispatches to
// the gated variant below. Plain C++ so that tests and benchmarks can include it.
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
// wg: warpgroups per block of the rows kernel (linear_wgmma_rows / _f32 with M > 64): 2 shares
// each weight chunk between two 64-row slices (1 = one slice per block; 0 = 2 from M = 256 on
// for weights of 3 Mi elements or more);
// no result bit depends on it. The decode entry points (M <= 64) take one.
struct WgmmaGemmConfig {
  int nt = 0;
  int split = 0;
  int stages = 0;
  int wg = 0;
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

// The same kernel for any M >= 1 (batch-invariant GEMM of train.on_policy = "bitwise",
// docs/bitwise.md): x is cut into 64-row slices along the grid, each computed exactly as a
// decode call of those rows, so a row's result is the one linear_wgmma gives it in any batch.
// The split is wgmma_gemm_config(N, K)'s; with M > 64 the weight tile is 128 rows
// (GRPO_WGMMA_ROWS_NT = 64|128|256 overrides; nt changes no bit). False where it does not
// apply (as linear_wgmma, without the M <= 64 bound).
bool linear_wgmma_rows(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                       bool accumulate, WgmmaGemmConfig cfg = {});
// out (M,N) f32 = alpha · (x · wᵀ): the sums of linear_wgmma_rows, scaled in f32 (one product)
// and stored unrounded (the LM head's logits and the logprob tiles of the bitwise mode).
// split != 0 replaces the heuristic's split for (N, K): with the split of a larger weight that
// w is a slice of (an LM head's vocabulary chunk), the sums equal that weight's product's.
bool linear_wgmma_f32(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, float alpha, int split = 0);

// ---- Gate/up projection with SwiGLU fused into the epilogue ----
//   act (M,F) = silu(g)·u,  [g | u] = x (M,K) · w_gate_up (2F,K)ᵀ  (g: columns [0,F), u: [F,2F)).
// A block owns act columns [n0, n0 + nt) and streams, per 64-wide K chunk, gate rows n0.. and up
// rows F + n0.. of w_gate_up (two TMA boxes of nt rows onto one stage), multiplied as one
// 2·nt-wide wgmma operand. g and u are summed exactly as linear_wgmma sums columns of the
// (2F,K) product under the same split (fixed-order split-K reduction), rounded to bf16 as its
// epilogue rounds them, and combined with swiglu_forward's arithmetic, so act is bit for bit
// linear_wgmma(gate_up, x, w_gate_up) with that split followed by swiglu_forward. Like the plain
// kernel, a row's result never depends on M, the other rows, nt or stages.
//
// cfg.nt here is H, the act columns per block (32, 64 or 128; the wgmma n and the plain
// kernel's nt are 2H); split and stages as for linear_wgmma. 0 = wgmma_gated_config's choice.

// The plain heuristic's choice for the (2F, K) product, mapped to the gated kernel: the same
// split (so the bits agree with linear_forward's wgmma path), H = (plain nt)/2 so that a block
// streams as many weight rows per chunk as a plain block (same stage bytes, ring depth, grid
// size), halved while F % H != 0. nt = 0 when F is not a multiple of 32 (the kernel declines).
WgmmaGemmConfig wgmma_gated_config(int64_t F, int64_t K);

// Runs the fused product and returns true, or returns false without doing anything where it
// does not apply: x, w_gate_up or act not bf16 or not 2-D with shapes (M,K), (2F,K), (M,F); M
// outside 1..64; F not a multiple of 32 (or of an explicit cfg.nt); K not a multiple of 8 or
// below 64; a pointer not 16-byte aligned; a device other than sm_90. Explicit cfg fields must
// be valid values (checked).
bool linear_wgmma_swiglu(Context& ctx, Tensor& act, const Tensor& x, const Tensor& w_gate_up, WgmmaGemmConfig cfg = {});

}  // namespace grpo::cuda
