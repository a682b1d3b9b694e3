// Dense layers (GEMM). Weights are stored as in Hugging Face: w (N, K), so
// out = x · wᵀ. CUDA uses cuBLASLt (bf16 in, f32 accumulate).
#pragma once
#include <string>

#include "core/context.h"

#define GRPO_LINEAR_OPS                                                                          \
  /* out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias (N)]; accumulate: out += instead of = */            \
  void linear_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w,              \
                      const Tensor* bias, bool accumulate);                                      \
  /* dx (M,K) = dout·w (or += when accumulate_dx); dw (N,K) f32 += doutᵀ·x; db (N) f32 += Σ dout \
     Any of dx, dw, db may be null. */                                                           \
  void linear_backward(Context& ctx, Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dout,     \
                       const Tensor& x, const Tensor& w, bool accumulate_dx);

namespace grpo { GRPO_LINEAR_OPS }
namespace grpo::cpu { GRPO_LINEAR_OPS }
namespace grpo::cuda { GRPO_LINEAR_OPS }

namespace grpo {
// Why ctx cannot run the batch-invariant forward GEMMs of train.on_policy = "bitwise" on
// weights of dtype dt, as a sentence for an error message, or "" when it can (always on the
// CPU; CUDA needs bf16 and an sm_90 GPU, whose wgmma kernel serves every M).
std::string batch_invariant_gemm_problem(const Context& ctx, DType dt);

// The row count whose cuBLASLt algorithm choice m shares (CUDA, m > 64, a non-transposed x):
// the top of m's bucket, four buckets per octave (65..80 -> 80, 513..640 -> 640); m itself for
// m <= 64. An algorithm is chosen once per bucket and problem shape.
int64_t gemm_row_bucket(int64_t m);

// The MLP's gate/up projection and SwiGLU:
//   act (M,F) = silu(g)·u,  [g | u] = x (M,K) · w_gate_up (2F,K)ᵀ,
// i.e. linear_forward(gate_up, x, w_gate_up) then swiglu_forward(act, gate_up). On CUDA, for
// bf16 with M <= 64 where linear_forward would use the wgmma kernel, one fused kernel
// (linear_wgmma_swiglu) computes act without writing gate_up, bit for bit what the two ops
// give (GRPO_FUSED_GATE_SWIGLU=0 turns it off); otherwise, CPU included, it runs the two ops
// and gate_up (M,2F) holds the pre-activations. Callers must not read gate_up afterwards.
void linear_swiglu_forward(Context& ctx, Tensor& act, Tensor& gate_up_scratch, const Tensor& x,
                           const Tensor& w_gate_up);
}  // namespace grpo
namespace grpo::cuda {
void linear_swiglu_forward(Context& ctx, Tensor& act, Tensor& gate_up_scratch, const Tensor& x,
                           const Tensor& w_gate_up);
// GRPO_FUSED_GATE_SWIGLU (read once; "0" disables), or the value set by
// set_fused_gate_swiglu_enabled (benchmarks and tests A/B both paths).
bool fused_gate_swiglu_enabled();
void set_fused_gate_swiglu_enabled(bool on);
// Whether linear_forward may use the wgmma decode GEMM (linear_wgmma.cu): GRPO_WGMMA_GEMM
// (read once; "0" = off), or the value set by set_wgmma_gemm_enabled (benchmarks: cuBLASLt rows).
bool wgmma_gemm_enabled();
void set_wgmma_gemm_enabled(bool on);
}  // namespace grpo::cuda
