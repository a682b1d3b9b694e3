// CUDA elementwise ops: residual add, scale, cast (f32/bf16/f16), SwiGLU forward and
// backward, q/k/v split and merge (strided 2-D copies on the stream).
// Arithmetic follows cpu/elementwise.cpp term by term (silu = g / (1 + exp(−g))).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/elementwise.h"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void add_kernel(T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

// 16-byte vectors; n is a multiple of the vector width and both pointers are aligned.
template <class T>
__global__ void add_vec_kernel(T* __restrict__ a, const T* __restrict__ b, int64_t n_vec) {
  constexpr int V = Vec16<T>::n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_vec; i += int64_t(gridDim.x) * blockDim.x) {
    float x[V], y[V];
    load_vec(a + i * V, x);
    load_vec(b + i * V, y);
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] += y[j];
    store_vec(a + i * V, x);
  }
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

template <class TO, class TI>
void cast_launch(Context& ctx, void* dst, const void* src, int64_t n) {
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
      add_vec_kernel<T><<<flat_grid(n / V, kThreads), kThreads, 0, stream_of(ctx)>>>(a.ptr<T>(), b.ptr<T>(), n / V);
    else
      add_kernel<T><<<flat_grid(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a.ptr<T>(), b.ptr<T>(), n);
  });
  CUDA_CHECK_LAUNCH();
}

void scale_inplace(Context& ctx, Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
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
    swiglu_fwd_kernel<T><<<flat_grid(N * F, kThreads), kThreads, 0, stream_of(ctx)>>>(out.ptr<T>(),
                                                                                      gate_up.ptr<T>(), N, F);
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
    swiglu_bwd_kernel<T><<<flat_grid(N * F, kThreads), kThreads, 0, stream_of(ctx)>>>(
        dgate_up.ptr<T>(), dout.ptr<T>(), gate_up.ptr<T>(), N, F);
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
