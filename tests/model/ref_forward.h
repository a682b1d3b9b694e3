// An independent reference of the decoder forward for one sequence from
// position 0, written directly from the Hugging Face modeling code (Llama /
// Qwen2 / Qwen3 / Mistral) with plain loops in double: no paging, no kernels.
// The rotary frequencies follow transformers' formulas, evaluated in double.
#pragma once
#include <cmath>
#include <vector>

#include "model/weights.h"

namespace grpo::test {

inline std::vector<double> reference_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = std::pow(double(c.rope_theta), -2.0 * i / c.head_dim);
  const RopeScaling& rs = c.rope_scaling;
  for (double& f : inv) {
    if (rs.type == "linear") f /= rs.factor;
    if (rs.type == "llama3") {
      const double old = rs.original_max_position_embeddings;
      const double low_wl = old / rs.low_freq_factor, high_wl = old / rs.high_freq_factor;
      const double wl = 2 * M_PI / f;
      if (wl > low_wl) {
        f /= rs.factor;  // low frequency: interpolated
      } else if (wl >= high_wl) {  // medium: blend between interpolated and original
        const double smooth = (old / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv;
}

namespace ref_detail {
inline std::vector<double> rmsnorm(const std::vector<double>& x, const float* w, int64_t n, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double rs = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * rs * w[i];
  }
  return y;
}
// y (T, N) = x (T, K) · w (N, K)ᵀ
inline std::vector<double> matmul(const std::vector<double>& x, const Tensor& w, int64_t T) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const float* W = w.ptr<float>();
  std::vector<double> y(size_t(T * N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[size_t(t * K + k)] * W[n * K + k];
      y[size_t(t * N + n)] = s;
    }
  return y;
}
}  // namespace ref_detail

// logits (T, V) of every position of `toks`.
inline std::vector<double> reference_forward(const ModelWeights& w, const std::vector<int32_t>& toks) {
  using namespace ref_detail;
  const ModelConfig& c = w.config;
  const int64_t T = int64_t(toks.size()), C = c.hidden_size, D = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads;
  const int64_t F = c.intermediate_size, half = D / 2, G = Hq / Hkv;
  const double eps = c.rms_norm_eps;
  const std::vector<double> inv = reference_inv_freq(c);
  std::vector<double> x(size_t(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < C; ++i) x[size_t(t * C + i)] = w.embed.ptr<float>()[toks[size_t(t)] * C + i];
  auto rope = [&](double* v, int64_t pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv[size_t(i)], x1 = v[i], x2 = v[i + half];
      v[i] = x1 * std::cos(a) - x2 * std::sin(a);
      v[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  };
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& L = w.layers[size_t(layer)];
    const int64_t window = c.attn_window(layer);  // keys j with t - window < j <= t (0: all j <= t)
    std::vector<double> h = rmsnorm(x, L.attn_norm.ptr<float>(), C, eps);
    std::vector<double> qkv = matmul(h, L.wqkv, T);
    const int64_t W = (Hq + 2 * Hkv) * D;
    if (!L.bqkv.empty())
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < W; ++i) qkv[size_t(t * W + i)] += L.bqkv.ptr<float>()[i];
    std::vector<double> q(size_t(T * Hq * D)), k(size_t(T * Hkv * D)), v(size_t(T * Hkv * D));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < Hq * D; ++i) q[size_t(t * Hq * D + i)] = qkv[size_t(t * W + i)];
      for (int64_t i = 0; i < Hkv * D; ++i) k[size_t(t * Hkv * D + i)] = qkv[size_t(t * W + Hq * D + i)];
      for (int64_t i = 0; i < Hkv * D; ++i) v[size_t(t * Hkv * D + i)] = qkv[size_t(t * W + (Hq + Hkv) * D + i)];
    }
    if (c.qk_norm) {
      q = rmsnorm(q, L.q_norm.ptr<float>(), D, eps);
      k = rmsnorm(k, L.k_norm.ptr<float>(), D, eps);
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hh = 0; hh < Hq; ++hh) rope(&q[size_t((t * Hq + hh) * D)], t);
      for (int64_t hh = 0; hh < Hkv; ++hh) rope(&k[size_t((t * Hkv + hh) * D)], t);
    }
    std::vector<double> att(size_t(T * Hq * D), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t g = hh / G;
        std::vector<double> p(size_t(t + 1), -INFINITY);
        double m = -1e300, l = 0;
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        for (int64_t j = j0; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[size_t((t * Hq + hh) * D + d)] * k[size_t((j * Hkv + g) * D + d)];
          p[size_t(j)] = s / std::sqrt(double(D));
          m = std::max(m, p[size_t(j)]);
        }
        for (double& e : p) l += (e = std::exp(e - m));
        for (int64_t j = j0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d)
            att[size_t((t * Hq + hh) * D + d)] += p[size_t(j)] / l * v[size_t((j * Hkv + g) * D + d)];
      }
    std::vector<double> o = matmul(att, L.wo, T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = rmsnorm(x, L.mlp_norm.ptr<float>(), C, eps);
    std::vector<double> gu = matmul(h, L.w_gate_up, T), act(size_t(T * F));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < F; ++i) {
        const double g = gu[size_t(t * 2 * F + i)], u = gu[size_t(t * 2 * F + F + i)];
        act[size_t(t * F + i)] = g / (1 + std::exp(-g)) * u;
      }
    std::vector<double> dn = matmul(act, L.w_down, T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  std::vector<double> h = rmsnorm(x, w.final_norm.ptr<float>(), C, eps);
  std::vector<double> logits = matmul(h, w.lm_head, T);
  return logits;
}

}  // namespace grpo::test
