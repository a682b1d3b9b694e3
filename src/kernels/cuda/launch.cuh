// Launch helpers of the CUDA backend: grid arithmetic, the stream of a context, the SM count,
// and programmatic dependent launch (PDL), the chaining every decode-path kernel uses.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "core/context.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"

namespace grpo::cuda {

// ---- programmatic dependent launch (sm_90) ----
// A kernel launched with launch_pdl may start while the previous kernel on the stream is
// still running (once every block of that kernel has called pdl_trigger, or exited); it
// must call pdl_wait before it touches memory, which returns when the previous grid has
// completed and its writes are visible. Every kernel launched through launch_pdl calls
// pdl_trigger(); pdl_wait(); first (before any early return), so "grid done" still implies
// "all earlier grids done" along the chain. In kernels launched normally both are no-ops.
// GRPO_PDL=0 launches everything without the attribute (A/B runs; docs/BENCHMARKS.md).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
inline bool pdl_enabled() {
  static const bool on = !env_off("GRPO_PDL");
  return on;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }
// Streaming multiprocessors of the current device (cached per device).
inline int sm_count() {
  static std::atomic<int> cache[64];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const bool slot = dev >= 0 && dev < 64;
  if (slot) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int c = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev));
  if (c < 1) c = 1;
  if (slot) cache[dev].store(c, std::memory_order_relaxed);
  return c;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization
// (see pdl_wait above; unless GRPO_PDL=0) and, for cluster_x > 1, 1-D thread-block clusters of
// cluster_x blocks (grid.x a multiple of it).
template <class... KArgs, class... Args>
void launch_pdl_on(cudaStream_t stream, unsigned cluster_x, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                   size_t smem, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
// The same on ctx's stream, without clusters.
template <class... KArgs, class... Args>
void launch_pdl(const Context& ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  launch_pdl_on(stream_of(ctx), 1u, kernel, grid, block, smem, std::forward<Args>(args)...);
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Grid dimension for a flat elementwise loop (grid-stride loops cover the rest).
inline unsigned flat_grid(int64_t n, int threads) {
  int64_t b = ceil_div(n, threads);
  if (b > 65536) b = 65536;
  return unsigned(b < 1 ? 1 : b);
}

}  // namespace grpo::cuda
