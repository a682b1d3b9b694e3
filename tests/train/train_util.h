// Helpers shared by the trainer tests: tiny configs, random weights, a packed
// batch, and gradient comparison.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/train_model.h"
#include "model/weights.h"

namespace grpo::test {

// A tiny model with every optional part switched on by flags.
inline ModelConfig tiny_config(bool tied, bool bias, bool qk_norm) {
  ModelConfig c;
  c.arch = qk_norm ? Arch::qwen3 : bias ? Arch::qwen2 : Arch::llama;
  c.model_type = arch_name(c.arch);
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.f;
  c.rms_norm_eps = 1e-6f;
  c.tie_word_embeddings = tied;
  c.attention_bias = bias;
  c.qk_norm = qk_norm;
  return c;
}

// Weights on the CPU in f32: matrices ~ N(0, 1/in), embeddings ~ N(0, 1),
// norm weights ~ 1 + N(0, 0.2²), biases ~ N(0, 0.2²). Padding zeroed.
inline ModelWeights random_weights(const ModelConfig& c, uint32_t seed) {
  ModelWeights w = weights_allocate(c, Device::cpu, DType::f32);
  tensor_fill_zero(w.arena);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& [name, t] : w.params()) {
    float* p = t->ptr<float>();
    const bool norm = name.size() >= 4 && name.compare(name.size() - 4, 4, "norm") == 0;
    const bool bias = name.find("bqkv") != std::string::npos;
    const float sd = norm || bias ? 0.2f : name == "embed" ? 1.f : 1.f / std::sqrt(float(t->dim(-1)));
    for (int64_t i = 0; i < t->numel(); ++i) p[i] = (norm ? 1.f : 0.f) + sd * nd(rng);
  }
  return w;
}

inline ModelWeights zero_grads(const ModelConfig& c) {
  ModelWeights g;
  weights_bind(g, c, tensor_zeros(Device::cpu, DType::f32, {weights_numel(c)}));
  return g;
}

// Random sequences with the given (prompt_len, total_len).
inline TrainBatch random_batch(Context& ctx, const ModelConfig& c, const std::vector<std::pair<int, int>>& lens,
                               uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> pl;
  for (auto [p, n] : lens) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s) x = tok(rng);
    seqs.push_back(s);
    pl.push_back(p);
  }
  auto b = train_batch_build(ctx, seqs, pl, c.vocab_size);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return std::move(b).value();
}

// Compares two f32 buffers elementwise with |a - b| <= abs + rel·|b|; reports
// the max difference and the first bad index.
inline void expect_close(const float* a, const float* b, int64_t n, double abs_tol, double rel_tol,
                         const std::string& what) {
  double max_diff = 0;
  int64_t first_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    max_diff = std::max(max_diff, d);
    if (first_bad < 0 && !(d <= abs_tol + rel_tol * std::fabs(double(b[i])))) first_bad = i;
  }
  if (std::getenv("GRPO_TEST_VERBOSE")) {
    double ref_max = 0;
    for (int64_t i = 0; i < n; ++i) ref_max = std::max(ref_max, std::fabs(double(b[i])));
    std::printf("  %-40s max |diff| %.3g (max |ref| %.3g)\n", what.c_str(), max_diff, ref_max);
  }
  EXPECT_LT(first_bad, 0) << what << ": max |diff| " << max_diff << ", first bad index " << first_bad << " ("
                          << (first_bad >= 0 ? a[first_bad] : 0) << " vs " << (first_bad >= 0 ? b[first_bad] : 0)
                          << ")";
}

}  // namespace grpo::test
