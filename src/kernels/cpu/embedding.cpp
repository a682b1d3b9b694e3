// CPU embedding lookup and its scatter-add backward. The backward splits the
// columns across threads and walks the tokens in order, so repeated ids add up
// in the same order on every run.
#include "kernels/embedding.h"

#include <cstring>

namespace grpo::cpu {

void embedding_forward(Context& ctx, Tensor& out, const Tensor& ids, const Tensor& table) {
  const int64_t T = ids.numel(), C = table.shape[1];
  const int32_t* I = ids.ptr<int32_t>();
  const float* E = table.ptr<float>();
  float* O = out.ptr<float>();
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) std::memcpy(O + t * C, E + int64_t(I[t]) * C, size_t(C) * sizeof(float));
  }, 16);
}

void embedding_backward(Context& ctx, Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const int64_t T = ids.numel(), C = dtable.shape[1];
  const int32_t* I = ids.ptr<int32_t>();
  const float* G = dout.ptr<float>();
  float* D = dtable.ptr<float>();
  ctx.parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      float* d = D + int64_t(I[t]) * C;
      const float* g = G + t * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }, 64);
}

}  // namespace grpo::cpu
