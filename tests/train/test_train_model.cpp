// Training forward/backward of the whole model on the CPU: finite-difference
// gradient check, recompute == stored activations, micro-batch accumulation,
// and one AdamW step against the torch.optim.AdamW formula.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/grpo_loss.h"
#include "train/optimizer.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
const std::vector<std::pair<int, int>> kLens = {{3, 7}, {1, 4}, {5, 6}};

// Σ_t c_t·logp_t in double.
double weighted_logp(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                     const std::vector<float>& coef) {
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, nullptr, false);
  double s = 0;
  for (int t = 0; t < b.n_completion; ++t) s += double(coef[size_t(t)]) * lp.ptr<float>()[t];
  return s;
}

std::vector<float> grads_of(Context& ctx, const ModelWeights& w, const TrainBatch& b, const std::vector<float>& coef,
                            bool recompute, ModelWeights* grads_out = nullptr) {
  TrainModelOptions o;
  o.recompute = recompute;
  TrainModel m(o);
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  Tensor ent = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, &ent, true);
  Tensor d = tensor_from_f32(Device::cpu, DType::f32, coef, {int64_t(coef.size())});
  ModelWeights g = zero_grads(w.config);
  train_model_backward(ctx, m, w, b, d, g);
  if (grads_out) *grads_out = g;
  return tensor_to_f32(g.arena);
}
}  // namespace

namespace {
// d(Σ c_t logp_t)/dθ against central differences, for a few elements of every parameter tensor.
void finite_difference_check(const ModelConfig& c) {
  Context ctx;
  ModelWeights w = random_weights(c, 11);
  TrainBatch b = random_batch(ctx, c, kLens, 5);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> coef(size_t(b.n_completion));
  for (auto& x : coef) x = nd(rng);
  ModelWeights g;
  grads_of(ctx, w, b, coef, false, &g);
  TrainModel m;
  auto gp = g.params();
  auto wp = w.params();
  int n_checked = 0;
  for (size_t i = 0; i < wp.size(); ++i) {
    Tensor& wt = *wp[i].second;
    std::uniform_int_distribution<int64_t> pick(0, wt.numel() - 1);
    double gmax = 0;
    for (int64_t j = 0; j < gp[i].second->numel(); ++j) gmax = std::max(gmax, double(std::fabs(gp[i].second->ptr<float>()[j])));
    for (int k = 0; k < 3; ++k) {
      const int64_t j = pick(rng);
      float* p = wt.ptr<float>() + j;
      // Five-point stencil: (−f(2h) + 8f(h) − 8f(−h) + f(−2h)) / 12h, error O(h⁴).
      const float orig = *p, h = 2e-3f;
      auto f_at = [&](float x) {
        *p = x;
        return weighted_logp(ctx, m, w, b, coef);
      };
      const double fd = (-f_at(orig + 2 * h) + 8 * f_at(orig + h) - 8 * f_at(orig - h) + f_at(orig - 2 * h)) / (12.0 * h);
      *p = orig;
      const double an = gp[i].second->ptr<float>()[j];
      EXPECT_NEAR(an, fd, 2e-3 * std::fabs(fd) + 2e-3 * gmax + 1e-4) << wp[i].first << "[" << j << "]";
      ++n_checked;
    }
  }
  EXPECT_GT(n_checked, 20);
}
}  // namespace

class TrainModelGrad : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(TrainModelGrad, FiniteDifferences) {
  auto [tied, bias, qk] = GetParam();
  finite_difference_check(tiny_config(tied, bias, qk));
}

// A 3-token window on layer 0 (sequences of 7..11 tokens): the backward through the
// windowed mask agrees with the windowed forward, and the window changes the logprobs.
TEST(TrainModel, SlidingWindowFiniteDifferences) {
  ModelConfig c = tiny_config(false, true, false);
  c.sliding_window = 3;
  c.layer_window = {3, 0};
  finite_difference_check(c);
  Context ctx;
  ModelWeights w = random_weights(c, 11);
  TrainBatch b = random_batch(ctx, c, kLens, 5);
  std::vector<float> coef(size_t(b.n_completion), 1.f);
  TrainModel m;
  const double windowed = weighted_logp(ctx, m, w, b, coef);
  w.config.layer_window.clear();
  w.config.sliding_window = 0;
  TrainModel m2;
  EXPECT_GT(std::fabs(windowed - weighted_logp(ctx, m2, w, b, coef)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Variants, TrainModelGrad,
                         ::testing::Values(std::make_tuple(false, false, false), std::make_tuple(true, true, false),
                                           std::make_tuple(true, false, true), std::make_tuple(false, true, true)));

TEST(TrainModel, RecomputeEqualsStoredActivations) {
  Context ctx;
  for (bool qk : {false, true}) {
    ModelConfig c = tiny_config(true, true, qk);
    ModelWeights w = random_weights(c, 3);
    TrainBatch b = random_batch(ctx, c, kLens, 9);
    std::vector<float> coef(size_t(b.n_completion));
    for (size_t t = 0; t < coef.size(); ++t) coef[t] = 0.1f * float(int(t % 5) - 2);
    auto a = grads_of(ctx, w, b, coef, false), r = grads_of(ctx, w, b, coef, true);
    ASSERT_EQ(a.size(), r.size());
    size_t n_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) n_diff += a[i] != r[i];
    EXPECT_EQ(n_diff, 0u) << "recompute changed gradients (qk_norm " << qk << ")";
  }
}

TEST(TrainModel, ForwardLogprobsAreNormalised) {
  // A 1-token completion after each prefix: Σ_v exp(logp(v)) over the whole vocabulary = 1.
  Context ctx;
  ModelConfig c = tiny_config(false, false, false);
  ModelWeights w = random_weights(c, 4);
  std::vector<std::vector<int32_t>> seqs;
  for (int v = 0; v < c.vocab_size; ++v) seqs.push_back({5, 9, 2, v});
  auto b = train_batch_build(ctx, seqs, std::vector<int32_t>(seqs.size(), 3), c.vocab_size);
  ASSERT_TRUE(b.ok());
  TrainModel m;
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b->n_completion});
  train_model_forward(ctx, m, w, *b, lp, nullptr, false);
  double s = 0;
  for (int v = 0; v < c.vocab_size; ++v) s += std::exp(double(lp.ptr<float>()[v]));
  EXPECT_NEAR(s, 1.0, 1e-5);
}

