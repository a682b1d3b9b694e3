// Rotary embedding on the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/rope.h"

using namespace grpo;
using namespace grpo::test;

TEST(Rope, ForwardHandDerived) {
  // D = 4: pairs (x0, x2) and (x1, x3). At position 1 with angles θ0 = π/2, θ1 = π:
  // (x0, x2) = (1, 2) rotated by 90° -> (−2, 1); (x1, x3) = (3, 4) rotated by 180° -> (−3, −4).
  Context& ctx = test_ctx();
  std::vector<float> cos = {1.f, 1.f, 0.f, -1.f}, sin = {0.f, 0.f, 1.f, 0.f};  // rows: position 0, 1
  std::vector<float> x = {1.f, 3.f, 2.f, 4.f};
  std::vector<int32_t> pos = {1};
  Tensor tx = host(x, {1, 1, 4});
  rope_forward(ctx, tx, host(pos, {1}), host(cos, {2, 2}), host(sin, {2, 2}));
  EXPECT_TRUE(all_close("rotated", x, std::vector<double>{-2, -3, 1, -4}, 1e-7, 0));
}

TEST(Rope, BackwardIsInverseAndMatchesFiniteDifferences) {
  Context& ctx = test_ctx();
  const int64_t T = 5, H = 3, D = 8, P = 16;
  std::vector<float> cos(size_t(P * D / 2)), sin(cos.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = p * std::pow(100.0, -2.0 * i / D);
      cos[size_t(p * D / 2 + i)] = float(std::cos(a));
      sin[size_t(p * D / 2 + i)] = float(std::sin(a));
    }
  std::vector<int32_t> pos = {0, 3, 7, 15, 3};
  auto x = randn(size_t(T * H * D), 1), r = randn(x.size(), 2);
  Tensor tp = host(pos, {T}), tc = host(cos, {P, D / 2}), ts = host(sin, {P, D / 2});
  auto loss = [&] {
    std::vector<float> y = x;
    Tensor ty = host(y, {T, H, D});
    rope_forward(ctx, ty, tp, tc, ts);
    return dot(y, r);
  };
  std::vector<float> dx = r;
  Tensor tdx = host(dx, {T, H, D});
  rope_backward(ctx, tdx, tp, tc, ts);
  EXPECT_TRUE(grad_check("dx", x, loss, dx));
  // forward then backward is the identity
  std::vector<float> y = x;
  Tensor ty = host(y, {T, H, D});
  rope_forward(ctx, ty, tp, tc, ts);
  rope_backward(ctx, ty, tp, tc, ts);
  EXPECT_TRUE(all_close("rope⁻¹(rope(x))", y, x, 1e-6, 1e-6));
}
