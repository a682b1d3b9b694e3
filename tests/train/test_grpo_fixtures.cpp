// GRPO loss and every parameter gradient against PyTorch autograd on tiny
// random Hugging Face models (tests/fixtures/grpo, written by
// tools/ref/make_grpo_fixtures.py on the GPU machine). CPU, fp32.
// Missing fixtures fail (they do not skip): run the script to create them. The
// sliding-window ones (mistral_swa, qwen2_swa) skip until generated.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/arch.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "train/advantages.h"
#include "train/grpo_loss.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;
using nlohmann::json;

namespace {

const char* kScript = "python3 tools/ref/make_grpo_fixtures.py --out tests/fixtures/grpo";

std::string fixture_dir(const std::string& arch) { return std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/grpo/" + arch; }

std::vector<float> floats(const json& j) {
  std::vector<float> v;
  for (auto& x : j) v.push_back(x.get<float>());
  return v;
}

// Statistics of the flattened gradient, as the script computes them.
struct Stats {
  double norm = 0, probe_dot = 0;
};
Stats stats_of(const float* g, int64_t n) {
  Stats s;
  for (int64_t i = 0; i < n; ++i) {
    s.norm += double(g[i]) * g[i];
    s.probe_dot += double(g[i]) * std::sin(0.7 * double(i) + 0.3);
  }
  s.norm = std::sqrt(s.norm);
  return s;
}

Result<GrpoLossConfig> config_of(const json& c) {
  GrpoLossConfig cfg;
  GRPO_ASSIGN_OR_RETURN(cfg.loss_type, loss_type_from_string(c.at("loss_type").get<std::string>()));
  GRPO_ASSIGN_OR_RETURN(cfg.is_mode, is_mode_from_string(c.at("is_mode").get<std::string>()));
  cfg.beta = c.at("beta").get<float>();
  cfg.epsilon = c.at("eps").get<float>();
  cfg.epsilon_high = c.at("eps_high").get<float>();
  cfg.is_sequence_geomean = c.at("is_geomean").get<bool>();
  cfg.is_cap = c.at("is_cap").get<float>();
  cfg.mask_truncated_completions = c.at("mask_truncated").get<bool>();
  return cfg;
}

void run_arch(const std::string& arch) {
  const std::string dir = fixture_dir(arch);
  ASSERT_TRUE(std::filesystem::exists(dir + "/cases.json"))
      << "missing fixture " << dir << "/cases.json: run `" << kScript << "` (on a machine with torch + transformers)";
  Context ctx;
  auto wr = model_load(dir, Device::cpu, DType::f32, &ctx);
  ASSERT_TRUE(wr.ok()) << wr.status().message();
  ModelWeights w = std::move(wr).value();
  json fx;
  std::ifstream(dir + "/cases.json") >> fx;
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
  const int L = B.at("max_completion_length").get<int>();
  const std::vector<float> old = floats(B["old_logp"]), ref = floats(B["ref_logp"]), roll = floats(B["rollout_logp"]),
                           wts = floats(B["weights"]), rewards = floats(B["rewards"]);
  std::vector<uint8_t> trunc;
  for (auto& x : B["truncated"]) trunc.push_back(x.get<bool>());

  TrainModel m;
  Tensor lp_t = tensor_empty(Device::cpu, DType::f32, {Tc}), ent_t = tensor_empty(Device::cpu, DType::f32, {Tc});
  train_model_forward(ctx, m, w, b, lp_t, &ent_t, false);
  const std::vector<float> lp = tensor_to_f32(lp_t), ent = tensor_to_f32(ent_t);
  const std::vector<float> lp_ref = floats(B["logp"]), ent_ref = floats(B["entropy"]);
  expect_close(lp.data(), lp_ref.data(), Tc, 2e-5, 1e-4, arch + " logp");
  expect_close(ent.data(), ent_ref.data(), Tc, 2e-5, 1e-4, arch + " entropy");

  for (const char* mode : {"group", "batch", "none"}) {
    auto a = compute_advantages(rewards, B["group_size"].get<int>(), scale_rewards_from_string(mode).value());
    ASSERT_TRUE(a.ok());
    const std::vector<float> aref = floats(fx["advantages"][mode]);
    expect_close(a->data(), aref.data(), int64_t(aref.size()), 1e-6, 1e-5, arch + " advantages " + mode);
  }

  const auto specs = arch_tensors(w.config);
  int n_cases = 0;
  // Fixtures written before per-token weights entered the token-mean counts hold the old
  // expectation for weighted cases. bnpo divides the whole micro-batch by one count, so its
  // new expectation is the old one times Σm / Σm·w (m: mask after truncation masking),
  // computed here from the fixture's batch; other weighted cases are skipped and named.
  const bool weights_in_counts = fx.value("weights_in_counts", false);
  std::string stale;
  for (const json& cs : fx.at("cases")) {
    const std::string name = cs.at("name").get<std::string>();
    const std::string what = arch + "/" + name;
    SCOPED_TRACE(what);
    const json& c = cs.at("config");
    double scale = 1.0;
    if (!weights_in_counts && c.value("use_weights", false)) {
      if (c.at("loss_type") != "bnpo") {
        stale += (stale.empty() ? "" : ", ") + name;
        continue;
      }
      double n_m = 0, n_mw = 0;
      for (size_t sq = 0; sq + 1 < b.completion_offsets.size(); ++sq)
        for (int32_t t = b.completion_offsets[sq]; t < b.completion_offsets[sq + 1]; ++t) {
          const double mt = c.value("mask_truncated", false) && trunc[sq] ? 0.0 : 1.0;
          n_m += mt;
          n_mw += mt * wts[size_t(t)];
        }
      scale = std::max(1.0, n_m) / std::max(1.0, n_mw);
    }
    train_model_forward(ctx, m, w, b, lp_t, nullptr, true);
    const std::vector<float> logp = tensor_to_f32(lp_t);
    double loss = 0;
    std::vector<float> dlogp;
    if (c.at("loss_type") == "sft") {
      loss = sft_loss(logp, {}, double(Tc), dlogp);
    } else {
      auto cfg = config_of(c);
      ASSERT_TRUE(cfg.ok()) << cfg.status().message();
      cfg->max_completion_length = L;
      auto adv = compute_advantages(rewards, B["group_size"].get<int>(),
                                    scale_rewards_from_string(c.at("scale_rewards").get<std::string>()).value());
      ASSERT_TRUE(adv.ok());
      GrpoLossInput in;
      in.seq_offsets = b.completion_offsets;
      in.logp = logp;
      in.advantages = *adv;
      if (c.at("use_old").get<bool>()) in.old_logp = old;
      in.ref_logp = ref;
      in.rollout_logp = roll;
      if (c.at("use_weights").get<bool>()) in.weights = wts;
      in.truncated = trunc;
      in.entropy = ent;
      Status st = grpo_loss_check(*cfg, in);
      ASSERT_TRUE(st.ok()) << st.message();
      GrpoLossNorm norm;
      norm.n_micro = c.at("n_micro").get<int>();
      if (!c.at("dapo_num_items").is_null()) norm.dapo_num_items = c["dapo_num_items"].get<double>();
      auto out = grpo_loss(*cfg, in, norm);
      loss = out.loss;
      dlogp = out.dlogp;
      const json& M = cs.at("metrics");
      EXPECT_NEAR(out.metrics.kl_mean(), M.at("kl").get<double>(), 1e-6 + 1e-4 * std::fabs(M["kl"].get<double>()));
      EXPECT_NEAR(out.metrics.entropy_mean(), M.at("entropy").get<double>(),
                  1e-5 + 1e-4 * std::fabs(M.at("entropy").get<double>()));  // BLAS kernels differ across CPUs
      EXPECT_NEAR(out.metrics.clip_low_frac(), M.at("clip_low").get<double>(), 1e-6);
      EXPECT_NEAR(out.metrics.clip_high_frac(), M.at("clip_high").get<double>(), 1e-6);
      EXPECT_NEAR(out.metrics.clip_region_frac(), M.at("clip_region").get<double>(), 1e-6);
      EXPECT_NEAR(out.metrics.roll_abs_max, M.at("rollout_max_abs_diff").get<double>(), 2e-5);
      EXPECT_NEAR(out.metrics.rollout_abs_diff_mean(), M.at("rollout_mean_abs_diff").get<double>(), 2e-5);
      EXPECT_NEAR(out.metrics.rollout_kl(), M.at("rollout_kl").get<double>(), 1e-5);
    }
    const double lref = scale * cs.at("loss").get<double>();
    EXPECT_NEAR(loss, lref, 1e-6 + 1e-4 * std::fabs(lref)) << "loss";
    std::vector<float> dref = floats(cs.at("dlogp"));
    for (float& x : dref) x = float(scale * x);
    expect_close(dlogp.data(), dref.data(), Tc, 1e-7, 1e-4, what + " dlogp");

    ModelWeights g = zero_grads(w.config);
    Tensor d = tensor_from_f32(Device::cpu, DType::f32, dlogp, {Tc});
    train_model_backward(ctx, m, w, b, d, g);
    const json& P = cs.at("params");
    for (const HfTensorSpec& s : specs) {
      ASSERT_TRUE(P.contains(s.name)) << s.name << " missing from the fixture";
      const json& ps = P[s.name];
      const Tensor v = arch_view(g, s);
      const float* gp = v.ptr<float>();
      const int64_t n = v.numel();
      const Stats st = stats_of(gp, n);
      const double nref = scale * ps.at("norm").get<double>();
      EXPECT_NEAR(st.norm, nref, 1e-4 * nref + 1e-9) << s.name << " gradient norm";
      EXPECT_NEAR(st.probe_dot, scale * ps.at("probe_dot").get<double>(),
                  1e-4 * scale * ps.at("probe_abs").get<double>() + 1e-9)
          << s.name << " gradient probe";
      for (const json& smp : ps.at("samples")) {
        const int64_t i = smp[0].get<int64_t>();
        const double r = scale * smp[1].get<double>();
        ASSERT_LT(i, n);
        EXPECT_NEAR(gp[i], r, 1e-4 * std::fabs(r) + 1e-5 * nref) << s.name << "[" << i << "]";
      }
    }
    if (name == "full" && std::filesystem::exists(dir + "/grads_full.safetensors")) {
      auto f = SafetensorsFile::open(dir + "/grads_full.safetensors");
      ASSERT_TRUE(f.ok()) << f.status().message();
      for (const HfTensorSpec& s : specs) {
        auto t = f->tensor_as(s.name, DType::f32);
        ASSERT_TRUE(t.ok()) << t.status().message();
        const Tensor v = arch_view(g, s);
        ASSERT_EQ(t->numel(), v.numel()) << s.name;
        std::vector<float> ref(size_t(v.numel()));  // the file's tensor may be a read-only mapping
        double mx = 0;
        for (int64_t i = 0; i < v.numel(); ++i) {
          ref[size_t(i)] = float(scale * t->ptr<float>()[i]);
          mx = std::max(mx, double(std::fabs(ref[size_t(i)])));
        }
        expect_close(v.ptr<float>(), ref.data(), v.numel(), 1e-5 * mx, 1e-4, what + " " + s.name);
      }
    }
    ++n_cases;
  }
  EXPECT_GE(n_cases + int(std::count(stale.begin(), stale.end(), ',')) + (stale.empty() ? 0 : 1), 20);
  if (!stale.empty())
    GTEST_SKIP() << arch << " cases " << stale << ": the fixture predates weighted token counts (no "
                 << "\"weights_in_counts\"); regenerate it with `" << kScript << "` on a machine with torch";
}

}  // namespace

TEST(GrpoFixtures, Llama) { run_arch("llama"); }
TEST(GrpoFixtures, Qwen2) { run_arch("qwen2"); }
TEST(GrpoFixtures, Qwen3) { run_arch("qwen3"); }
TEST(GrpoFixtures, Mistral) { run_arch("mistral"); }
// Sliding windows (4 and 5 tokens) shorter than the sequences: the loss gradients
// through the windowed attention backward. Skipped until generated.
TEST(GrpoFixtures, MistralSlidingWindow) {
  if (!std::filesystem::exists(fixture_dir("mistral_swa") + "/cases.json"))
    GTEST_SKIP() << "run `" << kScript << " --only mistral_swa,qwen2_swa` (torch + transformers) to create "
                 << fixture_dir("mistral_swa");
  run_arch("mistral_swa");
}
TEST(GrpoFixtures, Qwen2SlidingWindow) {
  if (!std::filesystem::exists(fixture_dir("qwen2_swa") + "/cases.json"))
    GTEST_SKIP() << "run `" << kScript << " --only mistral_swa,qwen2_swa` (torch + transformers) to create "
                 << fixture_dir("qwen2_swa");
  run_arch("qwen2_swa");
}

TEST(GrpoFixtures, FullGradientsPresent) {
  for (const char* a : {"llama", "qwen3"})
    EXPECT_TRUE(std::filesystem::exists(fixture_dir(a) + "/grads_full.safetensors"))
        << "missing " << fixture_dir(a) << "/grads_full.safetensors: run `" << kScript << "`";
}
