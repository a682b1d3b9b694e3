// gemm(): the cuBLASLt matrix product other CUDA ops build on (defined in linear.cu).
#pragma once
#include <cstdint>

#include "core/context.h"
#include "core/dtype.h"

namespace grpo::cuda {

// Row-major D (m,n) = alpha · op(A) · op(B) + beta · D [+ bias (n), same dtype as D].
// A is stored (m,k) with row stride lda, or (k,m) when trans_a; B is stored (k,n) with
// row stride ldb, or (n,k) when trans_b. A and B share dtype ab (f32 or bf16); D is f32
// or bf16. f32 inputs use CUBLAS_COMPUTE_32F (no TF32); bf16 accumulate in f32.
// In deterministic mode only algorithms without split-K are used.
void gemm(Context& ctx, void* D, DType dt_d, int64_t ldd, const void* A, int64_t lda, bool trans_a,
          const void* B, int64_t ldb, bool trans_b, DType dt_ab, int64_t m, int64_t n, int64_t k, float alpha,
          float beta, const void* bias = nullptr);

}  // namespace grpo::cuda
