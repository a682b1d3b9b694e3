// CPU column-range ops, f32.
#include "kernels/columns.h"

namespace grpo::cpu {

void columns_add(Context& ctx, Tensor& out, const Tensor& src, int64_t col0, float scale) {
  const int64_t M = out.shape[0], N = out.shape[1], n = src.shape[1];
  float* O = out.ptr<float>();
  const float* S = src.ptr<float>();
  ctx.parallel_for(M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < n; ++j) O[r * N + col0 + j] += scale * S[r * n + j];
  }, 16);
}

void columns_copy(Context& ctx, Tensor& dst, const Tensor& src, int64_t col0, float scale) {
  const int64_t M = src.shape[0], N = src.shape[1], n = dst.shape[1];
  float* D = dst.ptr<float>();
  const float* S = src.ptr<float>();
  ctx.parallel_for(M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < n; ++j) D[r * n + j] = scale * S[r * N + col0 + j];
  }, 16);
}

}  // namespace grpo::cpu
