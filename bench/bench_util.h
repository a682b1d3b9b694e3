// Small helpers shared by the benchmark mains: device memory in use, the date
// for result files (format: CONTRIBUTING.md).
#pragma once
#include <cstddef>
#include <ctime>
#include <string>

#ifdef GRPO_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "core/context.h"
#endif
#include <cstdlib>

namespace grpo::bench {

inline size_t device_used_bytes() {
#ifdef GRPO_HAVE_CUDA
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  return total - free_b;
#else
  return 0;
#endif
}

// Brackets a region for `ncu --profile-from-start off` when the environment names it:
// GRPO_PROFILE=<region> (e.g. "train" or "decode"). A no-op otherwise and on the CPU.
inline bool profile_wanted(const char* region) {
  const char* e = std::getenv("GRPO_PROFILE");
  return e && std::string(e) == region;
}
inline void profile_range(const char* region, bool start) {
#ifdef GRPO_HAVE_CUDA
  if (!profile_wanted(region)) return;
  cudaDeviceSynchronize();
  if (start) cudaProfilerStart(); else cudaProfilerStop();
#else
  (void)region;
  (void)start;
#endif
}

#ifdef GRPO_HAVE_CUDA
#define BENCH_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Median milliseconds per call of fn(i) over `repeats` runs of `iters` calls on ctx's stream
// (CUDA events), after three warm-up calls.
inline double time_ms(Context& ctx, const std::function<void(int)>& fn, int iters = 20, int repeats = 7) {
  auto st = static_cast<cudaStream_t>(ctx.stream());
  BENCH_CUDA(cudaDeviceSynchronize());  // uploads ran on the legacy stream
  for (int i = 0; i < 3; ++i) fn(i);
  BENCH_CUDA(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> v;
  int k = 0;
  for (int r = 0; r < repeats; ++r) {
    BENCH_CUDA(cudaEventRecord(a, st));
    for (int i = 0; i < iters; ++i) fn(k++);
    BENCH_CUDA(cudaEventRecord(b, st));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    v.push_back(double(ms) / iters);
  }
  BENCH_CUDA(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A device tensor of N(0, scale²) values in dtype dt.
inline Tensor randt(DType dt, const std::vector<int64_t>& shape, uint32_t seed, float scale = 1.f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return tensor_from_f32(Device::cuda, dt, v, shape);
}
#endif

inline std::string today() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace grpo::bench
