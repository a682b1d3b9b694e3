// CUDA elementwise ops: residual add, scale, cast (f32/bf16/f16), SwiGLU forward and
// backward, q/k/v split and merge (strided 2-D copies on the stream).
// Arithmetic follows cpu/elementwise.cpp term by term (silu = g / (1 + exp(−g))).
//
// Kernel layouts. Vector path: 16-byte loads/stores of raw vectors (V = 8 bf16/f16 or 4 f32
// per vector), taken when the element count (or, for SwiGLU, F) is a multiple of V and every
// pointer is 16-byte aligned. A block of kThreads threads takes a tile of kThreads·U
// vectors starting at s: thread t handles vectors s + t + u·kThreads, u < U (coalesced),
// issuing all U loads before any arithmetic; blocks walk the tiles grid-stride (U = 4 for
// add and scale, 2 for SwiGLU, grid ≈ one tile per block, at most 65536 blocks). SwiGLU maps vector i of
// out/dout (N, F/V) to row r = i / (F/V), column vector j = i − r·(F/V) of the gate and up
// halves; index arithmetic is 32-bit when the counts fit, 64-bit otherwise. cast handles 8
// elements per thread (16 or 32 bytes of each side). Everything else: the scalar
// grid-stride kernels (one element per thread per step). Every output element depends
// only on its own inputs, so the path and the grid never change a value.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/elementwise.h"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 256;

// ---- scalar kernels (any size or alignment) ----

template <class T>
__global__ void add_kernel(T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) * s);
}

template <class TO, class TI>
__global__ void cast_kernel(TO* __restrict__ dst, const TI* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<TO>(to_f32(src[i]));
}

template <class T>
__global__ void swiglu_fwd_kernel(T* __restrict__ out, const T* __restrict__ gu, int64_t N, int64_t F) {
  const int64_t total = N * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i - r * F;
    const float g = to_f32(gu[r * 2 * F + j]), u = to_f32(gu[r * 2 * F + F + j]);
    out[i] = from_f32<T>(__fmul_rn(g / (1.f + expf(-g)), u));
  }
}

template <class T>
__global__ void swiglu_bwd_kernel(T* __restrict__ dgu, const T* __restrict__ dout, const T* __restrict__ gu, int64_t N,
                                  int64_t F) {
  const int64_t total = N * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i - r * F;
    const float g = to_f32(gu[r * 2 * F + j]), u = to_f32(gu[r * 2 * F + F + j]);
    const float sig = 1.f / (1.f + expf(-g));
    const float d = to_f32(dout[i]);
    dgu[r * 2 * F + j] = from_f32<T>(d * u * sig * (1.f + g * (1.f - sig)));
    dgu[r * 2 * F + F + j] = from_f32<T>(d * g * sig);
  }
}

// ---- 16-byte vector kernels (see the layout at the top) ----

// a += b over n_vec vectors.
template <class T, int U>
__global__ void __launch_bounds__(kThreads) add_vec_kernel(T* __restrict__ a, const T* __restrict__ b, int64_t n_vec) {
  constexpr int V = Vec16<T>::n;
  uint4* av = reinterpret_cast<uint4*>(a);
  const uint4* bv = reinterpret_cast<const uint4*>(b);
  const int64_t tile = int64_t(kThreads) * U;
  for (int64_t base = int64_t(blockIdx.x) * tile + threadIdx.x; base < n_vec; base += int64_t(gridDim.x) * tile) {
    uint4 ra[U], rb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      if (i < n_vec) {
        ra[u] = av[i];
        rb[u] = __ldg(bv + i);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      if (i < n_vec) {
        float x[V], y[V];
        unpack16<T>(ra[u], x);
        unpack16<T>(rb[u], y);
#pragma unroll
        for (int e = 0; e < V; ++e) x[e] += y[e];
        av[i] = pack16<T>(x);
      }
    }
  }
}

// x *= s over n_vec vectors.
template <class T, int U>
__global__ void __launch_bounds__(kThreads) scale_vec_kernel(T* __restrict__ x, float s, int64_t n_vec) {
  constexpr int V = Vec16<T>::n;
  uint4* xv = reinterpret_cast<uint4*>(x);
  const int64_t tile = int64_t(kThreads) * U;
  for (int64_t base = int64_t(blockIdx.x) * tile + threadIdx.x; base < n_vec; base += int64_t(gridDim.x) * tile) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      if (i < n_vec) r[u] = xv[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      if (i < n_vec) {
        float f[V];
        unpack16<T>(r[u], f);
#pragma unroll
        for (int e = 0; e < V; ++e) f[e] *= s;
        xv[i] = pack16<T>(f);
      }
    }
  }
}

