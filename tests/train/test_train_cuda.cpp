// The training forward/backward and one GRPO step on CUDA against the CPU
// reference, on the qwen3 GRPO fixture model (tests/fixtures/grpo). f32 on the
// device must agree to f32 precision; bf16 (the production dtype) to bf16
// precision; after a step the bf16 parameters are exactly the rounding of the
// f32 master weights. Skips (at run time) where no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/linear.h"
#include "model/checkpoint.h"
#include "train/advantages.h"
#include "train/train_step.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

struct Fixture {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> plens;
  std::vector<float> dlogp, rewards;
  std::vector<std::vector<int32_t>> prompts, completions;
};

Fixture load_fixture(const std::string& dir) {
  Fixture f;
  nlohmann::json fx;
  std::ifstream(dir + "/cases.json") >> fx;
  const auto& B = fx.at("batch");
  for (size_t s = 0; s < B.at("prompts").size(); ++s) {
    f.prompts.push_back(B["prompts"][s].get<std::vector<int32_t>>());
    f.completions.push_back(B["completions"][s].get<std::vector<int32_t>>());
    std::vector<int32_t> q = f.prompts.back();
    q.insert(q.end(), f.completions.back().begin(), f.completions.back().end());
    f.seqs.push_back(q);
    f.plens.push_back(int32_t(f.prompts.back().size()));
  }
  f.rewards = B.at("rewards").get<std::vector<float>>();
  for (const auto& c : fx.at("cases"))
    if (c.at("name") == "full") f.dlogp = c.at("dlogp").get<std::vector<float>>();
  return f;
}

// logp and the gradient arena (host copies) of forward + backward with `dlogp`.
void run_model(Context& ctx, const ModelWeights& w, const Fixture& f, bool recompute, std::vector<float>* logp,
               std::vector<float>* grads) {
  auto b = train_batch_build(ctx, f.seqs, f.plens, w.config.vocab_size);
  ASSERT_TRUE(b.ok());
  TrainModelOptions o;
  o.recompute = recompute;
  TrainModel m(o);
  Tensor lp = tensor_empty(ctx.device(), DType::f32, {b->n_completion});
  train_model_forward(ctx, m, w, *b, lp, nullptr, true);
  ModelWeights g;
  weights_bind(g, w.config, tensor_zeros(ctx.device(), DType::f32, {weights_numel(w.config)}));
  Tensor d = tensor_from_f32(ctx.device(), DType::f32, f.dlogp, {int64_t(f.dlogp.size())});
  train_model_backward(ctx, m, w, *b, d, g);
  ctx.synchronize();
  *logp = tensor_to_f32(lp);
  *grads = tensor_to_f32(g.arena);
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

const std::string kDir = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/grpo/qwen3";

}  // namespace

TEST(TrainCuda, MatchesCpuInF32AndBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = load_fixture(kDir);
  ASSERT_FALSE(f.dlogp.empty()) << "missing " << kDir << ": run tools/ref/make_grpo_fixtures.py";
  Context cctx;
  ContextOptions go;
  go.device = Device::cuda;
  Context gctx(go);
  auto wc = model_load(kDir, Device::cpu, DType::f32);
  ASSERT_TRUE(wc.ok()) << wc.status().message();
  std::vector<float> lp_c, g_c;
  run_model(cctx, *wc, f, false, &lp_c, &g_c);
  const double gmax = max_abs(g_c);

  for (DType dt : {DType::f32, DType::bf16}) {
    const bool f32 = dt == DType::f32;
    auto wg = model_load(kDir, Device::cuda, dt, &gctx);
    ASSERT_TRUE(wg.ok()) << wg.status().message();
    for (bool recompute : {false, true}) {
      std::vector<float> lp_g, g_g;
      run_model(gctx, *wg, f, recompute, &lp_g, &g_g);
      const std::string what = std::string(f32 ? "f32" : "bf16") + (recompute ? " recompute" : "");
      expect_close(lp_g.data(), lp_c.data(), int64_t(lp_c.size()), f32 ? 1e-4 : 0.1, f32 ? 1e-4 : 0.02, what + " logp");
      if (f32) {
        expect_close(g_g.data(), g_c.data(), int64_t(g_c.size()), 1e-5 * gmax, 1e-3, what + " grads");
      } else {  // bf16 activations: compare direction and size
        double dot = 0, nc = 0, ng = 0;
        for (size_t i = 0; i < g_c.size(); ++i) {
          dot += double(g_c[i]) * g_g[i];
          nc += double(g_c[i]) * g_c[i];
          ng += double(g_g[i]) * g_g[i];
        }
        EXPECT_GT(dot / std::sqrt(nc * ng), 0.99) << what << " gradient cosine";
        EXPECT_NEAR(std::sqrt(ng / nc), 1.0, 0.05) << what << " gradient norm ratio";
      }
    }
  }
}

