// Small helpers shared by the benchmark mains: device memory in use, the date
// for result files (DESIGN.md section 6).
#pragma once
#include <cstddef>
#include <ctime>
#include <string>

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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

inline std::string today() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace grpo::bench
