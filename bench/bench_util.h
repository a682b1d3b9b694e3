// Small helpers shared by the benchmark mains: device memory in use, the date
// for result files (format: CONTRIBUTING.md).
#pragma once
#include <cstddef>
#include <ctime>
#include <string>

#ifdef GRPO_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
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

inline std::string today() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace grpo::bench
