// CPU row gather and its backward (zero, then add the picked rows back in order).
#include "kernels/gather.h"

#include <cstring>

namespace grpo::cpu {

void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& rows) {
  const int64_t R = rows.numel(), C = x.shape[1];
  const int32_t* I = rows.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(out.ptr<float>() + r * C, x.ptr<float>() + int64_t(I[r]) * C, size_t(C) * sizeof(float));
}

void gather_rows_backward(Context& ctx, Tensor& dx, const Tensor& dout, const Tensor& rows) {
  const int64_t R = rows.numel(), C = dx.shape[1];
  const int32_t* I = rows.ptr<int32_t>();
  std::memset(dx.data, 0, dx.nbytes());
  for (int64_t r = 0; r < R; ++r) {
    float* d = dx.ptr<float>() + int64_t(I[r]) * C;
    const float* g = dout.ptr<float>() + r * C;
    for (int64_t c = 0; c < C; ++c) d[c] += g[c];
  }
}

}  // namespace grpo::cpu
