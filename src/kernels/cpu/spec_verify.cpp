// CPU reference of spec_verify (kernels/spec_verify.h): plain loops, sums in double.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/spec_verify.h"

namespace grpo::cpu {

void spec_verify(Context& ctx, SpecVerifyOutputs& out, const Tensor& logits, const Tensor& P, const Tensor& Q,
                 const SpecVerifyRows& rows) {
  const int64_t N = rows.draft.numel(), V = P.shape[1], Rp = P.shape[0];
  const int64_t Rq = Q.defined() ? Q.shape[0] : 0, Vq = Q.defined() ? Q.shape[1] : 0;
  const int32_t* qi = rows.q_index.defined() ? rows.q_index.ptr<int32_t>() : nullptr;
  ctx.parallel_for(N, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int32_t pr = rows.p_rows.ptr<int32_t>()[i], qr = rows.q_rows.ptr<int32_t>()[i];
      const int32_t x = rows.draft.ptr<int32_t>()[i];
      GRPO_CHECK_MSG(pr >= 0 && pr < Rp && qr < Rq && x >= 0 && x < V, "spec_verify: row or draft id out of range");
      const float* p = P.ptr<float>() + pr * V;
      const float* q = qr >= 0 ? Q.ptr<float>() + qr * Vq : nullptr;
      const float* z = logits.ptr<float>() + pr * V;
      const uint64_t key = uint64_t(rows.rng_key.ptr<int64_t>()[i]), pos = uint64_t(rows.rng_pos.ptr<int64_t>()[i]);
      auto qv = [&](int64_t j) -> double {
        if (!q) return j == x ? 1.0 : 0.0;
        if (!qi) return double(q[j]);
        return qi[j] < 0 ? 0.0 : double(q[qi[j]]);
      };
      const double u_a = sampling_uniform(spec_accept_key(key), pos);
      const bool acc = u_a * qv(x) < double(p[x]);
      int64_t t = x;
      if (!acc) {
        double W = 0;
        int64_t last = -1;
        for (int64_t j = 0; j < V; ++j) {
          const double w = std::max(0.0, double(p[j]) - qv(j));
          W += w;
          if (w > 0) last = j;
        }
        if (W > 0) {
          const double target = double(sampling_uniform(spec_residual_key(key), pos)) * W;
          double cum = 0;
          t = last;
          for (int64_t j = 0; j < V; ++j) {
            cum += std::max(0.0, double(p[j]) - qv(j));
            if (cum > target) { t = j; break; }
          }
        }
      }
      float m = -INFINITY;
      for (int64_t j = 0; j < V; ++j) m = std::fmax(m, z[j]);
      double s = 0;
      for (int64_t j = 0; j < V; ++j) s += std::exp(double(z[j]) - double(m));
      out.token.ptr<int32_t>()[i] = int32_t(t);
      out.accepted.ptr<int32_t>()[i] = acc ? 1 : 0;
      out.lp_raw.ptr<float>()[i] = float(double(z[t]) - double(m) - std::log(s));
      out.lp_proc.ptr<float>()[i] = float(std::log(double(p[t])));
    }
  });
}

}  // namespace grpo::cpu
