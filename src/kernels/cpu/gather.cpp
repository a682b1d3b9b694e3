// CPU row gather and its scatter-add backward. The backward splits the columns across
// threads and walks the rows in order, so repeated rows add up in the same order on
// every run (and in the order the CUDA backward uses).
#include "kernels/gather.h"

#include <cstring>

namespace grpo::cpu {

void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& src, const Tensor& idx) {
  const int64_t R = idx.numel(), C = src.shape[1];
  const int32_t* I = idx.ptr<int32_t>();
  const float* S = src.ptr<float>();
  float* O = out.ptr<float>();
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(O + r * C, S + int64_t(I[r]) * C, size_t(C) * sizeof(float));
  }, 16);
}

void gather_ids(Context& ctx, Tensor& out, const Tensor& table, const Tensor& idx) {
  (void)ctx;
  const int64_t R = idx.numel();
  const int32_t* I = idx.ptr<int32_t>();
  const int32_t* T = table.ptr<int32_t>();
  int32_t* O = out.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r) O[r] = T[I[r]];
}

void gather_rows_backward(Context& ctx, Tensor& dsrc, const Tensor& dout, const Tensor& idx, bool accumulate) {
  const int64_t R = idx.numel(), C = dsrc.shape[1];
  const int32_t* I = idx.ptr<int32_t>();
  const float* G = dout.ptr<float>();
  float* D = dsrc.ptr<float>();
  if (!accumulate) std::memset(dsrc.data, 0, dsrc.nbytes());
  ctx.parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < R; ++r) {
      float* d = D + int64_t(I[r]) * C;
      const float* g = G + r * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }, 64);
}

}  // namespace grpo::cpu
