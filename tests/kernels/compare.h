// Element-wise comparison for tests: |got − ref| <= abs + rel·|ref| for every
// element. On failure the message names the tensor, the number of bad
// elements, the first bad index (with both values) and the largest difference.
// Usage: EXPECT_TRUE(grpo::test::all_close("logits", got, ref, 1e-5, 1e-4));
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

namespace grpo::test {

template <class A, class B>
::testing::AssertionResult all_close(const char* name, const A* got, const B* ref, int64_t n, double abs_tol,
                                     double rel_tol) {
  int64_t n_bad = 0, first_bad = -1, worst = -1;
  double max_diff = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(got[i]), r = double(ref[i]);
    const double d = std::fabs(g - r);
    const bool bad = !(d <= abs_tol + rel_tol * std::fabs(r));  // NaN counts as bad
    if (bad) {
      if (first_bad < 0) first_bad = i;
      ++n_bad;
    }
    if (!(d <= max_diff)) {
      max_diff = d;
      worst = i;
    }
  }
  if (n_bad == 0) return ::testing::AssertionSuccess() << name << ": max diff " << max_diff;
  std::ostringstream os;
  os.precision(9);
  os << name << ": " << n_bad << " of " << n << " elements differ (abs " << abs_tol << " + rel " << rel_tol
     << "·|ref|); first bad index " << first_bad << ": got " << double(got[first_bad]) << ", ref "
     << double(ref[first_bad]) << "; max diff " << max_diff << " at index " << worst << " (got "
     << double(got[worst]) << ", ref " << double(ref[worst]) << ")";
  return ::testing::AssertionFailure() << os.str();
}

template <class A, class B>
::testing::AssertionResult all_close(const char* name, const std::vector<A>& got, const std::vector<B>& ref,
                                     double abs_tol, double rel_tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " != reference size " << ref.size();
  return all_close(name, got.data(), ref.data(), int64_t(got.size()), abs_tol, rel_tol);
}

// max|a − b| / max|ref|: one number for "relative error of a whole tensor".
template <class A, class B>
double max_rel_error(const std::vector<A>& got, const std::vector<B>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    num = std::fmax(num, std::fabs(double(got[i]) - double(ref[i])));
    den = std::fmax(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace grpo::test
