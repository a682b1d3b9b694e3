// Argument checks shared by the op dispatchers (kernels/<family>.cpp). The
// dispatchers are the boundary between callers and the backends: they assert
// device placement, dtypes and shapes once, so that the backends can assume them.
#pragma once
#include "core/check.h"
#include "core/context.h"

namespace grpo::detail {

// Float activation: f32 on the CPU; f32 or bf16 on CUDA.
inline bool act_dtype_ok(const Context& ctx, const Tensor& t) {
  if (ctx.device() == Device::cpu) return t.dtype == DType::f32;
  return t.dtype == DType::f32 || t.dtype == DType::bf16;
}

}  // namespace grpo::detail

#define GRPO_CHECK_ACT(ctx, t)                                                                       \
  do {                                                                                               \
    GRPO_CHECK_DEV(ctx, t);                                                                          \
    GRPO_CHECK_MSG(::grpo::detail::act_dtype_ok(ctx, t), #t ": activation dtype must be f32 (cpu) or f32/bf16 (cuda)"); \
  } while (0)
#define GRPO_CHECK_F32(ctx, t)                                               \
  do {                                                                       \
    GRPO_CHECK_DEV(ctx, t);                                                  \
    GRPO_CHECK_MSG((t).dtype == ::grpo::DType::f32, #t " must be f32");      \
  } while (0)
#define GRPO_CHECK_I32(ctx, t)                                               \
  do {                                                                       \
    GRPO_CHECK_DEV(ctx, t);                                                  \
    GRPO_CHECK_MSG((t).dtype == ::grpo::DType::i32, #t " must be i32");      \
  } while (0)
#define GRPO_CHECK_NUMEL(t, n) GRPO_CHECK_MSG((t).numel() == (n), #t " has the wrong number of elements")
