// Dispatcher for optimizer kernels.
#include "kernels/optim.h"

#include "kernels/dispatch.h"
#include "kernels/validate.h"

namespace grpo {

void adamw_step(Context& ctx, Tensor& master, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p) {
  const int64_t n = master.numel();
  for (const Tensor* t : {static_cast<const Tensor*>(&master), &grad, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)}) {
    GRPO_CHECK_F32(ctx, *t);
    GRPO_CHECK_MSG(t->numel() == n, "adamw_step: master, grad, m, v must have the same numel");
  }
  GRPO_CHECK_DEV(ctx, param);
  GRPO_CHECK_MSG(param.numel() == n, "adamw_step: param must have master's numel");
  GRPO_CHECK_MSG(param.dtype == DType::f32 || param.dtype == DType::bf16 || param.dtype == DType::f16,
                 "adamw_step: param must be f32, bf16 or f16");
  GRPO_CHECK_MSG(param.data != master.data || param.dtype == DType::f32, "adamw_step: aliasing needs f32 param");
  GRPO_CHECK_MSG(p.step >= 1, "adamw_step: step is 1-based");
  GRPO_DISPATCH(ctx, adamw_step, ctx, master, param, grad, m, v, p);
}

double sum_squares(Context& ctx, const Tensor& grad) {
  GRPO_CHECK_F32(ctx, grad);
  if (ctx.device() == Device::cpu) return cpu::sum_squares(ctx, grad);
#ifdef GRPO_HAVE_CUDA
  return cuda::sum_squares(ctx, grad);
#else
  GRPO_CHECK_MSG(false, "sum_squares: this build has no CUDA backend");
  return 0.0;
#endif
}

}  // namespace grpo
