// CPU AdamW, as torch.optim.AdamW (decoupled weight decay):
//   g = grad·grad_scale;  p −= lr·wd·p;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
//   p −= (lr / (1−β1^t)) · m / (sqrt(v)/sqrt(1−β2^t) + eps);  param = p (converted).
// sum_squares sums fixed 64K-element blocks in f64 and adds the blocks in
// order, so the result is the same for any thread count.
#include "kernels/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace grpo::cpu {

void adamw_step(Context& ctx, Tensor& master, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p) {
  const int64_t n = master.numel();
  float *P = master.ptr<float>(), *M = m.ptr<float>(), *Vv = v.ptr<float>();
  const float* G = grad.ptr<float>();
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  const float step_size = float(double(p.lr) / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.f - p.lr * p.weight_decay;
  const bool write_param = param.data != master.data;
  ctx.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = G[i] * p.grad_scale;
      P[i] *= decay;
      M[i] = p.beta1 * M[i] + (1.f - p.beta1) * g;
      Vv[i] = p.beta2 * Vv[i] + (1.f - p.beta2) * g * g;
      P[i] -= step_size * M[i] / (std::sqrt(Vv[i]) / bc2_sqrt + p.eps);
    }
    if (write_param)
      convert_host(static_cast<char*>(param.data) + size_t(i0) * dtype_size(param.dtype), param.dtype, P + i0,
                   DType::f32, size_t(i1 - i0));
  }, 1 << 14);
}

double sum_squares(Context& ctx, const Tensor& grad) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t n = grad.numel(), nb = (n + kBlock - 1) / kBlock;
  const float* G = grad.ptr<float>();
  std::vector<double> part(size_t(nb), 0.0);
  ctx.parallel_for(nb, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double s = 0.0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) s += double(G[i]) * double(G[i]);
      part[size_t(b)] = s;
    }
  }, 1);
  double s = 0.0;
  for (double x : part) s += x;
  return s;
}

}  // namespace grpo::cpu