// dst = src over n8 groups of 8 elements (both sides 16-byte aligned).
template <class TO, class TI>
__global__ void __launch_bounds__(kThreads) cast_vec_kernel(TO* __restrict__ dst, const TI* __restrict__ src, int64_t n8) {
  constexpr int VI = Vec16<TI>::n, VO = Vec16<TO>::n;
  const uint4* sv = reinterpret_cast<const uint4*>(src);
  uint4* dv = reinterpret_cast<uint4*>(dst);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    uint4 r[8 / VI];
#pragma unroll
    for (int q = 0; q < 8 / VI; ++q) r[q] = __ldg(sv + i * (8 / VI) + q);
    float f[8];
#pragma unroll
    for (int q = 0; q < 8 / VI; ++q) unpack16<TI>(r[q], f + q * VI);
#pragma unroll
    for (int q = 0; q < 8 / VO; ++q) dv[i * (8 / VO) + q] = pack16<TO>(f + q * VO);
  }
}

// out (N, F) = silu(gate) · up; n_vec = N·fv vectors of out, fv = F / V.
template <class T, class I, int U>
__global__ void __launch_bounds__(kThreads)
swiglu_fwd_vec_kernel(T* __restrict__ out, const T* __restrict__ gu, I n_vec, I fv) {
  pdl_trigger();  // launched with launch_pdl (cuda_check.cuh)
  pdl_wait();
  constexpr int V = Vec16<T>::n;
  const uint4* guv = reinterpret_cast<const uint4*>(gu);
  uint4* ov = reinterpret_cast<uint4*>(out);
  const I tile = I(kThreads) * U;
  for (I base = I(blockIdx.x) * tile + I(threadIdx.x); base < n_vec; base += I(gridDim.x) * tile) {
    uint4 rg[U], ru[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < n_vec) {
        const I r = i / fv, j = i - r * fv;
        const uint4* src = guv + (r * 2 * fv + j);
        rg[u] = __ldg(src);
        ru[u] = __ldg(src + fv);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < n_vec) {
        float g[V], up[V], o[V];
        unpack16<T>(rg[u], g);
        unpack16<T>(ru[u], up);
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = __fmul_rn(g[e] / (1.f + expf(-g[e])), up[e]);
        ov[i] = pack16<T>(o);
      }
    }
  }
}

// dgate_up (N, 2F) from dout (N, F) and gate_up; n_vec = N·fv vectors of dout, fv = F / V.
template <class T, class I, int U>
__global__ void __launch_bounds__(kThreads)
swiglu_bwd_vec_kernel(T* __restrict__ dgu, const T* __restrict__ dout, const T* __restrict__ gu, I n_vec, I fv) {
  constexpr int V = Vec16<T>::n;
  const uint4* guv = reinterpret_cast<const uint4*>(gu);
  const uint4* dov = reinterpret_cast<const uint4*>(dout);
  uint4* dgv = reinterpret_cast<uint4*>(dgu);
  const I tile = I(kThreads) * U;
  for (I base = I(blockIdx.x) * tile + I(threadIdx.x); base < n_vec; base += I(gridDim.x) * tile) {
    uint4 rg[U], ru[U], rd[U];
    I off[U];  // vector offset of the gate part in gate_up / dgate_up
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < n_vec) {
        const I r = i / fv, j = i - r * fv;
        off[u] = r * 2 * fv + j;
        const uint4* src = guv + off[u];
        rg[u] = __ldg(src);
        ru[u] = __ldg(src + fv);
        rd[u] = __ldg(dov + i);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + I(u) * kThreads;
      if (i < n_vec) {
        float g[V], up[V], d[V], dg[V], du[V];
        unpack16<T>(rg[u], g);
        unpack16<T>(ru[u], up);
        unpack16<T>(rd[u], d);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float sig = 1.f / (1.f + expf(-g[e]));
          dg[e] = d[e] * up[e] * sig * (1.f + g[e] * (1.f - sig));
          du[e] = d[e] * g[e] * sig;
        }
        uint4* dst = dgv + off[u];
        dst[0] = pack16<T>(dg);
        dst[fv] = pack16<T>(du);
      }
    }
  }
}

// Blocks for n_items items handled `per_thread` at a time (grid-stride covers the rest).
unsigned vec_grid(int64_t n_items, int per_thread) { return flat_grid(ceil_div(n_items, per_thread), kThreads); }

// True when 32-bit index arithmetic is safe for indices below `bound` plus one grid stride.
bool fits_u32(int64_t bound, unsigned grid) { return bound + int64_t(grid) * kThreads <= int64_t(0x7fffffff); }

