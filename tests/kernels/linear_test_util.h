// Shared fixtures of the decode-GEMM tests (test_cuda_linear_small_m.cpp, test_linear_wgmma.cpp):
// a problem of up to 64 bf16 rows against the CPU linear_forward (f32) and the per-element error
// bound of a kernel that sums in f32 and rounds once to bf16 (see those files' headers).
#pragma once
#include <cstring>

#include "cuda_test_util.h"
#include "kernels/linear.h"

#ifdef GRPO_HAVE_CUDA
namespace grpo::cudatest {

enum class Bias { none, bf16, f32 };

struct Case {
  int64_t N, K;
  Bias bias;
  bool accumulate;
};

inline std::string case_name(const Case& c, int64_t M) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         (c.bias == Bias::bf16 ? " bias bf16" : c.bias == Bias::f32 ? " bias f32" : "") +
         (c.accumulate ? " accumulate" : "");
}
inline std::vector<float> absv(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

inline ::testing::AssertionResult within_bound(const std::string& name, const std::vector<float>& got,
                                               const std::vector<float>& ref, const std::vector<float>& bound) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " != " << ref.size();
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!(d <= bound[i]))
      return ::testing::AssertionFailure() << name << ": index " << i << " got " << got[i] << ", ref " << ref[i]
                                           << ", |diff| " << d << " > bound " << bound[i];
  }
  return ::testing::AssertionSuccess();
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

// Inputs for up to 64 rows (smaller M use a prefix of the rows) and the f32 reference.
struct Problem {
  Case c;
  std::vector<float> x, w, b, old;  // bf16-rounded values
  Tensor gx, gw, gb;

  Problem(const Case& cs, uint32_t seed) : c(cs) {
    x = rounded(randn(size_t(64 * c.K), seed), DType::bf16);
    w = rounded(randn(size_t(c.N * c.K), seed + 1, 0.05f), DType::bf16);
    b = rounded(randn(size_t(c.N), seed + 2), DType::bf16);
    old = rounded(randn(size_t(64 * c.N), seed + 3), DType::bf16);
    gx = dev(x, DType::bf16, {64, c.K});
    gw = dev(w, DType::bf16, {c.N, c.K});
    if (c.bias != Bias::none) gb = dev(b, c.bias == Bias::f32 ? DType::f32 : DType::bf16, {c.N});
  }

  // Device output for the first M rows: the old values when accumulating, NaN otherwise.
  Tensor out(int64_t M) const {
    if (!c.accumulate) return poisoned(DType::bf16, {M, c.N});
    return dev(std::vector<float>(old.begin(), old.begin() + M * c.N), DType::bf16, {M, c.N});
  }
  Tensor xs(int64_t M) const { return gx.slice0(0, M); }
  const Tensor* bias() const { return c.bias == Bias::none ? nullptr : &gb; }

  // Reference values and per-element bounds for the first M rows.
  void reference(int64_t M, std::vector<float>& ref, std::vector<float>& bound) {
    std::vector<float> xm(x.begin(), x.begin() + M * c.K), pre(size_t(M * c.N)), mag(size_t(M * c.N));
    std::vector<float> ax = absv(xm), aw = absv(w);
    Tensor hx = host(xm, {M, c.K}), hw = host(w, {c.N, c.K}), hp = host(pre, {M, c.N});
    Tensor hax = host(ax, {M, c.K}), haw = host(aw, {c.N, c.K}), hm = host(mag, {M, c.N});
    cpu::linear_forward(cpu_ctx(), hp, hx, hw, nullptr, false);
    cpu::linear_forward(cpu_ctx(), hm, hax, haw, nullptr, false);
    ref.resize(pre.size());
    bound.resize(pre.size());
    const double u = 1.0 / 256;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        const size_t i = size_t(m * c.N + n);
        double r = pre[i], s = mag[i];
        if (c.accumulate) {
          r += old[i];
          s += std::fabs(old[i]);
        }
        double extra = 0;
        if (c.bias != Bias::none) {
          if (c.bias == Bias::f32) extra = u * std::fabs(r);  // the first rounding, before the bias
          r += b[size_t(n)];
          s += std::fabs(b[size_t(n)]);
        }
        ref[i] = float(r);
        bound[i] = float(1.01 * (u * std::fabs(r) + extra) + 1e-4 * s);
      }
  }
};

}  // namespace grpo::cudatest
#endif
