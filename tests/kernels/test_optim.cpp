// AdamW and sum_squares on the CPU, against torch.optim.AdamW's update written
// out in double here.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/optim.h"

using namespace grpo;
using namespace grpo::test;

TEST(Optim, AdamWMatchesTorchFormula) {
  Context& ctx = test_ctx();
  const int64_t n = 1000;
  auto p0 = randn(size_t(n), 1);
  std::vector<float> master = p0, m(size_t(n), 0.f), v(size_t(n), 0.f), param(static_cast<size_t>(n));
  std::vector<double> rp(p0.begin(), p0.end()), rm(size_t(n), 0.0), rv(size_t(n), 0.0);
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.grad_scale = 0.5f;
  Tensor tmaster = host(master, {n}), tm = host(m, {n}), tv = host(v, {n}), tparam = host(param, {n});
  for (int step = 1; step <= 3; ++step) {
    auto g = randn(size_t(n), uint32_t(10 + step));
    hp.step = step;
    adamw_step(ctx, tmaster, tparam, host(g, {n}), tm, tv, hp);
    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[size_t(i)]) * hp.grad_scale;
      rp[size_t(i)] *= 1.0 - lr * hp.weight_decay;
      rm[size_t(i)] = b1 * rm[size_t(i)] + (1 - b1) * gi;
      rv[size_t(i)] = b2 * rv[size_t(i)] + (1 - b2) * gi * gi;
      const double mh = rm[size_t(i)] / (1 - std::pow(b1, step));
      const double denom = std::sqrt(rv[size_t(i)]) / std::sqrt(1 - std::pow(b2, step)) + hp.eps;
      rp[size_t(i)] -= lr * mh / denom;
    }
  }
  EXPECT_TRUE(all_close("master", master, rp, 1e-6, 1e-5));
  EXPECT_TRUE(all_close("m", m, rm, 1e-7, 1e-5));
  EXPECT_TRUE(all_close("v", v, rv, 1e-8, 1e-5));
  EXPECT_TRUE(all_close("param copy", param, master, 0, 0));

  // bf16 compute copy is master rounded to bf16
  Tensor pb = tensor_empty(Device::cpu, DType::bf16, {n});
  auto g = randn(size_t(n), 99);
  hp.step = 4;
  adamw_step(ctx, tmaster, pb, host(g, {n}), tm, tv, hp);
  std::vector<float> got = tensor_to_f32(pb), want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = bf16_to_f32(f32_to_bf16(master[size_t(i)]));
  EXPECT_TRUE(all_close("bf16 param", got, want, 0, 0));
}

TEST(Optim, SumSquaresDeterministicAndExact) {
  ContextOptions o1;
  o1.n_threads = 1;
  Context one(o1);
  const int64_t n = 300001;  // several 64K blocks and a ragged tail
  auto g = randn(size_t(n), 5);
  double ref = 0.0;
  for (float x : g) ref += double(x) * double(x);
  const double a = sum_squares(test_ctx(), host(g, {n})), b = sum_squares(one, host(g, {n}));
  EXPECT_EQ(a, b);
  EXPECT_NEAR(a, ref, 1e-9 * ref);
}
