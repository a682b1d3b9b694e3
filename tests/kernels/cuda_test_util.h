// Shared pieces of the CUDA-vs-CPU parity tests. Each test draws random inputs,
// rounds them to the storage dtype under test (so that CPU and GPU read the same
// values), runs the CPU reference in f32 and the CUDA op in bf16 and f32, and
// compares with |got − ref| <= abs + rel·|ref|. Outputs are poisoned with NaN
// first, so an element the kernel never writes fails the comparison. Messages
// name the op, dtype, first bad index and the largest difference.
// The whole file compiles to skips on a build without CUDA or without a device.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/tensor.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo::cudatest {

#define GRPO_SKIP_WITHOUT_CUDA() \
  do {                           \
    if (!::grpo::cuda_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)"; \
  } while (0)

inline Context& cpu_ctx() {
  static Context c{ContextOptions{}};
  return c;
}
inline Context& gpu_ctx() {
  static Context* c = [] {
    ContextOptions o;
    o.device = Device::cuda;
    return new Context(o);
  }();
  return *c;
}

using test::randint;
using test::randn;

// Values as the dtype stores them (bf16/f16 round to nearest even).
inline std::vector<float> rounded(std::vector<float> v, DType dt) {
  if (dt == DType::bf16)
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  else if (dt == DType::f16)
    for (float& x : v) x = f16_to_f32(f32_to_f16(x));
  return v;
}

inline Tensor host(std::vector<float>& v, const std::vector<int64_t>& shape) {
  return tensor_borrow(v.data(), DType::f32, Device::cpu, shape);
}
inline Tensor host_i32(std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  return tensor_borrow(v.data(), DType::i32, Device::cpu, shape);
}
inline Tensor dev(const std::vector<float>& v, DType dt, const std::vector<int64_t>& shape) {
  Tensor t = tensor_from_f32(Device::cuda, dt, v, shape);
  return t;
}
template <class I>
inline Tensor dev_int(const std::vector<I>& v, DType dt, const std::vector<int64_t>& shape) {
  Tensor t = tensor_empty(Device::cuda, dt, shape);
  Tensor h = tensor_borrow(const_cast<I*>(v.data()), dt, Device::cpu, shape);
  tensor_copy(t, h);
  return t;
}
// A device tensor filled with NaN: unwritten elements fail every comparison.
inline Tensor poisoned(DType dt, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return dev(std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()), dt, shape);
}
// Waits for the GPU context's stream, then copies to the host as f32.
inline std::vector<float> fetch(const Tensor& t) {
  gpu_ctx().synchronize();
  return tensor_to_f32(t);
}
// Waits for the stream, then copies the elements of t as they are stored (host type T of t's dtype).
template <class T>
std::vector<T> fetch_raw(const Tensor& t) {
  gpu_ctx().synchronize();
  std::vector<T> v(static_cast<size_t>(t.numel()));
  Tensor h = tensor_borrow(v.data(), t.dtype, Device::cpu, {t.numel()});
  Tensor s = t.view({t.numel()});
  tensor_copy(h, s);
  return v;
}
inline std::vector<int32_t> fetch_i32(const Tensor& t) { return fetch_raw<int32_t>(t); }
// A device tensor of E4M3 codes (one byte each).
inline Tensor dev_fp8(const std::vector<uint8_t>& b, const std::vector<int64_t>& shape) {
  Tensor t = tensor_empty(Device::cuda, DType::f8e4m3, shape);
  Tensor h = tensor_borrow(const_cast<uint8_t*>(b.data()), DType::f8e4m3, Device::cpu, shape);
  tensor_copy(t, h);
  return t;
}

struct Tol {
  double abs, rel;
};
// Elementwise ops: output rounding only. Reductions get looser tolerances at the call.
inline Tol tol_elem(DType dt) { return dt == DType::f32 ? Tol{1e-6, 1e-5} : Tol{1e-3, 8e-3}; }
inline Tol tol_reduce(DType dt) { return dt == DType::f32 ? Tol{2e-5, 2e-4} : Tol{2e-2, 2e-2}; }

inline ::testing::AssertionResult close(const std::string& name, const std::vector<float>& got,
                                        const std::vector<float>& ref, Tol tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " != reference " << ref.size();
  int64_t n_bad = 0, first = -1, worst = -1;
  double max_diff = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    const double d = std::fabs(g - r);
    const bool same_inf = std::isinf(r) && g == r;
    const bool bad = !same_inf && !(d <= tol.abs + tol.rel * std::fabs(r));
    if (bad) {
      if (first < 0) first = int64_t(i);
      ++n_bad;
    }
    if (!same_inf && !(d <= max_diff)) {
      max_diff = d;
      worst = int64_t(i);
    }
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << name << ": " << n_bad << " of " << ref.size() << " differ (abs " << tol.abs << " + rel " << tol.rel
     << "); first bad index " << first << ": got " << got[static_cast<size_t>(first)] << ", ref " << ref[static_cast<size_t>(first)]
     << "; max diff " << max_diff;
  if (worst >= 0) os << " at " << worst << " (got " << got[static_cast<size_t>(worst)] << ", ref " << ref[static_cast<size_t>(worst)] << ")";
  return ::testing::AssertionFailure() << os.str();
}

inline std::string tag(const char* op, DType dt) { return std::string(op) + " [" + dtype_name(dt) + "]"; }

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// max|got − ref| / max|ref| (NaN fails): for long bf16 reductions.
inline ::testing::AssertionResult close_max_rel(const std::string& name, const std::vector<float>& got,
                                      const std::vector<float>& ref, double max_rel) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (std::isnan(d)) return ::testing::AssertionFailure() << name << ": NaN at index " << i;
    num = std::max(num, d);
    den = std::max(den, std::fabs(double(ref[i])));
  }
  const double r = den > 0 ? num / den : num;
  if (r <= max_rel) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": max|diff|/max|ref| = " << r << " > " << max_rel;
}

// Flattened prefill tile list (row0, n_rows, seq, pos0 per tile; PagedAttnMeta::prefill_tiles)
// over S sequences whose query rows are consecutive runs: runs[s].n rows starting at position
// runs[s].pos0, in sequence order. Each run is cut into pieces of cut(k) rows (k counts the
// pieces of the whole batch) and the tiles are shuffled with rng.
template <class Runs, class Cut>
std::vector<int32_t> shuffled_prefill_tiles(const Runs& runs, int64_t S, Cut cut, std::mt19937& rng) {
  std::vector<std::array<int32_t, 4>> tl;
  int32_t row0 = 0;
  int k = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& r = runs[static_cast<size_t>(s)];
    for (int32_t i = 0; i < r.n;) {
      const int32_t n = std::min(cut(k++), r.n - i);
      tl.push_back({row0 + i, n, int32_t(s), r.pos0 + i});
      i += n;
    }
    row0 += r.n;
  }
  std::shuffle(tl.begin(), tl.end(), rng);
  std::vector<int32_t> flat;
  for (const auto& t : tl) flat.insert(flat.end(), t.begin(), t.end());
  return flat;
}

}  // namespace grpo::cudatest
