// Tandem-training loss: the model mask of a tandem rollout mapped to per-token
// weights (tandem_loss_weights) and fed to the GRPO loss with the weights in the
// token-count denominators (the llm-tandem-verl fork), against an independent
// stdlib reimplementation with dual-number gradients:
// tests/fixtures/grpo/tandem_loss.json from tools/ref/make_tandem_loss_fixtures.py.
// End to end: the same loss through a real model against PyTorch autograd
// (tests/fixtures/grpo/<arch>/tandem_cases.json from tools/ref/make_tandem_grpo_fixture.py,
// run on the GPU machine; skipped until it exists). Also: the weighted step gives the
// same gradients however it is split into micro-batches.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "model/arch.h"
#include "model/checkpoint.h"
#include "train/grpo_loss.h"
#include "train/loop_rollout.h"
#include "train/train_step.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;
using nlohmann::json;

namespace {

const char* kFixture = "/tests/fixtures/grpo/tandem_loss.json";

std::vector<float> floats(const json& j, const char* key) {
  std::vector<float> v;
  for (auto& x : j.at(key)) v.push_back(x.get<float>());
  return v;
}

}  // namespace

TEST(TandemLoss, MaskToWeightsMatchesTheForkReference) {
  std::ifstream f(std::string(GRPO_SOURCE_DIR) + kFixture);
  if (!f) GTEST_SKIP() << kFixture << " is missing: run python3 tools/ref/make_tandem_loss_fixtures.py";
  const json cases = json::parse(f).at("cases");
  ASSERT_EQ(cases.size(), 15u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    const json& k = c.at("config");
    GrpoLossConfig cfg;
    cfg.loss_type = loss_type_from_string(k.at("loss_type")).value();
    cfg.beta = k.at("beta").get<float>();
    cfg.epsilon = k.at("eps").get<float>();
    cfg.epsilon_high = k.at("eps_high").get<float>();
    cfg.mask_truncated_completions = k.at("mask_truncated").get<bool>();
    cfg.max_completion_length = k.at("max_completion_length").get<int>();
    std::vector<int32_t> off = {0};
    for (auto& n : c.at("lens")) off.push_back(off.back() + n.get<int32_t>());
    const auto logp = floats(c, "logp"), old = floats(c, "old_logp"), ref = floats(c, "ref_logp"),
               adv = floats(c, "advantages");
    std::vector<uint8_t> model_mask, trunc;
    for (auto& x : c.at("model_mask")) model_mask.push_back(uint8_t(x.get<int>()));
    for (auto& x : c.at("truncated")) trunc.push_back(x.get<bool>());
    const std::vector<float> w = tandem_loss_weights(model_mask, k.at("partner_weight").get<float>());
    GrpoLossInput in;
    in.seq_offsets = off;
    in.logp = logp;
    in.old_logp = old;
    in.advantages = adv;
    if (cfg.beta != 0.f) in.ref_logp = ref;
    in.weights = w;
    in.truncated = trunc;
    ASSERT_TRUE(grpo_loss_check(cfg, in).ok()) << name;
    const GrpoLossOutput o = grpo_loss(cfg, in, GrpoLossNorm{});
    const double want = c.at("loss").get<double>();
    EXPECT_NEAR(o.loss, want, 1e-6 + 1e-5 * std::fabs(want)) << name;
    const json& g = c.at("dlogp");
    ASSERT_EQ(g.size(), o.dlogp.size()) << name;
    double max_diff = 0;
    int first_bad = -1;
    for (size_t t = 0; t < g.size(); ++t) {
      const double r = g[t].get<double>(), d = std::fabs(double(o.dlogp[t]) - r);
      max_diff = std::max(max_diff, d);
      if (first_bad < 0 && d > 1e-6 + 1e-5 * std::fabs(r)) first_bad = int(t);
    }
    EXPECT_LT(first_bad, 0) << name << ": dlogp[" << first_bad << "] differs (max |diff| " << max_diff << ")";
  }
}