template <class TO, class TI>
void cast_launch(Context& ctx, void* dst, const void* src, int64_t n) {
  if (n % 8 == 0 && aligned16(dst) && aligned16(src))
    cast_vec_kernel<TO, TI><<<vec_grid(n / 8, 1), kThreads, 0, stream_of(ctx)>>>(static_cast<TO*>(dst),
                                                                                 static_cast<const TI*>(src), n / 8);
  else
    cast_kernel<TO, TI><<<flat_grid(n, kThreads), kThreads, 0, stream_of(ctx)>>>(static_cast<TO*>(dst),
                                                                                 static_cast<const TI*>(src), n);
}

template <class TO>
void cast_from(Context& ctx, void* dst, const Tensor& src, int64_t n) {
  switch (src.dtype) {
    case DType::f32: cast_launch<TO, float>(ctx, dst, src.data, n); break;
    case DType::bf16: cast_launch<TO, __nv_bfloat16>(ctx, dst, src.data, n); break;
    case DType::f16: cast_launch<TO, __half>(ctx, dst, src.data, n); break;
    default: GRPO_CHECK_MSG(false, "cast: source must be f32, bf16 or f16");
  }
}

constexpr int kAddUnroll = 4;     // vectors per thread per step: add, scale
constexpr int kSwigluUnroll = 2;  // vectors (of out / dout) per thread per step: SwiGLU

template <class T, class I>
void swiglu_fwd_vec_launch(Context& ctx, Tensor& out, const Tensor& gate_up, int64_t n_vec, int64_t fv, unsigned grid) {
  launch_pdl(ctx, swiglu_fwd_vec_kernel<T, I, kSwigluUnroll>, dim3(grid), dim3(kThreads), 0, out.ptr<T>(),
             gate_up.ptr<T>(), I(n_vec), I(fv));
}

template <class T, class I>
void swiglu_bwd_vec_launch(Context& ctx, Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up, int64_t n_vec,
                           int64_t fv, unsigned grid) {
  swiglu_bwd_vec_kernel<T, I, kSwigluUnroll><<<grid, kThreads, 0, stream_of(ctx)>>>(
      dgate_up.ptr<T>(), dout.ptr<T>(), gate_up.ptr<T>(), I(n_vec), I(fv));
}

// Copies `rows` rows of `width` bytes between pitched buffers on the stream.
void copy2d(Context& ctx, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream_of(ctx)));
}

}  // namespace

void add_inplace(Context& ctx, Tensor& a, const Tensor& b) {
  GRPO_CHECK_MSG(a.numel() == b.numel() && a.dtype == b.dtype, "add_inplace: a and b must match in size and dtype");
  const int64_t n = a.numel();
  if (n == 0) return;
  GRPO_DISPATCH_FLOAT(a.dtype, T, {
    constexpr int V = Vec16<T>::n;
    if (n % V == 0 && aligned16(a.data) && aligned16(b.data))
      add_vec_kernel<T, kAddUnroll><<<vec_grid(n / V, kAddUnroll), kThreads, 0, stream_of(ctx)>>>(a.ptr<T>(),
                                                                                                 b.ptr<T>(), n / V);
    else
      add_kernel<T><<<flat_grid(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a.ptr<T>(), b.ptr<T>(), n);
  });
  CUDA_CHECK_LAUNCH();
}

void scale_inplace(Context& ctx, Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    constexpr int V = Vec16<T>::n;
    if (n % V == 0 && aligned16(x.data))
      scale_vec_kernel<T, kAddUnroll><<<vec_grid(n / V, kAddUnroll), kThreads, 0, stream_of(ctx)>>>(x.ptr<T>(), s,
                                                                                                   n / V);
    else
      scale_kernel<T><<<flat_grid(n, kThreads), kThreads, 0, stream_of(ctx)>>>(x.ptr<T>(), s, n);
  });
  CUDA_CHECK_LAUNCH();
}

void cast(Context& ctx, Tensor& dst, const Tensor& src) {
  GRPO_CHECK_MSG(dst.numel() == src.numel(), "cast: dst and src must have the same number of elements");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_of(ctx)));
    return;
  }
  switch (dst.dtype) {
    case DType::f32: cast_from<float>(ctx, dst.data, src, n); break;
    case DType::bf16: cast_from<__nv_bfloat16>(ctx, dst.data, src, n); break;
    case DType::f16: cast_from<__half>(ctx, dst.data, src, n); break;
    default: GRPO_CHECK_MSG(false, "cast: destination must be f32, bf16 or f16");
  }
  CUDA_CHECK_LAUNCH();
}

