// Fused LM head + log-softmax on the CPU, against log_softmax computed here in
// double from explicit logits; backward by finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/logprob.h"

using namespace grpo;
using namespace grpo::test;

namespace {
// logp, lse, entropy of z = h·wᵀ / temperature, in double
void logprob_ref(const std::vector<float>& h, const std::vector<float>& w, const std::vector<int32_t>& tg, int64_t N,
                 int64_t C, int64_t V, double temp, std::vector<double>& logp, std::vector<double>& lse,
                 std::vector<double>& ent) {
  logp.assign(size_t(N), 0);
  lse.assign(size_t(N), 0);
  ent.assign(size_t(N), 0);
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < N; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(h[size_t(i * C + c)]) * w[size_t(j * C + c)];
      z[size_t(j)] = s / temp;
      m = std::max(m, z[size_t(j)]);
    }
    double l = 0;
    for (double x : z) l += std::exp(x - m);
    lse[size_t(i)] = m + std::log(l);
    logp[size_t(i)] = z[size_t(tg[size_t(i)])] - lse[size_t(i)];
    double e = 0;
    for (double x : z) e -= std::exp(x - lse[size_t(i)]) * (x - lse[size_t(i)]);
    ent[size_t(i)] = e;
  }
}
}  // namespace

TEST(Logprob, ForwardMatchesNaiveLogSoftmax) {
  Context& ctx = test_ctx();
  // V spans 3 vocabulary chunks (last one ragged), N spans 2 row tiles.
  const int64_t N = 70, C = 24, V = 2500;
  const float temp = 0.7f;
  auto h = randn(size_t(N * C), 1), w = randn(size_t(V * C), 2, 0.3f);
  auto tg = randint(size_t(N), 0, int32_t(V), 3);
  tg[0] = 0;
  tg[1] = int32_t(V - 1);
  tg[2] = 1024;  // chunk boundary
  std::vector<float> logp(static_cast<size_t>(N)), lse(static_cast<size_t>(N)), ent(static_cast<size_t>(N));
  Tensor tlp = host(logp, {N}), tl = host(lse, {N}), te = host(ent, {N});
  token_logprobs_forward(ctx, tlp, tl, &te, host(h, {N, C}), host(w, {V, C}), host(tg, {N}), temp);
  std::vector<double> rlp, rl, re;
  logprob_ref(h, w, tg, N, C, V, temp, rlp, rl, re);
  EXPECT_TRUE(all_close("logp", logp, rlp, 1e-4, 1e-5));
  EXPECT_TRUE(all_close("lse", lse, rl, 1e-4, 1e-5));
  EXPECT_TRUE(all_close("entropy", ent, re, 1e-4, 1e-4));
  // one row alone gives bit-identical results (batch invariance)
  std::vector<float> lp1(1), l1(1);
  Tensor tlp1 = host(lp1, {1}), tl1 = host(l1, {1});
  std::vector<float> h5(h.begin() + 5 * C, h.begin() + 6 * C);
  std::vector<int32_t> t5 = {tg[5]};
  token_logprobs_forward(ctx, tlp1, tl1, nullptr, host(h5, {1, C}), host(w, {V, C}), host(t5, {1}), temp);
  EXPECT_EQ(lp1[0], logp[5]);
}

TEST(Logprob, BackwardFiniteDifferences) {
  Context& ctx = test_ctx();
  const int64_t N = 67, C = 6, V = 1100;  // 2 row tiles, 2 vocabulary chunks
  const float temp = 1.3f;
  auto h = randn(size_t(N * C), 4), w = randn(size_t(V * C), 5, 0.5f), r = randn(size_t(N), 6);
  auto tg = randint(size_t(N), 0, int32_t(V), 7);
  auto loss = [&] {
    std::vector<float> logp(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
    Tensor tlp = host(logp, {N}), tl = host(lse, {N});
    token_logprobs_forward(ctx, tlp, tl, nullptr, host(h, {N, C}), host(w, {V, C}), host(tg, {N}), temp);
    return dot(logp, r);
  };
  std::vector<float> logp(static_cast<size_t>(N)), lse(static_cast<size_t>(N)), dh(size_t(N * C)), dw(size_t(V * C), 0.f);
  Tensor tlp = host(logp, {N}), tl = host(lse, {N}), tdh = host(dh, {N, C}), tdw = host(dw, {V, C});
  token_logprobs_forward(ctx, tlp, tl, nullptr, host(h, {N, C}), host(w, {V, C}), host(tg, {N}), temp);
  token_logprobs_backward(ctx, tdh, &tdw, host(r, {N}), host(h, {N, C}), host(w, {V, C}), host(tg, {N}), tl, temp);
  EXPECT_TRUE(grad_check("dh", h, loss, dh, 1e-2f, 2e-3, 2e-2));
  EXPECT_TRUE(grad_check("dw", w, loss, dw, 1e-2f, 2e-3, 2e-2));
}