TEST(TrainModel, BatchValidation) {
  Context ctx;
  EXPECT_FALSE(train_batch_build(ctx, {{1, 2, 3}}, {3}, 10).ok());   // no completion
  EXPECT_FALSE(train_batch_build(ctx, {{1, 2, 3}}, {0}, 10).ok());   // no prompt
  EXPECT_FALSE(train_batch_build(ctx, {{1, 20, 3}}, {1}, 10).ok());  // id outside the vocabulary
  EXPECT_FALSE(train_batch_build(ctx, {{1, 2}}, {1, 1}, 10).ok());   // count mismatch
}

// GRPO micro-batches (2 + 2 sequences, gradient accumulation) give the
// gradients of the one batch of 4, for the loss types whose normaliser is global.
TEST(TrainModel, MicroBatchAccumulationEqualsFullBatch) {
  Context ctx;
  ModelConfig c = tiny_config(true, true, false);
  ModelWeights w = random_weights(c, 21);
  const std::vector<std::pair<int, int>> lens = {{2, 6}, {2, 4}, {3, 8}, {3, 5}};
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> pl;
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  for (auto [p, n] : lens) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s) x = tok(rng);
    seqs.push_back(s);
    pl.push_back(p);
  }
  const std::vector<float> adv = {0.9f, -0.4f, 1.3f, -1.1f};
  for (LossType lt : {LossType::grpo, LossType::dr_grpo, LossType::dapo}) {
    GrpoLossConfig cfg;
    cfg.loss_type = lt;
    cfg.beta = 0.f;
    cfg.max_completion_length = 5;
    // Runs sequences [s0, s1) as one micro-batch of a step of n_micro; adds into g.
    auto micro = [&](int s0, int s1, int n_micro, ModelWeights& g, std::vector<float>* old_out,
                     const std::vector<float>* old_in) {
      std::vector<std::vector<int32_t>> ss(seqs.begin() + s0, seqs.begin() + s1);
      std::vector<int32_t> pp(pl.begin() + s0, pl.begin() + s1);
      auto b = train_batch_build(ctx, ss, pp, c.vocab_size);
      TrainModel m;
      Tensor lp = tensor_empty(Device::cpu, DType::f32, {b->n_completion});
      train_model_forward(ctx, m, w, *b, lp, nullptr, true);
      std::vector<float> logp = tensor_to_f32(lp);
      // old logprobs: the current ones shifted by a fixed pattern so that some ratios clip.
      std::vector<float> old(logp.size());
      for (size_t t = 0; t < old.size(); ++t) old[t] = logp[t] + 0.15f * float(int(t % 5) - 2);
      if (old_in) old = *old_in;
      if (old_out) *old_out = old;
      GrpoLossInput in;
      in.seq_offsets = b->completion_offsets;
      in.logp = logp;
      in.old_logp = old;
      std::vector<float> a(adv.begin() + s0, adv.begin() + s1);
      in.advantages = a;
      GrpoLossNorm n;
      n.n_micro = n_micro;
      n.n_seqs_total = 4;
      n.dapo_num_items = 4 + 2 + 5 + 2;  // completion tokens of all four sequences
      auto o = grpo_loss(cfg, in, n);
      Tensor d = tensor_from_f32(Device::cpu, DType::f32, o.dlogp, {int64_t(o.dlogp.size())});
      train_model_backward(ctx, m, w, *b, d, g);
      return o.loss;
    };
    ModelWeights g_full = zero_grads(c), g_micro = zero_grads(c);
    std::vector<float> old_full;
    const double l_full = micro(0, 4, 1, g_full, &old_full, nullptr);
    std::vector<float> old_a(old_full.begin(), old_full.begin() + 6), old_b(old_full.begin() + 6, old_full.end());
    const double l_micro = micro(0, 2, 2, g_micro, nullptr, &old_a) + micro(2, 4, 2, g_micro, nullptr, &old_b);
    EXPECT_NEAR(l_micro, l_full, 1e-6 * (1 + std::fabs(l_full))) << loss_type_name(lt);
    auto a = tensor_to_f32(g_micro.arena), f = tensor_to_f32(g_full.arena);
    double gmax = 0;
    for (float x : f) gmax = std::max(gmax, double(std::fabs(x)));
    expect_close(a.data(), f.data(), int64_t(f.size()), 1e-6 * gmax, 1e-4, std::string("micro vs full ") + loss_type_name(lt));
  }
}