TEST(TandemLoss, WeightsFromTheModelMask) {
  EXPECT_EQ(tandem_loss_weights({1, 0, 0, 1}, 0.2f), (std::vector<float>{1.f, 0.2f, 0.2f, 1.f}));
  EXPECT_TRUE(tandem_loss_weights({}, 0.2f).empty());
  // The loss always counts weighted tokens in its denominators: a dapo batch of one
  // partner token (weight 0.2) and one trained token normalises by 1.2, not 2.
  GrpoLossConfig cfg;
  cfg.loss_type = LossType::dapo;
  const std::vector<int32_t> off = {0, 2};
  const std::vector<float> logp = {-1.f, -2.f}, adv = {1.f}, w = tandem_loss_weights({0, 1}, 0.2f);
  GrpoLossInput in;
  in.seq_offsets = off;
  in.logp = logp;
  in.advantages = adv;
  in.weights = w;
  const double weighted = grpo_loss(cfg, in, GrpoLossNorm{}).loss;
  // On-policy the surrogate is −A per token: Σ w·(−1) / denominator.
  EXPECT_NEAR(weighted, -1.2 / 1.2, 1e-6);
}

TEST(TandemLoss, WeightedStepIsTheSameForAnyMicroBatching) {
  Context ctx;
  ModelConfig c = tiny_config(true, true, true);
  for (LossType lt : {LossType::grpo, LossType::bnpo, LossType::dapo, LossType::cispo}) {
    std::vector<float> grads[2];
    double loss[2];
    for (int k = 0; k < 2; ++k) {
      ModelWeights w = random_weights(c, 17);
      Optimizer opt = optimizer_create(ctx, w, AdamWConfig{});
      TrainModel m;
      GrpoStepOptions so;
      so.loss.loss_type = lt;
      so.loss.epsilon_high = lt == LossType::cispo ? 5.f : 0.28f;
      so.micro.max_tokens = k == 0 ? 1000 : 9;
      std::mt19937 rng(5);
      std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
      std::vector<GrpoSample> samples;
      for (int i = 0; i < 6; ++i) {
        GrpoSample s;
        for (int t = 0; t < 3; ++t) s.prompt.push_back(tok(rng));
        std::vector<uint8_t> mm;
        for (int t = 0; t < 2 + i; ++t) {
          s.completion.push_back(tok(rng));
          mm.push_back(uint8_t((t + i) % 3 != 0));
        }
        s.advantage = float(i % 3) - 1.f + 0.25f;
        s.weights = tandem_loss_weights(mm, 0.2f);
        samples.push_back(s);
      }
      auto r = grpo_train_step(ctx, m, w, opt, 1e-3, samples, so);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(r->n_micro > 1, k == 1);
      grads[k] = tensor_to_f32(opt.grad_arena);
      loss[k] = r->metrics.loss;
    }
    if (lt == LossType::bnpo) {
      // bnpo normalises per micro-batch by definition: only the single-batch value is pinned.
      continue;
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-6 * (1 + std::fabs(loss[0]))) << loss_type_name(lt);
    double gmax = 0;
    for (float x : grads[0]) gmax = std::max(gmax, double(std::fabs(x)));
    expect_close(grads[1].data(), grads[0].data(), int64_t(grads[0].size()), 1e-6 * gmax, 1e-4,
                 std::string("tandem micro-batching ") + loss_type_name(lt));
  }
}

