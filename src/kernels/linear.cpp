// Dispatcher for dense layers: validates and calls the backend. `out` may be
// f32 while x/w are bf16 on CUDA (the LM head writes f32 logits); otherwise
// out has x's dtype. Weight gradients are always f32.
#include "kernels/linear.h"

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "kernels/validate.h"

#ifdef GRPO_HAVE_CUDA
#include "kernels/cuda/linear_wgmma.h"
#endif

namespace grpo {

int64_t gemm_row_bucket(int64_t m) {
  if (m <= 64) return m;
  int p = 0;
  while ((int64_t(1) << (p + 1)) < m) ++p;  // 2^p < m <= 2^(p+1)
  const int64_t step = std::max<int64_t>(1, (int64_t(1) << p) / 4);
  return (m + step - 1) / step * step;
}

std::string batch_invariant_gemm_problem(const Context& ctx, DType dt) {
  if (ctx.device() == Device::cpu) return "";
#ifdef GRPO_HAVE_CUDA
  if (dt != DType::bf16) return "needs bf16 weights on CUDA (model.dtype = \"bf16\"): its batch-invariant GEMM is bf16";
  if (!cuda::wgmma_gemm_available())
    return "needs an sm_90 (Hopper) GPU on CUDA: its batch-invariant GEMM is the wgmma kernel of the decode path";
  return "";
#else
  (void)dt;
  return "this build has no CUDA backend";
#endif
}

void linear_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, bool accumulate) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, w);
  GRPO_CHECK_ACT(ctx, out);
  GRPO_CHECK_MSG(x.ndim == 2 && w.ndim == 2 && x.shape[1] == w.shape[1], "linear_forward: x (M,K), w (N,K)");
  GRPO_CHECK_SHAPE2(out, x.shape[0], w.shape[0]);
  GRPO_CHECK_MSG(w.dtype == x.dtype, "linear_forward: x and w must have the same dtype");
  GRPO_CHECK_MSG(out.dtype == x.dtype || out.dtype == DType::f32, "linear_forward: out must be x's dtype or f32");
  if (bias) {
    GRPO_CHECK_ACT(ctx, *bias);
    GRPO_CHECK_MSG(bias->dtype == w.dtype && bias->numel() == w.shape[0], "linear_forward: bias (N) of w's dtype");
  }
  GRPO_DISPATCH(ctx, linear_forward, ctx, out, x, w, bias, accumulate);
}

void linear_backward(Context& ctx, Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dout, const Tensor& x,
                     const Tensor& w, bool accumulate_dx) {
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, w);
  GRPO_CHECK_ACT(ctx, dout);
  GRPO_CHECK_MSG(x.ndim == 2 && w.ndim == 2 && x.shape[1] == w.shape[1], "linear_backward: x (M,K), w (N,K)");
  GRPO_CHECK_SHAPE2(dout, x.shape[0], w.shape[0]);
  if (dx) {
    GRPO_CHECK_ACT(ctx, *dx);
    GRPO_CHECK_SHAPE2(*dx, x.shape[0], x.shape[1]);
  }
  if (dw) {
    GRPO_CHECK_F32(ctx, *dw);
    GRPO_CHECK_SHAPE2(*dw, w.shape[0], w.shape[1]);
  }
  if (db) {
    GRPO_CHECK_F32(ctx, *db);
    GRPO_CHECK_NUMEL(*db, w.shape[0]);
  }
  GRPO_DISPATCH(ctx, linear_backward, ctx, dx, dw, db, dout, x, w, accumulate_dx);
}

void linear_swiglu_forward(Context& ctx, Tensor& act, Tensor& gate_up_scratch, const Tensor& x,
                           const Tensor& w_gate_up) {
  GRPO_CHECK_ACT(ctx, act);
  GRPO_CHECK_ACT(ctx, gate_up_scratch);
  GRPO_CHECK_ACT(ctx, x);
  GRPO_CHECK_ACT(ctx, w_gate_up);
  GRPO_CHECK_MSG(x.ndim == 2 && w_gate_up.ndim == 2 && x.shape[1] == w_gate_up.shape[1] && w_gate_up.shape[0] % 2 == 0,
                 "linear_swiglu_forward: x (M,K), w_gate_up (2F,K)");
  const int64_t M = x.shape[0], F = w_gate_up.shape[0] / 2;
  GRPO_CHECK_SHAPE2(act, M, F);
  GRPO_CHECK_SHAPE2(gate_up_scratch, M, 2 * F);
  GRPO_CHECK_MSG(w_gate_up.dtype == x.dtype && act.dtype == x.dtype && gate_up_scratch.dtype == x.dtype,
                 "linear_swiglu_forward: x, w_gate_up, act and gate_up must share a dtype");
#ifdef GRPO_HAVE_CUDA
  if (ctx.device() != Device::cpu) {
    cuda::linear_swiglu_forward(ctx, act, gate_up_scratch, x, w_gate_up);
    return;
  }
#endif
  linear_forward(ctx, gate_up_scratch, x, w_gate_up, nullptr, false);
  swiglu_forward(ctx, act, gate_up_scratch);
}

}  // namespace grpo