void swiglu_forward(Context& ctx, Tensor& out, const Tensor& gate_up) {
  GRPO_CHECK_MSG(out.ndim == 2, "swiglu_forward: out must be (N,F)");
  const int64_t N = out.shape[0], F = out.shape[1];
  GRPO_CHECK_MSG(gate_up.numel() == N * 2 * F && gate_up.dtype == out.dtype, "swiglu_forward: gate_up must be (N,2F)");
  if (N * F == 0) return;
  GRPO_DISPATCH_FLOAT(out.dtype, T, {
    constexpr int V = Vec16<T>::n;
    if (F % V == 0 && aligned16(out.data) && aligned16(gate_up.data)) {
      const int64_t fv = F / V, n_vec = N * fv;
      const unsigned grid = vec_grid(n_vec, kSwigluUnroll);
      if (fits_u32(2 * n_vec, grid))  // gate_up holds 2·n_vec vectors
        swiglu_fwd_vec_launch<T, uint32_t>(ctx, out, gate_up, n_vec, fv, grid);
      else
        swiglu_fwd_vec_launch<T, int64_t>(ctx, out, gate_up, n_vec, fv, grid);
    } else {
      swiglu_fwd_kernel<T><<<flat_grid(N * F, kThreads), kThreads, 0, stream_of(ctx)>>>(out.ptr<T>(),
                                                                                        gate_up.ptr<T>(), N, F);
    }
  });
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Context& ctx, Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  GRPO_CHECK_MSG(dout.ndim == 2, "swiglu_backward: dout must be (N,F)");
  const int64_t N = dout.shape[0], F = dout.shape[1];
  GRPO_CHECK_MSG(gate_up.numel() == N * 2 * F && dgate_up.numel() == N * 2 * F, "swiglu_backward: shape mismatch");
  GRPO_CHECK_MSG(gate_up.dtype == dout.dtype && dgate_up.dtype == dout.dtype, "swiglu_backward: dtype mismatch");
  if (N * F == 0) return;
  GRPO_DISPATCH_FLOAT(dout.dtype, T, {
    constexpr int V = Vec16<T>::n;
    if (F % V == 0 && aligned16(dgate_up.data) && aligned16(dout.data) && aligned16(gate_up.data)) {
      const int64_t fv = F / V, n_vec = N * fv;
      const unsigned grid = vec_grid(n_vec, kSwigluUnroll);
      if (fits_u32(2 * n_vec, grid))
        swiglu_bwd_vec_launch<T, uint32_t>(ctx, dgate_up, dout, gate_up, n_vec, fv, grid);
      else
        swiglu_bwd_vec_launch<T, int64_t>(ctx, dgate_up, dout, gate_up, n_vec, fv, grid);
    } else {
      swiglu_bwd_kernel<T><<<flat_grid(N * F, kThreads), kThreads, 0, stream_of(ctx)>>>(
          dgate_up.ptr<T>(), dout.ptr<T>(), gate_up.ptr<T>(), N, F);
    }
  });
  CUDA_CHECK_LAUNCH();
}

void qkv_split(Context& ctx, Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  const int64_t T_ = qkv.shape[0];
  GRPO_CHECK_MSG(q.dtype == qkv.dtype && k.dtype == qkv.dtype && v.dtype == qkv.dtype, "qkv_split: dtype mismatch");
  if (T_ == 0) return;
  const int64_t nq = q.numel() / T_, nk = k.numel() / T_;
  GRPO_CHECK_MSG(v.numel() == nk * T_ && qkv.numel() == T_ * (nq + 2 * nk), "qkv_split: shape mismatch");
  const size_t es = dtype_size(qkv.dtype), W = size_t(nq + 2 * nk) * es;
  const char* s = static_cast<const char*>(qkv.data);
  copy2d(ctx, q.data, size_t(nq) * es, s, W, size_t(nq) * es, size_t(T_));
  copy2d(ctx, k.data, size_t(nk) * es, s + size_t(nq) * es, W, size_t(nk) * es, size_t(T_));
  copy2d(ctx, v.data, size_t(nk) * es, s + size_t(nq + nk) * es, W, size_t(nk) * es, size_t(T_));
}

void qkv_merge(Context& ctx, Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t T_ = dqkv.shape[0];
  GRPO_CHECK_MSG(dq.dtype == dqkv.dtype && dk.dtype == dqkv.dtype && dv.dtype == dqkv.dtype, "qkv_merge: dtype mismatch");
  if (T_ == 0) return;
  const int64_t nq = dq.numel() / T_, nk = dk.numel() / T_;
  GRPO_CHECK_MSG(dv.numel() == nk * T_ && dqkv.numel() == T_ * (nq + 2 * nk), "qkv_merge: shape mismatch");
  const size_t es = dtype_size(dqkv.dtype), W = size_t(nq + 2 * nk) * es;
  char* d = static_cast<char*>(dqkv.data);
  copy2d(ctx, d, W, dq.data, size_t(nq) * es, size_t(nq) * es, size_t(T_));
  copy2d(ctx, d + size_t(nq) * es, W, dk.data, size_t(nk) * es, size_t(nk) * es, size_t(T_));
  copy2d(ctx, d + size_t(nq + nk) * es, W, dv.data, size_t(nk) * es, size_t(nk) * es, size_t(T_));
}

}  // namespace grpo::cuda
