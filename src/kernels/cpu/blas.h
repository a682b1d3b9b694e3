// OpenBLAS use by the CPU kernels. OpenBLAS runs single-threaded; the kernels
// split their GEMMs into column blocks across ctx.parallel_for instead, so the
// only threads working are the context's pool (no oversubscription between
// OpenBLAS's own threads and ours, and the split does not depend on OpenBLAS).
#pragma once
#include <cblas.h>

#include <cstdint>

namespace grpo::cpu {

// Sets OpenBLAS to one thread (once per process). Called before every GEMM.
void blas_init();

// Smallest column block worth a task: ~64 KFLOP per task at least.
inline int64_t gemm_min_cols(int64_t M, int64_t K) {
  int64_t work = M * K;
  int64_t c = work > 0 ? (int64_t(1) << 16) / work : 64;
  return c < 16 ? 16 : c;
}

}  // namespace grpo::cpu
