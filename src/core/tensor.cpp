#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

namespace {

thread_local std::shared_ptr<void> t_stream;

#ifdef GRPO_HAVE_CUDA
// The current device's stream-ordered pool keeps what is freed (no release to the
// driver at each synchronisation) and never makes one stream wait for another to
// reuse memory: a block freed on a stream whose work is not done is left alone.
void configure_stream_pool() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return;
  static thread_local int configured = -1;
  if (configured == dev) return;
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    int no = 0;
    cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no);
  }
  configured = dev;
}

cudaStream_t scope_stream() { return static_cast<cudaStream_t>(t_stream.get()); }  // null: no StreamScope
#endif

}  // namespace

const std::shared_ptr<void>& tensor_thread_stream() { return t_stream; }
void tensor_set_thread_stream(std::shared_ptr<void> stream) { t_stream = std::move(stream); }

int64_t Tensor::numel() const {
  if (ndim == 0) return data ? 1 : 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim;
  GRPO_CHECK(i >= 0 && i < ndim);
  return shape[i];
}

Tensor Tensor::view(std::initializer_list<int64_t> new_shape) const {
  return view(std::vector<int64_t>(new_shape));
}

Tensor Tensor::view(const std::vector<int64_t>& new_shape) const {
  GRPO_CHECK(new_shape.size() <= size_t(kMaxDims));
  Tensor t = *this;
  t.ndim = int(new_shape.size());
  int64_t n = 1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    t.shape[i] = new_shape[i];
    n *= new_shape[i];
  }
  for (int i = t.ndim; i < kMaxDims; ++i) t.shape[i] = 0;
  GRPO_CHECK_MSG(n == numel(), "view: element count changes");
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  GRPO_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0]);
  Tensor t = *this;
  int64_t row = shape[0] ? numel() / shape[0] : 0;
  t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::index0(int64_t i) const {
  GRPO_CHECK(ndim >= 2);
  Tensor t = slice0(i, i + 1);
  for (int d = 0; d + 1 < ndim; ++d) t.shape[d] = shape[d + 1];
  t.shape[ndim - 1] = 0;
  t.ndim = ndim - 1;
  return t;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << ") " << dtype_name(dtype) << " " << device_name(device);
  return os.str();
}

Tensor tensor_borrow(void* data, DType dt, Device dev, std::initializer_list<int64_t> shape) {
  return tensor_borrow(data, dt, dev, std::vector<int64_t>(shape));
}

Tensor tensor_borrow(void* data, DType dt, Device dev, const std::vector<int64_t>& shape) {
  GRPO_CHECK(shape.size() <= size_t(kMaxDims));
  Tensor t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

Tensor tensor_empty(Device dev, DType dt, std::initializer_list<int64_t> shape) {
  return tensor_empty(dev, dt, std::vector<int64_t>(shape));
}

Tensor tensor_empty(Device dev, DType dt, const std::vector<int64_t>& shape) {
  Tensor t = tensor_borrow(nullptr, dt, dev, shape);
  size_t bytes = t.nbytes();
  size_t alloc = bytes ? bytes : 64;
  if (dev == Device::cpu) {
    size_t rounded = (alloc + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    GRPO_CHECK_MSG(p != nullptr, "host allocation failed");
    t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    t.data = p;
  } else {
#ifdef GRPO_HAVE_CUDA
    void* p = nullptr;
    if (cudaStream_t s = scope_stream()) {
      // Stream-ordered: freed on the same stream after the work queued on it, which the
      // deleter keeps alive.
      configure_stream_pool();
      cudaError_t e = cudaMallocAsync(&p, alloc, s);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "grpo: cudaMallocAsync of %zu bytes failed: %s\n", alloc, cudaGetErrorString(e));
        std::abort();
      }
      std::shared_ptr<void> keep = t_stream;
      t.owner = std::shared_ptr<void>(p, [keep](void* q) { cudaFreeAsync(q, static_cast<cudaStream_t>(keep.get())); });
      t.data = p;
      return t;
    }
    cudaError_t e = cudaMalloc(&p, alloc);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "grpo: cudaMalloc of %zu bytes failed: %s\n", alloc, cudaGetErrorString(e));
      std::abort();
    }
    t.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    t.data = p;
#else
    GRPO_CHECK_MSG(false, "this build has no CUDA backend");
#endif
  }
  return t;
}

Tensor tensor_empty_pinned(DType dt, const std::vector<int64_t>& shape) {
#ifdef GRPO_HAVE_CUDA
  if (cuda_available()) {
    Tensor t = tensor_borrow(nullptr, dt, Device::cpu, shape);
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, t.nbytes() ? t.nbytes() : 64, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "grpo: cudaHostAlloc of %zu bytes failed: %s\n", t.nbytes(), cudaGetErrorString(e));
      std::abort();
    }
    t.owner = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    t.data = p;
    return t;
  }
