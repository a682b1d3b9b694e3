// linear_forward / linear_backward on the CPU: forward against a double
// reference computed here, backward by finite differences.
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/linear.h"

using namespace grpo;
using namespace grpo::test;

namespace {
// out[m,n] = Σ_k x[m,k]·w[n,k] + b[n], in double
std::vector<double> linear_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b,
                               int64_t M, int64_t K, int64_t N) {
  std::vector<double> o(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b ? double((*b)[size_t(n)]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(m * K + k)]) * double(w[size_t(n * K + k)]);
      o[size_t(m * N + n)] = s;
    }
  return o;
}
}  // namespace

TEST(Linear, ForwardMatchesReference) {
  Context& ctx = test_ctx();
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 320}, {7, 33, 5}, {130, 96, 257}}) {
    auto x = randn(size_t(M * K), 1), w = randn(size_t(N * K), 2), b = randn(size_t(N), 3);
    std::vector<float> out(size_t(M * N));
    Tensor to = host(out, {M, N});
    Tensor tb = host(b, {N});
    linear_forward(ctx, to, host(x, {M, K}), host(w, {N, K}), &tb, false);
    EXPECT_TRUE(all_close("linear+bias", out, linear_ref(x, w, &b, M, K, N), 1e-5, 1e-5));
    // accumulate: out += x·wᵀ (no bias) on top of the previous result
    std::vector<double> ref = linear_ref(x, w, &b, M, K, N), add = linear_ref(x, w, nullptr, M, K, N);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += add[i];
    linear_forward(ctx, to, host(x, {M, K}), host(w, {N, K}), nullptr, true);
    EXPECT_TRUE(all_close("linear accumulate", out, ref, 1e-5, 1e-5));
  }
}

TEST(Linear, BackwardFiniteDifferences) {
  Context& ctx = test_ctx();
  const int64_t M = 5, K = 12, N = 9;
  auto x = randn(size_t(M * K), 11), w = randn(size_t(N * K), 12), b = randn(size_t(N), 13);
  auto r = randn(size_t(M * N), 14);  // projection: L = Σ r·out
  auto loss = [&] {
    std::vector<float> out(size_t(M * N));
    Tensor to = host(out, {M, N}), tb = host(b, {N});
    linear_forward(ctx, to, host(x, {M, K}), host(w, {N, K}), &tb, false);
    return dot(out, r);
  };
  std::vector<float> dx(size_t(M * K)), dw(size_t(N * K), 0.f), db(size_t(N), 0.f);
  Tensor tdx = host(dx, {M, K}), tdw = host(dw, {N, K}), tdb = host(db, {N});
  linear_backward(ctx, &tdx, &tdw, &tdb, host(r, {M, N}), host(x, {M, K}), host(w, {N, K}), false);
  EXPECT_TRUE(grad_check("dx", x, loss, dx));
  EXPECT_TRUE(grad_check("dw", w, loss, dw));
  EXPECT_TRUE(grad_check("db", b, loss, db));

  // dw/db accumulate and dx accumulates when asked: a second call doubles them.
  std::vector<float> dx1 = dx, dw1 = dw, db1 = db;
  linear_backward(ctx, &tdx, &tdw, &tdb, host(r, {M, N}), host(x, {M, K}), host(w, {N, K}), true);
  for (auto* v : {&dx1, &dw1, &db1})
    for (float& f : *v) f *= 2.f;
  EXPECT_TRUE(all_close("dx accumulated", dx, dx1, 1e-6, 1e-6));
  EXPECT_TRUE(all_close("dw accumulated", dw, dw1, 1e-6, 1e-6));
  EXPECT_TRUE(all_close("db accumulated", db, db1, 1e-6, 1e-6));
}

TEST(Linear, ResultIndependentOfThreadCount) {
  ContextOptions o1;
  o1.n_threads = 1;
  Context one(o1);
  Context& two = test_ctx();
  const int64_t M = 3, K = 200, N = 1000;
  auto x = randn(size_t(M * K), 21), w = randn(size_t(N * K), 22);
  std::vector<float> a(size_t(M * N)), b(size_t(M * N));
  Tensor ta = host(a, {M, N}), tb = host(b, {M, N});
  linear_forward(one, ta, host(x, {M, K}), host(w, {N, K}), nullptr, false);
  linear_forward(two, tb, host(x, {M, K}), host(w, {N, K}), nullptr, false);
  EXPECT_TRUE(all_close("1 vs 2 threads", a, b, 0.0, 0.0));
}

TEST(Linear, DeterministicModeIsBatchInvariant) {
  ContextOptions o;
  o.n_threads = 2;
  o.deterministic = true;
  Context det(o);
  const int64_t M = 6, K = 96, N = 300;
  auto x = randn(size_t(M * K), 31), w = randn(size_t(N * K), 32);
  std::vector<float> all(size_t(M * N)), one(static_cast<size_t>(N));
  Tensor ta = host(all, {M, N});
  linear_forward(det, ta, host(x, {M, K}), host(w, {N, K}), nullptr, false);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K);
    Tensor to = host(one, {1, N});
    linear_forward(det, to, host(xr, {1, K}), host(w, {N, K}), nullptr, false);
    EXPECT_TRUE(all_close("row alone vs in batch", one.data(), all.data() + m * N, N, 0.0, 0.0));
  }
}

TEST(LinearDeathTest, DispatcherRejectsBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> x(12), w(15), out(20);
  Tensor tout = host(out, {4, 5});
  // x (4,3) against w (5,3) is fine; w viewed as (3,5) has the wrong K
  EXPECT_DEATH(linear_forward(test_ctx(), tout, host(x, {4, 3}), host(w, {3, 5}), nullptr, false),
               "linear_forward: x \\(M,K\\), w \\(N,K\\)");
  std::vector<int32_t> xi(12);
  EXPECT_DEATH(linear_forward(test_ctx(), tout, host(xi, {4, 3}), host(w, {5, 3}), nullptr, false),
               "activation dtype");
}

// The row buckets the CUDA GEMM's algorithm choices are shared over (and prewarmed for): four
// per octave above 64, each named by its top; counts up to 64 are their own.
TEST(Linear, GemmRowBuckets) {
  const std::pair<int64_t, int64_t> cases[] = {{1, 1},       {64, 64},     {65, 80},     {80, 80},   {81, 96},
                                               {112, 112},   {113, 128},   {128, 128},   {129, 160}, {300, 320},
                                               {513, 640},   {600, 640},   {641, 768},   {1025, 1280}, {8192, 8192},
                                               {8193, 10240}, {16384, 16384}};
  for (auto [m, top] : cases) EXPECT_EQ(gemm_row_bucket(m), top) << "m = " << m;
}
