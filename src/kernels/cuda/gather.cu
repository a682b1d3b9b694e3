// CUDA row gather (the embedding lookup and row picks; forward: row copies, 16-byte
// vectors when the row length and pointers allow), and its deterministic backward:
// scatter_add_rows stably radix-sorts (destination row, source index) pairs with CUB,
// then one block per run of equal destinations adds the source rows in increasing
// source order, starting from the destination's current value. That is exactly the
// order of the CPU reference (t = 0..T-1), so f32 results match it bit for bit, and
// no float atomics are involved.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gather.h"

namespace grpo::cuda {

namespace {

// out (R,C) = src (*,C)[idx]: one block per output row.
template <class TO, class TI>
__global__ void gather_kernel(TO* __restrict__ out, const TI* __restrict__ src, const int32_t* __restrict__ idx,
                              int64_t C) {
  const int64_t r = blockIdx.x;
  const TI* s = src + int64_t(idx[r]) * C;
  TO* o = out + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f32<TO>(to_f32(s[c]));
}

// Same with 16-byte copies (same dtype, C a multiple of 16 bytes, aligned rows).
__global__ void gather_vec_kernel(uint4* __restrict__ out, const uint4* __restrict__ src,
                                  const int32_t* __restrict__ idx, int64_t C16) {
  pdl_trigger();  // launched with launch_pdl (cuda_check.cuh)
  pdl_wait();
  const int64_t r = blockIdx.x;
  const uint4* s = src + int64_t(idx[r]) * C16;
  uint4* o = out + r * C16;
  for (int64_t c = threadIdx.x; c < C16; c += blockDim.x) o[c] = s[c];
}

__global__ void gather_ids_kernel(int32_t* __restrict__ out, const int32_t* __restrict__ table,
                                  const int32_t* __restrict__ idx, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = table[idx[i]];
}

__global__ void iota_kernel(int32_t* __restrict__ v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = int32_t(i);
}

// Block i handles the run of equal keys that starts at sorted position i (other blocks exit).
template <class TD, class TS>
__global__ void segment_add_kernel(TD* __restrict__ dst, const TS* __restrict__ src, const int32_t* __restrict__ keys,
                                   const int32_t* __restrict__ order, int64_t T, int64_t C) {
  const int64_t i = blockIdx.x;
  const int32_t key = keys[i];
  if (i > 0 && keys[i - 1] == key) return;
  int64_t end = i + 1;
  while (end < T && keys[end] == key) ++end;
  TD* d = dst + int64_t(key) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = to_f32(d[c]);
    for (int64_t j = i; j < end; ++j) acc += to_f32(src[int64_t(order[j]) * C + c]);
    d[c] = from_f32<TD>(acc);
  }
}

int bits_for(int64_t n) {
  int b = 1;
  while (b < 31 && (int64_t(1) << b) < n) ++b;
  return b;
}

int row_threads(int64_t n) { return n >= 512 ? 256 : n >= 128 ? 128 : 64; }

void gather_launch(Context& ctx, Tensor& out, const Tensor& src, const Tensor& idx, const char* what) {
  GRPO_CHECK_MSG(src.ndim == 2 && idx.dtype == DType::i32, what);
  const int64_t R = idx.numel(), C = src.shape[1];
  GRPO_CHECK_MSG(out.numel() == R * C, what);
  if (R == 0 || C == 0) return;
  GRPO_CHECK_MSG(R <= 0x7fffffff, what);
  const size_t row_bytes = size_t(C) * dtype_size(src.dtype);
  if (out.dtype == src.dtype && row_bytes % 16 == 0 && aligned16(out.data) && aligned16(src.data)) {
    const int64_t C16 = int64_t(row_bytes / 16);
    launch_pdl(ctx, gather_vec_kernel, dim3(unsigned(R)), dim3(row_threads(C16)), 0, out.ptr<uint4>(),
               src.ptr<uint4>(), idx.ptr<int32_t>(), C16);
  } else {
    GRPO_DISPATCH_FLOAT(out.dtype, TO, {
      GRPO_DISPATCH_FLOAT(src.dtype, TI, {
        gather_kernel<TO, TI><<<unsigned(R), row_threads(C), 0, stream_of(ctx)>>>(out.ptr<TO>(), src.ptr<TI>(),
                                                                                  idx.ptr<int32_t>(), C);
      });
    });
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void scatter_add_rows(Context& ctx, void* dst, DType dt_dst, int64_t n_dst_rows, const void* src, DType dt_src,
                      const int32_t* idx, int64_t T, int64_t C) {
  if (T == 0 || C == 0) return;
  GRPO_CHECK_MSG(T <= 0x7fffffff, "scatter_add_rows: too many rows");
  cudaStream_t st = stream_of(ctx);
  ScratchAlloc sa(ctx);
  int32_t* keys_out = sa.alloc<int32_t>(T, "scatter_add_rows keys");
  int32_t* vals_in = sa.alloc<int32_t>(T, "scatter_add_rows values");
  int32_t* vals_out = sa.alloc<int32_t>(T, "scatter_add_rows sorted values");
  const int end_bit = bits_for(n_dst_rows);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, idx, keys_out, vals_in, vals_out, int(T), 0, end_bit,
                                             st));
  void* temp = sa.alloc<char>(int64_t(temp_bytes), "scatter_add_rows sort temp");
  iota_kernel<<<flat_grid(T, 256), 256, 0, st>>>(vals_in, T);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, idx, keys_out, vals_in, vals_out, int(T), 0, end_bit,
                                             st));
  GRPO_DISPATCH_FLOAT(dt_dst, TD, {
    GRPO_DISPATCH_FLOAT(dt_src, TS, {
      segment_add_kernel<TD, TS><<<unsigned(T), row_threads(C), 0, st>>>(
          static_cast<TD*>(dst), static_cast<const TS*>(src), keys_out, vals_out, T, C);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& src, const Tensor& idx) {
  gather_launch(ctx, out, src, idx, "gather_rows_forward: src (N,C), idx (R) i32, out (R,C)");
}

void gather_ids(Context& ctx, Tensor& out, const Tensor& table, const Tensor& idx) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  gather_ids_kernel<<<flat_grid(n, 256), 256, 0, stream_of(ctx)>>>(out.ptr<int32_t>(), table.ptr<int32_t>(),
                                                                   idx.ptr<int32_t>(), n);
  CUDA_CHECK_LAUNCH();
}

void gather_rows_backward(Context& ctx, Tensor& dsrc, const Tensor& dout, const Tensor& idx, bool accumulate) {
  GRPO_CHECK_MSG(dsrc.ndim == 2 && idx.dtype == DType::i32, "gather_rows_backward: dsrc (N,C), idx (R) i32");
  const int64_t R = idx.numel(), C = dsrc.shape[1];
  GRPO_CHECK_MSG(dout.numel() == R * C, "gather_rows_backward: dout must be (R,C)");
  if (!accumulate && dsrc.nbytes()) CUDA_CHECK(cudaMemsetAsync(dsrc.data, 0, dsrc.nbytes(), stream_of(ctx)));
  scatter_add_rows(ctx, dsrc.data, dsrc.dtype, dsrc.shape[0], dout.data, dout.dtype, idx.ptr<int32_t>(), R, C);
}

}  // namespace grpo::cuda
