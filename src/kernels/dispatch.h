// Backend selection for op dispatchers. GRPO_DISPATCH(ctx, fn, args...) calls
// cpu::fn or cuda::fn; on a build without CUDA the cuda branch aborts with a
// clear message.
#pragma once
#include "core/check.h"
#include "core/context.h"

#ifdef GRPO_HAVE_CUDA
#define GRPO_DISPATCH(ctx, fn, ...)                                  \
  do {                                                               \
    if ((ctx).device() == ::grpo::Device::cpu) ::grpo::cpu::fn(__VA_ARGS__); \
    else ::grpo::cuda::fn(__VA_ARGS__);                              \
  } while (0)
#else
#define GRPO_DISPATCH(ctx, fn, ...)                                           \
  do {                                                                        \
    if ((ctx).device() == ::grpo::Device::cpu) ::grpo::cpu::fn(__VA_ARGS__);  \
    else GRPO_CHECK_MSG(false, #fn ": this build has no CUDA backend");       \
  } while (0)
#endif

// Shape assertions used by dispatchers.
#define GRPO_CHECK_SHAPE2(t, a, b) GRPO_CHECK_MSG((t).ndim == 2 && (t).shape[0] == (a) && (t).shape[1] == (b), #t " shape")
#define GRPO_CHECK_DEV(ctx, t) GRPO_CHECK_MSG((t).device == (ctx).device(), #t " is on the wrong device")
