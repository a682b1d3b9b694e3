// CPU RMSNorm, f32: y = x · rstd · w with rstd = 1/sqrt(mean(x²) + eps).
// Backward, with g = dout·w:  dx = rstd·g − x · rstd³ · mean(g·x);  dw += Σ_rows dout·x·rstd.
// Rows are independent, so out may alias x.
#include "kernels/norm.h"

#include <cmath>
#include <vector>

namespace grpo::cpu {

void rmsnorm_forward(Context& ctx, Tensor& out, Tensor* rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t N = x.shape[0], C = x.shape[1];
  const float* X = x.ptr<float>();
  const float* W = w.ptr<float>();
  float* Y = out.ptr<float>();
  float* R = rstd ? rstd->ptr<float>() : nullptr;
  ctx.parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* xi = X + i * C;
      float ss = 0.f;
      for (int64_t c = 0; c < C; ++c) ss += xi[c] * xi[c];
      float r = 1.f / std::sqrt(ss / float(C) + eps);
      if (R) R[i] = r;
      float* yi = Y + i * C;
      for (int64_t c = 0; c < C; ++c) yi[c] = W[c] * (xi[c] * r);
    }
  }, 16);
}

void rmsnorm_backward(Context& ctx, Tensor& dx, Tensor* dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const int64_t N = x.shape[0], C = x.shape[1];
  const float* X = x.ptr<float>();
  const float* W = w.ptr<float>();
  const float* G = dout.ptr<float>();
  const float* R = rstd.ptr<float>();
  float* DX = dx.ptr<float>();
  ctx.parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* xi = X + i * C;
      const float* gi = G + i * C;
      float dot = 0.f;  // Σ_c dout·w·x
      for (int64_t c = 0; c < C; ++c) dot += gi[c] * W[c] * xi[c];
      const float r = R[i];
      const float k = r * r * r * dot / float(C);
      float* di = DX + i * C;
      for (int64_t c = 0; c < C; ++c) di[c] = r * gi[c] * W[c] - k * xi[c];
    }
  }, 16);
  if (dw) {
    // columns split across threads; each sums its rows in order (deterministic)
    float* DW = dw->ptr<float>();
    ctx.parallel_for(C, [&](int64_t c0, int64_t c1) {
      std::vector<float> acc(size_t(c1 - c0), 0.f);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = c0; c < c1; ++c) acc[size_t(c - c0)] += G[i * C + c] * X[i * C + c] * R[i];
      for (int64_t c = c0; c < c1; ++c) DW[c] += acc[size_t(c - c0)];
    }, 64);
  }
}

}  // namespace grpo::cpu
