// Tensor: a typed, contiguous, row-major view of host or device memory (up to
// 4 dims). Views share ownership of their storage through `owner`; a view
// into an arena has no owner and must not outlive the arena.
// Dimension letters used across the code base: B batch, T tokens/time,
// C model width, H heads, D head dim, V vocabulary, F MLP width, L layers.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace grpo {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  std::shared_ptr<void> owner;  // keeps storage alive; null for borrowed views

  bool defined() const { return data != nullptr; }
  bool empty() const { return data == nullptr; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const;  // negative i counts from the back
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  bool on_cpu() const { return device == Device::cpu; }

  // Same storage, new shape with the same element count.
  Tensor view(std::initializer_list<int64_t> new_shape) const;
  Tensor view(const std::vector<int64_t>& new_shape) const;
  // Rows [begin, end) of dim 0.
  Tensor slice0(int64_t begin, int64_t end) const;
  // Element i of dim 0 (drops that dim).
  Tensor index0(int64_t i) const;
  std::string shape_str() const;  // "(2, 3) bf16 cpu"
};

// Wraps memory the caller owns.
Tensor tensor_borrow(void* data, DType dt, Device dev, std::initializer_list<int64_t> shape);
Tensor tensor_borrow(void* data, DType dt, Device dev, const std::vector<int64_t>& shape);

// Allocates (64-byte aligned on the host, cudaMalloc on the device). Contents undefined.
Tensor tensor_empty(Device dev, DType dt, std::initializer_list<int64_t> shape);
Tensor tensor_empty(Device dev, DType dt, const std::vector<int64_t>& shape);
// A host tensor in page-locked memory when CUDA is available (copies to the
// device then run at full PCIe/NVLink speed without a driver bounce buffer),
// else ordinary host memory. For staging buffers kept across many copies:
// page-locking is slow to set up.
Tensor tensor_empty_pinned(DType dt, const std::vector<int64_t>& shape);
Tensor tensor_zeros(Device dev, DType dt, std::initializer_list<int64_t> shape);
Tensor tensor_zeros(Device dev, DType dt, const std::vector<int64_t>& shape);

// Byte copy between any devices (same dtype and numel). Synchronous with respect to
// every stream, so kernels queued later on any context see the data; inside a
// StreamScope, with respect to that scope's stream only (see tensor_thread_stream).
void tensor_copy(Tensor& dst, const Tensor& src);
// Copy with float dtype conversion; on the host only or device<->host through a staging buffer.
void tensor_copy_convert(Tensor& dst, const Tensor& src);
void tensor_fill_zero(Tensor& t);  // synchronous like tensor_copy
// Host f32 copy of any float tensor (for tests and debugging).
std::vector<float> tensor_to_f32(const Tensor& t);
Tensor tensor_from_f32(Device dev, DType dt, const std::vector<float>& v, const std::vector<int64_t>& shape);

bool cuda_available();  // false when built without CUDA or no device is visible

// The calling thread's stream for device allocations, copies and fills (null: none;
// set through StreamScope in core/context.h). With one set, tensor_empty on the device
// takes stream-ordered memory from CUDA's pool on that stream (freed stream-ordered,
// without cudaFree's whole-device synchronisation; the tensor keeps the stream alive),
// and tensor_copy / tensor_fill_zero run on that stream: after the work queued on it
// before, finished when they return, and without waiting for any other stream. Without
// one, they are synchronous with respect to every stream. The owner holds a cudaStream_t.
const std::shared_ptr<void>& tensor_thread_stream();
void tensor_set_thread_stream(std::shared_ptr<void> stream);

}  // namespace grpo
