// Shared pieces of the kernel tests: random data, host tensors over vectors,
// and a finite-difference gradient check.
//
// Gradient check: for an op y = f(x) and a fixed random projection r, the
// scalar loss L(x) = Σ r·y has dL/dx = backward(dout = r). Each checked input
// element is perturbed by ±eps and (L(x+eps) − L(x−eps)) / 2eps (loss summed in
// double) is compared with the analytic gradient. Forward passes run in f32,
// so eps ~1e-2 and tolerances of ~1e-3 abs / 1e-2 rel are what f32 rounding and
// the O(eps²) Taylor term allow.
#pragma once
#include <functional>
#include <random>
#include <vector>

#include "compare.h"
#include "core/context.h"
#include "core/tensor.h"

namespace grpo::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline std::vector<int32_t> randint(size_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(g);
  return v;
}

// Borrowed host tensors over vectors the test owns (perturbing the vector
// changes what the op reads).
inline Tensor host(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return tensor_borrow(v.data(), DType::f32, Device::cpu, shape);
}
inline Tensor host(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return tensor_borrow(v.data(), DType::i32, Device::cpu, shape);
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Compares `grad` with central differences of `loss` w.r.t. `x` at up to
// `max_checks` elements (all when x is small; else a fixed random subset).
inline ::testing::AssertionResult grad_check(const char* name, std::vector<float>& x,
                                             const std::function<double()>& loss, const std::vector<float>& grad,
                                             float eps = 1e-2f, double abs_tol = 1e-3, double rel_tol = 1e-2,
                                             size_t max_checks = 96) {
  std::vector<size_t> idx;
  if (x.size() <= max_checks) {
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  } else {
    std::mt19937 g(7);
    std::uniform_int_distribution<size_t> d(0, x.size() - 1);
    for (size_t i = 0; i < max_checks; ++i) idx.push_back(d(g));
  }
  std::vector<double> num(idx.size()), ana(idx.size());
  for (size_t c = 0; c < idx.size(); ++c) {
    const size_t i = idx[c];
    const float x0 = x[i];
    const float xp = x0 + eps, xm = x0 - eps;  // the step actually taken, after f32 rounding
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    num[c] = (lp - lm) / (double(xp) - double(xm));
    ana[c] = grad[i];
  }
  return all_close(name, ana.data(), num.data(), int64_t(idx.size()), abs_tol, rel_tol);
}

inline Context& test_ctx() {
  static Context ctx([] {
    ContextOptions o;
    o.n_threads = 2;
    return o;
  }());
  return ctx;
}

}  // namespace grpo::test