// train.on_policy = "bitwise" on CUDA: the trainer's forward runs the engine's kernels (the
// batch-invariant GEMM, the paged attention that also writes the log-sum-exp the backward
// reads); its logprobs and gradients agree with the CPU reference (and so with PyTorch) to
// bf16 precision, as the default mode's do. A wrong log-sum-exp would scale every attention
// gradient. Needs an sm_90 GPU.
TEST(TrainCuda, BitwiseModeMatchesCpuInBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ContextOptions go;
  go.device = Device::cuda;
  go.deterministic = go.batch_invariant = true;
  Context gctx(go);
  const std::string why = batch_invariant_gemm_problem(gctx, DType::bf16);
  if (!why.empty()) GTEST_SKIP() << why;
  const Fixture f = load_fixture(kDir);
  ASSERT_FALSE(f.dlogp.empty()) << "missing " << kDir << ": run tools/ref/make_grpo_fixtures.py";
  Context cctx;
  auto wc = model_load(kDir, Device::cpu, DType::f32);
  ASSERT_TRUE(wc.ok()) << wc.status().message();
  std::vector<float> lp_c, g_c;
  run_model(cctx, *wc, f, false, &lp_c, &g_c);
  auto wg = model_load(kDir, Device::cuda, DType::bf16, &gctx);
  ASSERT_TRUE(wg.ok()) << wg.status().message();
  std::vector<float> lp_g, g_g;
  run_model(gctx, *wg, f, false, &lp_g, &g_g);
  expect_close(lp_g.data(), lp_c.data(), int64_t(lp_c.size()), 0.1, 0.02, "bitwise bf16 logp");
  double dot = 0, nc = 0, ng = 0;
  for (size_t i = 0; i < g_c.size(); ++i) {
    dot += double(g_c[i]) * g_g[i];
    nc += double(g_c[i]) * g_c[i];
    ng += double(g_g[i]) * g_g[i];
  }
  EXPECT_GT(dot / std::sqrt(nc * ng), 0.99) << "bitwise bf16 gradient cosine";
  EXPECT_NEAR(std::sqrt(ng / nc), 1.0, 0.05) << "bitwise bf16 gradient norm ratio";
}

TEST(TrainCuda, Bf16StepWritesRoundedMaster) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = load_fixture(kDir);
  ASSERT_FALSE(f.completions.empty()) << "missing " << kDir << ": run tools/ref/make_grpo_fixtures.py";
  ContextOptions go;
  go.device = Device::cuda;
  Context gctx(go);
  auto wg = model_load(kDir, Device::cuda, DType::bf16, &gctx);
  ASSERT_TRUE(wg.ok()) << wg.status().message();
  auto adv = compute_advantages(f.rewards, 3, ScaleRewards::group);
  ASSERT_TRUE(adv.ok());
  std::vector<GrpoSample> samples(f.prompts.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].prompt = f.prompts[i];
    samples[i].completion = f.completions[i];
    samples[i].advantage = (*adv)[i];
  }
  const std::vector<float> before = (gctx.synchronize(), tensor_to_f32(wg->arena));
  AdamWConfig ac;
  ac.weight_decay = 0.01f;
  Optimizer opt = optimizer_create(gctx, *wg, ac);
  TrainModel m;
  GrpoStepOptions so;
  so.loss.loss_type = LossType::grpo;
  so.micro.max_tokens = 20;  // several micro-batches
  auto r = grpo_train_step(gctx, m, *wg, opt, 1e-2, samples, so);  // Adam moves each weight by ~lr
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r->n_micro, 1);
  EXPECT_TRUE(std::isfinite(r->optim.grad_norm) && r->optim.grad_norm > 0);
  gctx.synchronize();
  const std::vector<float> master = tensor_to_f32(opt.master), params = tensor_to_f32(wg->arena);
  size_t n_changed = 0, n_bad = 0, n_total = 0;
  for (auto& s : opt.slots)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i, ++n_total) {
      n_changed += params[size_t(i)] != before[size_t(i)];
      n_bad += params[size_t(i)] != bf16_to_f32(f32_to_bf16(master[size_t(i)]));
    }
  EXPECT_EQ(n_bad, 0u) << "bf16 parameters are not the rounding of the f32 master";
  EXPECT_GT(n_changed, n_total / 2);  // most weights move by more than a bf16 step
}
