// CUDA vs CPU parity for the column-range ops (kernels/columns.h): columns_add
// and columns_copy in f32 and bf16, at a column offset inside a wider matrix,
// with a scale. Untouched columns of columns_add must keep their values exactly.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include "kernels/columns.h"

using namespace grpo;
using namespace grpo::cudatest;

TEST(CudaColumns, AddAndCopyMatchCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t M = 37, N = 1000, n = 192, col0 = 320;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto wide = rounded(randn(size_t(M * N), 1), dt), narrow = rounded(randn(size_t(M * n), 2), dt);
    std::vector<float> ref = wide, ref_copy(size_t(M * n));
    Tensor hw = host(ref, {M, N}), hn = host(narrow, {M, n}), hc = host(ref_copy, {M, n});
    cpu::columns_add(cpu_ctx(), hw, hn, col0, 1.75f);
    cpu::columns_copy(cpu_ctx(), hc, hw, col0, -0.5f);
    Tensor gw = dev(wide, dt, {M, N}), gn = dev(narrow, dt, {M, n}), gc = poisoned(dt, {M, n});
    cuda::columns_add(gpu_ctx(), gw, gn, col0, 1.75f);
    cuda::columns_copy(gpu_ctx(), gc, gw, col0, -0.5f);
    const auto got = fetch(gw);
    // The CPU reference rounds only at the end (f32); the GPU rounds the sum to the dtype.
    EXPECT_TRUE(close(tag("columns_add", dt), got, ref, tol_elem(dt)));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j)
        if (j < col0 || j >= col0 + n) ASSERT_EQ(got[size_t(r * N + j)], wide[size_t(r * N + j)]) << r << "," << j;
    std::vector<float> want_copy(size_t(M * n));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < n; ++j) want_copy[size_t(r * n + j)] = -0.5f * got[size_t(r * N + col0 + j)];
    EXPECT_TRUE(close(tag("columns_copy", dt), fetch(gc), rounded(want_copy, dt), Tol{0, 0}));
  }
}

#else
TEST(CudaColumns, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