// One and two AdamW steps against torch.optim.AdamW written out by hand, with
// clipping (HF clip_grad_norm_) and the HF decay rule (norms and biases excluded).
TEST(Optimizer, AdamWMatchesTorchFormula) {
  Context ctx;
  ModelConfig c = tiny_config(false, true, false);
  ModelWeights w = random_weights(c, 5);
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  cfg.max_grad_norm = 1.0f;
  Optimizer opt = optimizer_create(ctx, w, cfg);
  ASSERT_EQ(opt.master.data, w.arena.data);  // f32: master and params are one buffer
  // Slots: decay for matrices and embeddings, none for norms and the bias.
  for (auto& s : opt.slots) {
    const bool nd = s.name.find("norm") != std::string::npos || s.name.find("bqkv") != std::string::npos;
    EXPECT_EQ(s.decay, !nd) << s.name;
  }
  const int64_t n = opt.grad_arena.numel();
  auto set_grads = [&](float scale) {
    float* g = opt.grad_arena.ptr<float>();
    for (auto& [name, t] : opt.grads.params())
      for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = scale * std::sin(0.37f * float(i) + float(name.size()));
    (void)g;
  };
  std::vector<double> p0(static_cast<size_t>(n)), m(static_cast<size_t>(n), 0.0), v(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) p0[size_t(i)] = w.arena.ptr<float>()[i];
  // Reference, per element, torch.optim.AdamW (step k, bias corrections bc1 = 1 - β1^k, bc2 = 1 - β2^k):
  //   p *= 1 - lr·wd;  m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²;
  //   p -= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps)
  // with g = grad · min(1, max_norm / (‖grad‖ + 1e-6)).
  std::vector<double> ref = p0;
  std::vector<bool> decays(static_cast<size_t>(n), false);
  for (auto& s : opt.slots)
    for (int64_t i = 0; i < s.numel; ++i) decays[size_t(s.offset + i)] = s.decay;
  const double lr = 1e-2;
  for (int k = 1; k <= 2; ++k) {
    set_grads(k == 1 ? 0.5f : 0.01f);
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(opt.grad_arena.ptr<float>()[i]) * opt.grad_arena.ptr<float>()[i];
    const double norm = std::sqrt(ss), scale = std::min(1.0, 1.0 / (norm + 1e-6));
    auto st = optimizer_step(ctx, opt, w, lr);
    EXPECT_NEAR(st.grad_norm, norm, 1e-6 * norm);
    EXPECT_NEAR(st.clip_scale, scale, 1e-9);
    EXPECT_EQ(k == 1, scale < 1.0);  // the first step clips, the second does not
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, bc1 = 1 - std::pow(b1, k), bc2 = 1 - std::pow(b2, k);
    for (auto& s : opt.slots)
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const double g = double(opt.grad_arena.ptr<float>()[i]) * scale;
        if (decays[size_t(i)]) ref[size_t(i)] *= 1 - lr * 0.1;
        m[size_t(i)] = b1 * m[size_t(i)] + (1 - b1) * g;
        v[size_t(i)] = b2 * v[size_t(i)] + (1 - b2) * g * g;
        ref[size_t(i)] -= (lr / bc1) * m[size_t(i)] / (std::sqrt(v[size_t(i)]) / std::sqrt(bc2) + eps);
      }
    double max_diff = 0;
    for (auto& s : opt.slots)
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
        max_diff = std::max(max_diff, std::fabs(double(w.arena.ptr<float>()[i]) - ref[size_t(i)]));
    EXPECT_LT(max_diff, 2e-6) << "step " << k;
  }
  optimizer_zero_grad(ctx, opt);
  EXPECT_EQ(grad_global_norm(ctx, opt), 0.0);
}

TEST(Optimizer, DecayRuleFromNames) {
  EXPECT_TRUE(param_default_decay("embed"));
  EXPECT_TRUE(param_default_decay("layers.0.wqkv"));
  EXPECT_TRUE(param_default_decay("lm_head"));
  EXPECT_FALSE(param_default_decay("layers.3.attn_norm"));
  EXPECT_FALSE(param_default_decay("layers.3.q_norm"));
  EXPECT_FALSE(param_default_decay("layers.3.bqkv"));
  EXPECT_FALSE(param_default_decay("final_norm"));
}
