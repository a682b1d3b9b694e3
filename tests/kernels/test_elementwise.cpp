// Elementwise ops on the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "kernel_test_util.h"
#include "kernels/elementwise.h"

using namespace grpo;
using namespace grpo::test;

TEST(Elementwise, AddScaleCast) {
  Context& ctx = test_ctx();
  std::vector<float> a = {1.f, -2.f, 3.5f}, b = {0.5f, 2.f, -1.f};
  Tensor ta = host(a, {3});
  add_inplace(ctx, ta, host(b, {3}));
  EXPECT_TRUE(all_close("add", a, std::vector<double>{1.5, 0, 2.5}, 0, 0));
  scale_inplace(ctx, ta, -2.f);
  EXPECT_TRUE(all_close("scale", a, std::vector<double>{-3, 0, -5}, 0, 0));
  // f32 -> bf16 -> f32: 1.00390625 ties to 1.0 (even), 3.14159265 -> 3.140625 (0x4049)
  std::vector<float> src = {1.00390625f, 3.14159265f, -2.5f}, back(3);
  Tensor tb = tensor_empty(Device::cpu, DType::bf16, {3});
  cast(ctx, tb, host(src, {3}));
  Tensor tback = host(back, {3});
  cast(ctx, tback, tb);
  EXPECT_TRUE(all_close("bf16 round trip", back, std::vector<double>{1.0, 3.140625, -2.5}, 0, 0));
}

TEST(Elementwise, SwigluForwardAndBackward) {
  Context& ctx = test_ctx();
  const int64_t N = 3, F = 7;
  auto gu = randn(size_t(N * 2 * F), 1, 2.f), r = randn(size_t(N * F), 2);
  std::vector<float> out(size_t(N * F));
  Tensor to = host(out, {N, F});
  swiglu_forward(ctx, to, host(gu, {N, 2 * F}));
  std::vector<double> ref(out.size());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < F; ++j) {
      const double g = gu[size_t(i * 2 * F + j)], u = gu[size_t(i * 2 * F + F + j)];
      ref[size_t(i * F + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  EXPECT_TRUE(all_close("swiglu", out, ref, 1e-6, 1e-6));
  auto loss = [&] {
    std::vector<float> o(size_t(N * F));
    Tensor t2 = host(o, {N, F});
    swiglu_forward(ctx, t2, host(gu, {N, 2 * F}));
    return dot(o, r);
  };
  std::vector<float> dgu(gu.size());
  Tensor tdgu = host(dgu, {N, 2 * F});
  swiglu_backward(ctx, tdgu, host(r, {N, F}), host(gu, {N, 2 * F}));
  EXPECT_TRUE(grad_check("dgate_up", gu, loss, dgu));
}

TEST(Elementwise, QkvSplitMergeRoundTrip) {
  Context& ctx = test_ctx();
  const int64_t T = 3, Hq = 4, Hkv = 2, D = 5, W = (Hq + 2 * Hkv) * D;
  std::vector<float> qkv(size_t(T * W));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i);
  std::vector<float> q(size_t(T * Hq * D)), k(size_t(T * Hkv * D)), v(k.size()), back(qkv.size());
  Tensor tq = host(q, {T, Hq, D}), tk = host(k, {T, Hkv, D}), tv = host(v, {T, Hkv, D});
  qkv_split(ctx, tq, tk, tv, host(qkv, {T, W}));
  // token 1: q starts at 1·W, k at 1·W + Hq·D, v at 1·W + (Hq+Hkv)·D
  EXPECT_EQ(q[size_t(Hq * D)], float(W));
  EXPECT_EQ(k[size_t(Hkv * D)], float(W + Hq * D));
  EXPECT_EQ(v[size_t(Hkv * D + 1)], float(W + (Hq + Hkv) * D + 1));
  Tensor tb = host(back, {T, W});
  qkv_merge(ctx, tb, tq, tk, tv);
  EXPECT_TRUE(all_close("merge(split(qkv))", back, qkv, 0, 0));
}