#endif
  return tensor_empty(Device::cpu, dt, shape);
}

Tensor tensor_zeros(Device dev, DType dt, std::initializer_list<int64_t> shape) {
  return tensor_zeros(dev, dt, std::vector<int64_t>(shape));
}

Tensor tensor_zeros(Device dev, DType dt, const std::vector<int64_t>& shape) {
  Tensor t = tensor_empty(dev, dt, shape);
  tensor_fill_zero(t);
  return t;
}

void tensor_fill_zero(Tensor& t) {
  if (t.nbytes() == 0) return;
  if (t.device == Device::cpu) {
    std::memset(t.data, 0, t.nbytes());
  } else {
#ifdef GRPO_HAVE_CUDA
    if (cudaStream_t s = scope_stream()) {
      GRPO_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), s) == cudaSuccess);
      GRPO_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
      return;
    }
    // Synchronous with respect to every stream (contexts use non-blocking streams).
    GRPO_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    GRPO_CHECK(cudaMemset(t.data, 0, t.nbytes()) == cudaSuccess);
    GRPO_CHECK(cudaDeviceSynchronize() == cudaSuccess);
#endif
  }
}

void tensor_copy(Tensor& dst, const Tensor& src) {
  GRPO_CHECK_MSG(dst.dtype == src.dtype && dst.numel() == src.numel(), "tensor_copy: dtype/numel mismatch");
  size_t n = src.nbytes();
  if (n == 0) return;
  if (dst.device == Device::cpu && src.device == Device::cpu) {
    std::memmove(dst.data, src.data, n);
    return;
  }
#ifdef GRPO_HAVE_CUDA
  if (cudaStream_t s = scope_stream()) {
    GRPO_CHECK(cudaMemcpyAsync(dst.data, src.data, n, cudaMemcpyDefault, s) == cudaSuccess);
    GRPO_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    return;
  }
  // Synchronous with respect to every stream: contexts use non-blocking streams,
  // which the legacy-stream cudaMemcpy would not wait for.
  GRPO_CHECK(cudaDeviceSynchronize() == cudaSuccess);
  GRPO_CHECK(cudaMemcpy(dst.data, src.data, n, cudaMemcpyDefault) == cudaSuccess);
  GRPO_CHECK(cudaDeviceSynchronize() == cudaSuccess);
#else
  GRPO_CHECK_MSG(false, "this build has no CUDA backend");
#endif
}

void tensor_copy_convert(Tensor& dst, const Tensor& src) {
  GRPO_CHECK_MSG(dst.numel() == src.numel(), "tensor_copy_convert: numel mismatch");
  if (dst.dtype == src.dtype) {
    tensor_copy(dst, src);
    return;
  }
  Tensor s = src;
  if (s.device != Device::cpu) {
    s = tensor_empty(Device::cpu, src.dtype, {src.numel()});
    tensor_copy(s, src);
  }
  if (dst.device == Device::cpu) {
    convert_host(dst.data, dst.dtype, s.data, s.dtype, size_t(s.numel()));
  } else {
    Tensor d = tensor_empty(Device::cpu, dst.dtype, {dst.numel()});
    convert_host(d.data, d.dtype, s.data, s.dtype, size_t(s.numel()));
    tensor_copy(dst, d);
  }
}

std::vector<float> tensor_to_f32(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  Tensor dst = tensor_borrow(out.data(), DType::f32, Device::cpu, {t.numel()});
  Tensor src = t.view({t.numel()});
  if (t.dtype == DType::i32 || t.dtype == DType::i64) {
    Tensor h = tensor_empty(Device::cpu, t.dtype, {t.numel()});
    tensor_copy(h, src);
    for (int64_t i = 0; i < t.numel(); ++i)
      out[size_t(i)] = t.dtype == DType::i32 ? float(h.ptr<int32_t>()[i]) : float(h.ptr<int64_t>()[i]);
    return out;
  }
  tensor_copy_convert(dst, src);
  return out;
}

Tensor tensor_from_f32(Device dev, DType dt, const std::vector<float>& v, const std::vector<int64_t>& shape) {
  Tensor t = tensor_empty(dev, dt, shape);
  GRPO_CHECK(size_t(t.numel()) == v.size());
  Tensor src = tensor_borrow(const_cast<float*>(v.data()), DType::f32, Device::cpu, {int64_t(v.size())});
  Tensor flat = t.view({t.numel()});
  tensor_copy_convert(flat, src);
  return t;
}

bool cuda_available() {
#ifdef GRPO_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return false;
  return n > 0;
#else
  return false;
#endif
}

}  // namespace grpo