namespace {

void run_e2e(const std::string& arch) {
  const std::string dir = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/grpo/" + arch;
  if (!std::filesystem::exists(dir + "/tandem_cases.json"))
    GTEST_SKIP() << dir << "/tandem_cases.json is missing: run python3 tools/ref/make_tandem_grpo_fixture.py "
                           "(torch + transformers)";
  Context ctx;
  auto wr = model_load(dir, Device::cpu, DType::f32, &ctx);
  ASSERT_TRUE(wr.ok()) << wr.status().message();
  ModelWeights w = std::move(wr).value();
  json fx, tx;
  std::ifstream(dir + "/cases.json") >> fx;
  std::ifstream(dir + "/tandem_cases.json") >> tx;
  const json& B = fx.at("batch");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> plens;
  for (size_t s = 0; s < B.at("prompts").size(); ++s) {
    std::vector<int32_t> q = B["prompts"][s].get<std::vector<int32_t>>();
    plens.push_back(int32_t(q.size()));
    for (int32_t t : B["completions"][s].get<std::vector<int32_t>>()) q.push_back(t);
    seqs.push_back(q);
  }
  auto br = train_batch_build(ctx, seqs, plens, w.config.vocab_size);
  ASSERT_TRUE(br.ok()) << br.status().message();
  const TrainBatch& b = *br;
  const int64_t Tc = b.n_completion;
  const std::vector<float> old = floats(B, "old_logp"), ref = floats(B, "ref_logp"),
                           adv = floats(fx.at("advantages"), "group");
  std::vector<uint8_t> trunc, model_mask;
  for (auto& x : B["truncated"]) trunc.push_back(x.get<bool>());
  for (auto& x : tx.at("model_mask")) model_mask.push_back(uint8_t(x.get<int>()));
  ASSERT_EQ(int64_t(model_mask.size()), Tc);
  TrainModel m;
  Tensor lp_t = tensor_empty(Device::cpu, DType::f32, {Tc});
  const auto specs = arch_tensors(w.config);
  for (const json& cs : tx.at("cases")) {
    const std::string what = arch + "/" + cs.at("name").get<std::string>();
    SCOPED_TRACE(what);
    const json& c = cs.at("config");
    GrpoLossConfig cfg;
    cfg.loss_type = loss_type_from_string(c.at("loss_type").get<std::string>()).value();
    cfg.beta = c.at("beta").get<float>();
    cfg.epsilon = c.at("eps").get<float>();
    cfg.epsilon_high = c.at("eps_high").get<float>();
    cfg.mask_truncated_completions = c.at("mask_truncated").get<bool>();
    cfg.max_completion_length = B.at("max_completion_length").get<int>();
    const std::vector<float> wts = tandem_loss_weights(model_mask, c.at("partner_weight").get<float>());
    train_model_forward(ctx, m, w, b, lp_t, nullptr, true);
    const std::vector<float> logp = tensor_to_f32(lp_t);
    GrpoLossInput in;
    in.seq_offsets = b.completion_offsets;
    in.logp = logp;
    in.advantages = adv;
    in.old_logp = old;
    in.ref_logp = ref;
    in.weights = wts;
    in.truncated = trunc;
    ASSERT_TRUE(grpo_loss_check(cfg, in).ok());
    const GrpoLossOutput out = grpo_loss(cfg, in, GrpoLossNorm{});
    const double lref = cs.at("loss").get<double>();
    EXPECT_NEAR(out.loss, lref, 1e-6 + 1e-4 * std::fabs(lref)) << "loss";
    const std::vector<float> dref = floats(cs, "dlogp");
    expect_close(out.dlogp.data(), dref.data(), Tc, 1e-7, 1e-4, what + " dlogp");
    ModelWeights g = zero_grads(w.config);
    Tensor d = tensor_from_f32(Device::cpu, DType::f32, out.dlogp, {Tc});
    train_model_backward(ctx, m, w, b, d, g);
    for (const HfTensorSpec& s : specs) {
      const json& ps = cs.at("params").at(s.name);
      const Tensor v = arch_view(g, s);
      const float* gp = v.ptr<float>();
      double norm = 0, probe = 0;
      for (int64_t i = 0; i < v.numel(); ++i) {
        norm += double(gp[i]) * gp[i];
        probe += double(gp[i]) * std::sin(0.7 * double(i) + 0.3);
      }
      norm = std::sqrt(norm);
      const double nref = ps.at("norm").get<double>();
      EXPECT_NEAR(norm, nref, 1e-4 * nref + 1e-9) << s.name << " gradient norm";
      EXPECT_NEAR(probe, ps.at("probe_dot").get<double>(), 1e-4 * ps.at("probe_abs").get<double>() + 1e-9)
          << s.name << " gradient probe";
      for (const json& smp : ps.at("samples")) {
        const int64_t i = smp[0].get<int64_t>();
        ASSERT_LT(i, v.numel());
        EXPECT_NEAR(gp[i], smp[1].get<double>(), 1e-4 * std::fabs(smp[1].get<double>()) + 1e-5 * nref)
            << s.name << "[" << i << "]";
      }
    }
  }
}

}  // namespace

TEST(TandemLoss, EndToEndGradientsMatchPyTorchLlama) { run_e2e("llama"); }
TEST(TandemLoss, EndToEndGradientsMatchPyTorchQwen3) { run_e2e("qwen3"); }
