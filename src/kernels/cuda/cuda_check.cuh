// Private helpers of the CUDA backend (included by src/kernels/cuda/*.cu only):
// error checks, ceil_div, the stream of a context, f32 <-> storage conversions,
// 16-byte vector loads, warp reductions, the dtype dispatch macro and the
// scratch carve-up of ctx.workspace().
//
// Workspace contract: ctx.workspace() is split once per op call into
//   [0, lt_bytes)            cuBLASLt workspace (min(32 MiB, total/2))
//   [lt_bytes, total)        kernel scratch, handed out by ScratchAlloc
// Ops on one stream run in order, so every op may reuse the whole scratch.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/check.h"
#include "core/context.h"

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t grpo_cuda_err_ = (expr);                                                        \
    if (grpo_cuda_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "CUDA error %s (%s) in %s\n", cudaGetErrorName(grpo_cuda_err_),      \
                   cudaGetErrorString(grpo_cuda_err_), #expr);                                  \
      ::grpo::check_failed(#expr, __FILE__, __LINE__, cudaGetErrorString(grpo_cuda_err_));      \
    }                                                                                           \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                          \
    cublasStatus_t grpo_blas_st_ = (expr);                                                      \
    if (grpo_blas_st_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "cuBLAS status %d in %s\n", int(grpo_blas_st_), #expr);             \
      ::grpo::check_failed(#expr, __FILE__, __LINE__, "cuBLAS call failed");                    \
    }                                                                                           \
  } while (0)

// After every kernel launch: catches bad configurations (grid, shared memory).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Dispatch on a float storage dtype: binds the alias T to float or __nv_bfloat16.
#define GRPO_DISPATCH_FLOAT(dt, T, ...)                                          \
  do {                                                                           \
    switch (dt) {                                                                \
      case ::grpo::DType::f32: { using T = float; __VA_ARGS__; } break;          \
      case ::grpo::DType::bf16: { using T = __nv_bfloat16; __VA_ARGS__; } break; \
      default: GRPO_CHECK_MSG(false, "CUDA op: tensor dtype must be f32 or bf16"); \
    }                                                                            \
  } while (0)

namespace grpo::cuda {

// ---- programmatic dependent launch (sm_90) ----
// A kernel launched with launch_pdl may start while the previous kernel on the stream is
// still running (once every block of that kernel has called pdl_trigger, or exited); it
// must call pdl_wait before it touches memory, which returns when the previous grid has
// completed and its writes are visible. Every kernel launched through launch_pdl calls
// pdl_trigger(); pdl_wait(); first (before any early return), so "grid done" still implies
// "all earlier grids done" along the chain. In kernels launched normally both are no-ops.
// GRPO_PDL=0 launches everything without the attribute (for A/B measurements).
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
// A/B switches from the environment (callers read them once, into a static): env_off is
// true when the variable is set to something starting with '0'; env_long is its value
// when set and within [lo, hi], else def.
inline bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '0';
}
inline long env_long(const char* name, long def, long lo, long hi) {
  const char* e = std::getenv(name);
  if (!e) return def;
  const long v = std::atol(e);
  return v >= lo && v <= hi ? v : def;
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

// ---- storage <-> f32 ----
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// Elements per 16-byte vector.
template <class T> struct Vec16 { static constexpr int n = 16 / int(sizeof(T)); };

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Loads 16 bytes at p (16-byte aligned) as f32.
__device__ __forceinline__ void load_vec(const float* p, float* f) {
  float4 v = *reinterpret_cast<const float4*>(p);
  f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float* f) {
  uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
// Stores 16 bytes of f32 values (rounded to the storage type) at p (16-byte aligned).
__device__ __forceinline__ void store_vec(float* p, const float* f) {
  *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float* f) {
  uint4 v;
  v.x = pack_bf16x2(f[0], f[1]);
  v.y = pack_bf16x2(f[2], f[3]);
  v.z = pack_bf16x2(f[4], f[5]);
  v.w = pack_bf16x2(f[6], f[7]);
  *reinterpret_cast<uint4*>(p) = v;
}

// Butterfly reductions: every lane gets the result; fixed order, so deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the
// result. `sh` holds 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : 0.f;
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(r);
}

// ---- workspace ----
struct Workspace {
  void* lt = nullptr;
  size_t lt_bytes = 0;
  char* scratch = nullptr;
  size_t scratch_bytes = 0;
};
inline Workspace workspace_of(Context& ctx) {
  Tensor& ws = ctx.workspace();
  Workspace w;
  const size_t total = ws.nbytes();
  size_t lt = total / 2;
  if (lt > (size_t(32) << 20)) lt = size_t(32) << 20;
  lt &= ~size_t(255);
  w.lt = ws.data;
  w.lt_bytes = lt;
  w.scratch = static_cast<char*>(ws.data) + lt;
  w.scratch_bytes = total - lt;
  return w;
}

// Bump allocator over the scratch part of the workspace (256-byte aligned pieces).
class ScratchAlloc {
 public:
  explicit ScratchAlloc(Context& ctx) : w_(workspace_of(ctx)) {}
  size_t left() const { return w_.scratch_bytes - used_; }
  template <class T>
  T* alloc(int64_t n, const char* what) {
    size_t bytes = (size_t(n) * sizeof(T) + 255) & ~size_t(255);
    if (bytes > left()) {
      std::fprintf(stderr, "grpo cuda: %s needs %zu bytes of scratch, %zu left; raise ContextOptions::workspace_bytes\n",
                   what, bytes, left());
      GRPO_CHECK_MSG(false, "CUDA workspace too small (see message above)");
    }
    T* p = reinterpret_cast<T*>(w_.scratch + used_);
    used_ += bytes;
    return p;
  }

 private:
  Workspace w_;
  size_t used_ = 0;
};

// ---- GEMM (linear.cu) ----
// Row-major D (m,n) = alpha · op(A) · op(B) + beta · D [+ bias (n), same dtype as D].
// A is stored (m,k) with row stride lda, or (k,m) when trans_a; B is stored (k,n) with
// row stride ldb, or (n,k) when trans_b. A and B share dtype ab (f32 or bf16); D is f32
// or bf16. f32 inputs use CUBLAS_COMPUTE_32F (no TF32); bf16 accumulate in f32.
// In deterministic mode only algorithms without split-K are used.
void gemm(Context& ctx, void* D, DType dt_d, int64_t ldd, const void* A, int64_t lda, bool trans_a,
          const void* B, int64_t ldb, bool trans_b, DType dt_ab, int64_t m, int64_t n, int64_t k, float alpha,
          float beta, const void* bias = nullptr);

// ---- deterministic scatter-add of rows (embedding.cu) ----
// dst (Vrows, C) (f32 or bf16) row idx[t] += src (T, C) row t, for t in increasing
// order within each destination row; no atomics. Uses the scratch.
void scatter_add_rows(Context& ctx, void* dst, DType dt_dst, int64_t n_dst_rows, const void* src, DType dt_src,
                      const int32_t* idx, int64_t T, int64_t C);

// 16 bytes (one raw vector) as f32, and back (rounded to nearest even); the same
// conversions as to_f32 / from_f32.
template <class T> __device__ __forceinline__ void unpack16(const uint4& v, float* f);
template <> __device__ __forceinline__ void unpack16<float>(const uint4& v, float* f) {
  f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
template <> __device__ __forceinline__ void unpack16<__nv_bfloat16>(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <> __device__ __forceinline__ void unpack16<__half>(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
    f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
  }
}
template <class T> __device__ __forceinline__ uint4 pack16(const float* f);
template <> __device__ __forceinline__ uint4 pack16<float>(const float* f) {
  return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <> __device__ __forceinline__ uint4 pack16<__nv_bfloat16>(const float* f) {
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  return uint32_t(__half_as_ushort(__float2half_rn(lo))) | (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
}
template <> __device__ __forceinline__ uint4 pack16<__half>(const float* f) {
  return make_uint4(pack_f16x2(f[0], f[1]), pack_f16x2(f[2], f[3]), pack_f16x2(f[4], f[5]), pack_f16x2(f[6], f[7]));
}

// E elements of T at p as f32: E = 1 (any alignment) or E = Vec16<T>::n (16 bytes at an
// aligned p); and back.
template <class T, int E> __device__ __forceinline__ void load_elems(const T* p, float* f) {
  if constexpr (E == 1) f[0] = to_f32(*p);
  else load_vec(p, f);
}
template <class T, int E> __device__ __forceinline__ void store_elems(T* p, const float* f) {
  if constexpr (E == 1) *p = from_f32<T>(f[0]);
  else store_vec(p, f);
}

}  // namespace grpo::cuda
