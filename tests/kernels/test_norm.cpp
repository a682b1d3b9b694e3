// RMSNorm on the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/norm.h"

using namespace grpo;
using namespace grpo::test;

TEST(RMSNorm, ForwardHandDerived) {
  // x = (3, 4), w = (1, 2), eps = 0: mean(x²) = 12.5, rstd = 1/sqrt(12.5) = 0.28284271
  // y = (3·0.28284271·1, 4·0.28284271·2) = (0.84852814, 2.26274170)
  Context& ctx = test_ctx();
  std::vector<float> x = {3.f, 4.f}, w = {1.f, 2.f}, y(2), r(1);
  Tensor ty = host(y, {1, 2}), tr = host(r, {1});
  rmsnorm_forward(ctx, ty, &tr, host(x, {1, 2}), host(w, {2}), 0.f);
  EXPECT_TRUE(all_close("y", y, std::vector<double>{0.848528137, 2.262741700}, 1e-6, 1e-6));
  EXPECT_NEAR(r[0], 0.282842712, 1e-7);
}

TEST(RMSNorm, ForwardMatchesReference) {
  Context& ctx = test_ctx();
  const int64_t N = 37, C = 96;
  const float eps = 1e-5f;
  auto x = randn(size_t(N * C), 1), w = randn(size_t(C), 2);
  std::vector<float> y(x.size()), r(static_cast<size_t>(N));
  Tensor ty = host(y, {N, C}), tr = host(r, {N});
  rmsnorm_forward(ctx, ty, &tr, host(x, {N, C}), host(w, {C}), eps);
  std::vector<double> ref(y.size());
  for (int64_t i = 0; i < N; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[size_t(i * C + c)]) * x[size_t(i * C + c)];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) ref[size_t(i * C + c)] = x[size_t(i * C + c)] * rs * w[size_t(c)];
  }
  EXPECT_TRUE(all_close("rmsnorm", y, ref, 1e-5, 1e-5));
  // in place (out aliases x) gives the same result
  std::vector<float> x2 = x;
  Tensor tx2 = host(x2, {N, C});
  rmsnorm_forward(ctx, tx2, nullptr, tx2, host(w, {C}), eps);
  EXPECT_TRUE(all_close("rmsnorm in place", x2, y, 0.0, 0.0));
}

TEST(RMSNorm, BackwardFiniteDifferences) {
  Context& ctx = test_ctx();
  const int64_t N = 4, C = 10;
  const float eps = 1e-6f;
  auto x = randn(size_t(N * C), 3), w = randn(size_t(C), 4), r = randn(size_t(N * C), 5);
  auto loss = [&] {
    std::vector<float> y(size_t(N * C));
    Tensor ty = host(y, {N, C});
    rmsnorm_forward(ctx, ty, nullptr, host(x, {N, C}), host(w, {C}), eps);
    return dot(y, r);
  };
  std::vector<float> y(size_t(N * C)), rs(static_cast<size_t>(N)), dx(size_t(N * C)), dw(size_t(C), 0.f);
  Tensor ty = host(y, {N, C}), trs = host(rs, {N}), tdx = host(dx, {N, C}), tdw = host(dw, {C});
  rmsnorm_forward(ctx, ty, &trs, host(x, {N, C}), host(w, {C}), eps);
  rmsnorm_backward(ctx, tdx, &tdw, host(r, {N, C}), host(x, {N, C}), host(w, {C}), trs);
  EXPECT_TRUE(grad_check("dx", x, loss, dx));
  EXPECT_TRUE(grad_check("dw", w, loss, dw));
}
