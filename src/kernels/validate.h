// Argument checks shared by the op dispatchers (kernels/<family>.cpp). The
// dispatchers are the boundary between callers and the backends: they assert
// device placement, dtypes and shapes once, so that the backends can assume them.
#pragma once
#include <string>

#include "core/check.h"
#include "core/context.h"

namespace grpo {

// Weight / activation dtypes a backend runs: f32 on the CPU; f32 or bf16 on
// CUDA. Configs and flags check model dtypes against this before any op runs.
inline bool backend_runs_dtype(Device d, DType t) {
  if (d == Device::cpu) return t == DType::f32;
  return t == DType::f32 || t == DType::bf16;
}

}  // namespace grpo

namespace grpo::detail {

// Float activation: see backend_runs_dtype.
inline bool act_dtype_ok(const Context& ctx, const Tensor& t) { return backend_runs_dtype(ctx.device(), t.dtype); }

// Paged KV cache pair: K and V share one dtype, which is either the dtype of the
// activations written into it / attended with (`act`), or f8e4m3 (kv_cache_dtype =
// fp8: one byte per element, converted on write, read as exact floats).
inline bool kv_cache_dtype_ok(const Tensor& k_cache, const Tensor& v_cache, DType act) {
  return k_cache.dtype == v_cache.dtype && (k_cache.dtype == act || k_cache.dtype == DType::f8e4m3);
}
inline std::string kv_cache_dtype_error(const char* op, const Tensor& k_cache, const Tensor& v_cache, DType act) {
  return std::string(op) + ": k_cache is " + dtype_name(k_cache.dtype) + " and v_cache is " +
         dtype_name(v_cache.dtype) + "; both caches must have one dtype, either the activations' (" +
         dtype_name(act) + ") or f8e4m3";
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
// The message is built only on failure (GRPO_CHECK_MSG evaluates it then).
#define GRPO_CHECK_KV_CACHE(ctx, op, k_cache, v_cache, act)                                     \
  do {                                                                                          \
    GRPO_CHECK_DEV(ctx, k_cache);                                                               \
    GRPO_CHECK_DEV(ctx, v_cache);                                                               \
    GRPO_CHECK_MSG(::grpo::detail::kv_cache_dtype_ok(k_cache, v_cache, act),                    \
                   ::grpo::detail::kv_cache_dtype_error(op, k_cache, v_cache, act).c_str());    \
  } while (0)
#define GRPO_CHECK_NUMEL(t, n) GRPO_CHECK_MSG((t).numel() == (n), #t " has the wrong number of elements")
