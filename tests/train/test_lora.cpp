// LoRA on the CPU: adapter gradients against finite differences (every target,
// every architecture variant), adapted logprobs equal the merged weights', the
// frozen base gets no gradient, PEFT's initialisation, the column-range ops
// against plain loops, the PEFT files round trip and their error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "kernels/columns.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "train/lora_setup.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
const std::vector<std::pair<int, int>> kLens = {{3, 7}, {1, 4}, {5, 6}};

LoraConfig all_targets(int r, float alpha) {
  LoraConfig lc;
  lc.enabled = true;
  lc.r = r;
  lc.alpha = alpha;
  return lc;
}

// Adapters with A and B both random (B ≠ 0, unlike PEFT's initialisation, so that
// A's gradient and the adapter's output are not zero).
LoraWeights random_lora(const ModelConfig& c, const LoraConfig& lc, uint32_t seed) {
  LoraWeights lw = lora_allocate(c, lc, Device::cpu, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& [name, t] : lw.params()) {
    const float sd = 0.5f / std::sqrt(float(t->dim(-1)));
    for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = sd * nd(rng);
  }
  return lw;
}

double weighted_logp(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                     const std::vector<float>& coef) {
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, nullptr, false);
  double s = 0;
  for (int t = 0; t < b.n_completion; ++t) s += double(coef[size_t(t)]) * lp.ptr<float>()[t];
  return s;
}

std::vector<float> logp_of(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b) {
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, nullptr, false);
  return tensor_to_f32(lp);
}

void lora_fd_check(const ModelConfig& c, const LoraConfig& lc, bool recompute) {
  Context ctx;
  ModelWeights w = random_weights(c, 11);
  LoraWeights lw = random_lora(c, lc, 7);
  TrainBatch b = random_batch(ctx, c, kLens, 5);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> coef(size_t(b.n_completion));
  for (auto& x : coef) x = nd(rng);

  TrainModelOptions o;
  o.recompute = recompute;
  TrainModel m(o);
  LoraWeights g = lora_allocate(c, lc, Device::cpu, DType::f32);
  m.lora = &lw;
  m.lora_grads = &g;
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, nullptr, true);
  Tensor d = tensor_from_f32(Device::cpu, DType::f32, coef, {int64_t(coef.size())});
  ModelWeights unbound;  // frozen base: backward must not touch it
  const std::vector<float> base_before = tensor_to_f32(w.arena);
  train_model_backward(ctx, m, w, b, d, unbound);
  EXPECT_EQ(tensor_to_f32(w.arena), base_before);

  TrainModel probe;
  probe.lora = &lw;
  auto gp = g.params();
  auto wp = lw.params();
  ASSERT_EQ(gp.size(), wp.size());
  ASSERT_EQ(wp.size(), size_t(2 * c.n_layers) * lc.targets.size());
  for (size_t i = 0; i < wp.size(); ++i) {
    Tensor& wt = *wp[i].second;
    double gmax = 0;
    for (int64_t j = 0; j < gp[i].second->numel(); ++j)
      gmax = std::max(gmax, double(std::fabs(gp[i].second->ptr<float>()[j])));
    EXPECT_GT(gmax, 0.0) << wp[i].first << " got no gradient";
    std::uniform_int_distribution<int64_t> pick(0, wt.numel() - 1);
    for (int k = 0; k < 3; ++k) {
      const int64_t j = pick(rng);
      float* p = wt.ptr<float>() + j;
      const float orig = *p, h = 2e-3f;
      auto f_at = [&](float x) {
        *p = x;
        return weighted_logp(ctx, probe, w, b, coef);
      };
      const double fd = (-f_at(orig + 2 * h) + 8 * f_at(orig + h) - 8 * f_at(orig - h) + f_at(orig - 2 * h)) / (12.0 * h);
      *p = orig;
      const double an = gp[i].second->ptr<float>()[j];
      EXPECT_NEAR(an, fd, 2e-3 * std::fabs(fd) + 2e-3 * gmax + 1e-4) << wp[i].first << "[" << j << "]";
    }
  }
}
}  // namespace

class LoraGrad : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(LoraGrad, FiniteDifferencesAllTargets) {
  auto [tied, bias, qk] = GetParam();
  lora_fd_check(tiny_config(tied, bias, qk), all_targets(3, 6.f), false);
}

INSTANTIATE_TEST_SUITE_P(Variants, LoraGrad,
                         ::testing::Values(std::make_tuple(false, false, false), std::make_tuple(true, true, false),
                                           std::make_tuple(true, false, true)));

TEST(Lora, FiniteDifferencesSomeTargetsRsloraRecompute) {
  LoraConfig lc = all_targets(2, 5.f);
  lc.use_rslora = true;
  lc.targets = {LoraTarget::k, LoraTarget::o, LoraTarget::up};
  lora_fd_check(tiny_config(false, true, false), lc, true);
}

TEST(Lora, ScalingFollowsPeft) {
  LoraConfig lc = all_targets(16, 32.f);
  EXPECT_FLOAT_EQ(lc.scaling(), 2.f);
  lc.use_rslora = true;
  EXPECT_FLOAT_EQ(lc.scaling(), 8.f);
}

// The adapted model's logprobs equal those of base + scaling·B·A merged into the weights.
TEST(Lora, UnmergedEqualsMerged) {
  Context ctx;
  for (bool qk : {false, true}) {
    ModelConfig c = tiny_config(false, true, qk);
    ModelWeights w = random_weights(c, 4);
    LoraConfig lc = all_targets(4, 8.f);
    LoraWeights lw = random_lora(c, lc, 9);
    TrainBatch b = random_batch(ctx, c, kLens, 3);
    TrainModel m;
    m.lora = &lw;
    const auto unmerged = logp_of(ctx, m, w, b);
    TrainModel plain;
    const auto base = logp_of(ctx, plain, w, b);
    lora_merge_into(w, lw);
    const auto merged = logp_of(ctx, plain, w, b);
    expect_close(unmerged.data(), merged.data(), int64_t(merged.size()), 1e-5, 1e-5, "unmerged vs merged");
    double moved = 0;
    for (size_t i = 0; i < base.size(); ++i) moved = std::max(moved, double(std::fabs(base[i] - merged[i])));
    EXPECT_GT(moved, 1e-3) << "the adapters should change the logprobs";
  }
}

TEST(Lora, PeftInitialisation) {
  ModelConfig c = tiny_config(false, false, false);
  LoraWeights lw = lora_allocate(c, all_targets(8, 16.f), Device::cpu, DType::f32);
  lora_init(lw, 1);
  for (int l = 0; l < c.n_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      const LoraPair& p = lw.pair(l, LoraTarget(t));
      const double bound = 1.0 / std::sqrt(double(p.A.shape[1]));  // kaiming_uniform_(a=√5): 1/√fan_in
      double amax = 0, asum2 = 0;
      for (float a : tensor_to_f32(p.A)) {
        amax = std::max(amax, double(std::fabs(a)));
        asum2 += double(a) * a;
      }
      EXPECT_LE(amax, bound);
      // U(−b, b) has variance b²/3; with 8·in ≥ 128 samples the estimate is within ±40 %.
      const double var = asum2 / double(p.A.numel());
      EXPECT_NEAR(var, bound * bound / 3, 0.4 * bound * bound / 3);
      for (float x : tensor_to_f32(p.B)) EXPECT_EQ(x, 0.f);
    }
  LoraWeights again = lora_allocate(c, all_targets(8, 16.f), Device::cpu, DType::f32);
  lora_init(again, 1);
  EXPECT_EQ(tensor_to_f32(again.arena), tensor_to_f32(lw.arena));
}

TEST(Lora, ColumnsOpsMatchLoops) {
  Context ctx;
  const int64_t M = 3, N = 7, n = 3, col0 = 2;
  std::vector<float> wide(size_t(M * N)), narrow(size_t(M * n));
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = float(i) * 0.5f;
  for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = float(i) + 1.f;
  Tensor W = tensor_from_f32(Device::cpu, DType::f32, wide, {M, N});
  Tensor S = tensor_from_f32(Device::cpu, DType::f32, narrow, {M, n});
  columns_add(ctx, W, S, col0, 2.f);
  const auto got = tensor_to_f32(W);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < N; ++j) {
      const bool in = j >= col0 && j < col0 + n;
      EXPECT_EQ(got[size_t(r * N + j)], wide[size_t(r * N + j)] + (in ? 2.f * narrow[size_t(r * n + j - col0)] : 0.f));
    }
  Tensor D = tensor_empty(Device::cpu, DType::f32, {M, n});
  columns_copy(ctx, D, W, col0, -1.f);
  const auto cp = tensor_to_f32(D);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(cp[size_t(r * n + j)], -got[size_t(r * N + col0 + j)]);
}

TEST(Lora, TargetNames) {
  EXPECT_EQ(lora_target_parse("q").value(), LoraTarget::q);
  EXPECT_EQ(lora_target_parse("gate_proj").value(), LoraTarget::gate);
  auto bad = lora_target_parse("qkv");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q_proj"), std::string::npos);
  LoraConfig lc = all_targets(0, 1.f);
  EXPECT_FALSE(lc.validate().ok());
  lc = all_targets(4, 8.f);
  lc.targets = {LoraTarget::q, LoraTarget::q};
  EXPECT_FALSE(lc.validate().ok());
}

namespace {
std::string tmp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("grpo_lora_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}
}  // namespace

TEST(Lora, PeftFilesRoundTrip) {
  ModelConfig c = tiny_config(false, true, false);  // qwen2
  LoraConfig lc = all_targets(4, 8.f);
  lc.targets = {LoraTarget::q, LoraTarget::v, LoraTarget::down};
  lc.base_model = "Qwen/Qwen2.5-0.5B";
  LoraWeights lw = random_lora(c, lc, 5);
  const std::string dir = tmp_dir("roundtrip");
  ASSERT_TRUE(lora_save(dir, lw).ok());

  auto j = nlohmann::json::parse(read_file(dir + "/adapter_config.json").value());
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["base_model_name_or_path"], "Qwen/Qwen2.5-0.5B");
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));

  auto f = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const SafetensorsEntry* e = f.value().find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{c.kv_dim(), 4}));
  e = f.value().find("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{4, c.intermediate_size}));
  EXPECT_EQ(f.value().entries().size(), size_t(2 * 3 * c.n_layers));

  auto back = lora_load(dir, c, Device::cpu, DType::f32);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value().cfg.r, 4);
  EXPECT_EQ(back.value().cfg.targets, lc.targets);
  EXPECT_EQ(tensor_to_f32(back.value().arena), tensor_to_f32(lw.arena));
  std::filesystem::remove_all(dir);
}

// An adapter file loaded into an existing slot's buffers (hot swap): same pointers,
// new values; a different r or scaling is refused and leaves the slot unchanged.
TEST(Lora, LoadIntoExistingSlotInPlace) {
  ModelConfig c = tiny_config(false, true, false);
  LoraConfig lc = all_targets(4, 8.f);
  LoraWeights slot = random_lora(c, lc, 1), next = random_lora(c, lc, 2);
  const void* where = slot.arena.data;
  const std::string dir = tmp_dir("swap");
  ASSERT_TRUE(lora_save(dir, next).ok());
  Status st = lora_load_into(slot, dir);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(slot.arena.data, where);
  EXPECT_EQ(tensor_to_f32(slot.arena), tensor_to_f32(next.arena));

  const std::vector<float> before = tensor_to_f32(slot.arena);
  LoraWeights other_r = random_lora(c, all_targets(2, 4.f), 3);
  ASSERT_TRUE(lora_save(dir, other_r).ok());
  st = lora_load_into(slot, dir);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("new slot"), std::string::npos) << st.message();
  LoraWeights other_alpha = random_lora(c, all_targets(4, 32.f), 4);
  ASSERT_TRUE(lora_save(dir, other_alpha).ok());
  st = lora_load_into(slot, dir);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("scaling"), std::string::npos) << st.message();
  EXPECT_EQ(tensor_to_f32(slot.arena), before);
  std::filesystem::remove_all(dir);
}

// lora.init_from: the adapter read must agree with [lora]; a mismatch names the key to change.
TEST(Lora, InitFromChecksTheConfig) {
  ModelConfig c = tiny_config(false, false, false);
  ModelWeights w = random_weights(c, 1);
  LoraSection sec;
  sec.enabled = true;
  sec.r = 4;
  sec.alpha = 8;
  sec.target_modules = {"q", "v_proj"};
  auto lc = lora_config_from(sec, "base");
  ASSERT_TRUE(lc.ok()) << lc.status().message();
  LoraWeights src = random_lora(c, lc.value(), 6);
  const std::string dir = tmp_dir("init_from");
  ASSERT_TRUE(lora_save(dir, src).ok());
  auto got = lora_adapters_from(w, lc.value(), dir);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(tensor_to_f32(got.value()->arena), tensor_to_f32(src.arena));
  sec.alpha = 16;
  auto bad = lora_adapters_from(w, lora_config_from(sec, "base").value(), dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lora.alpha"), std::string::npos) << bad.status().message();
  sec.alpha = 8;
  sec.target_modules = {"q"};
  bad = lora_adapters_from(w, lora_config_from(sec, "base").value(), dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lora.target_modules"), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
}

TEST(Lora, LoadErrorsNameTheProblem) {
  ModelConfig c = tiny_config(false, false, false);
  LoraConfig lc = all_targets(2, 4.f);
  lc.targets = {LoraTarget::q};
  LoraWeights lw = random_lora(c, lc, 5);
  const std::string dir = tmp_dir("errors");
  ASSERT_TRUE(lora_save(dir, lw).ok());
  auto edit = [&](auto fn) {
    auto j = nlohmann::json::parse(read_file(dir + "/adapter_config.json").value());
    fn(j);
    std::ofstream(dir + "/adapter_config.json") << j.dump();
  };
  auto expect_err = [&](const std::string& needle) {
    auto r = lora_load(dir, c, Device::cpu, DType::f32);
    ASSERT_FALSE(r.ok()) << "expected an error about " << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  edit([](auto& j) { j["use_dora"] = true; });
  expect_err("DoRA");
  edit([](auto& j) { j["use_dora"] = false; j["target_modules"] = {"q_proj", "k_proj"}; });
  expect_err("k_proj.lora_A.weight is missing");
  edit([](auto& j) { j["target_modules"] = {"lm_head"}; });
  expect_err("unknown LoRA target module 'lm_head'");
  edit([](auto& j) { j["target_modules"] = {"q_proj"}; j["r"] = 3; });
  expect_err("expected [3, 16]");
  edit([](auto& j) { j["r"] = 2; j["peft_type"] = "IA3"; });
  expect_err("only LORA");
  std::filesystem::remove_all(dir);
  auto missing = lora_load(dir, c, Device::cpu, DType::f32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("adapter_config.json"), std::string::npos);
}

// CUDA (skips without a device): LoRA training forward/backward on the qwen3 GRPO
// fixture model in f32 and bf16 against the CPU reference (logp and every adapter gradient).
TEST(LoraCuda, TrainForwardBackwardMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/grpo/qwen3";
  auto hw = model_load(dir, Device::cpu, DType::f32);
  ASSERT_TRUE(hw.ok()) << hw.status().message();
  const ModelConfig& c = hw.value().config;
  const LoraWeights ha = random_lora(c, all_targets(8, 16.f), 3);
  Context cpu;
  const std::vector<std::pair<int, int>> lens = {{5, 17}, {3, 9}, {8, 20}};
  TrainBatch hb = random_batch(cpu, c, lens, 4);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> pl;
  for (const auto& s : hb.seqs) {
    seqs.emplace_back(hb.tokens_host.begin() + s.start, hb.tokens_host.begin() + s.start + s.total_len);
    pl.push_back(s.prompt_len);
  }
  std::vector<float> coef(size_t(hb.n_completion));
  for (size_t t = 0; t < coef.size(); ++t) coef[t] = std::sin(0.37f * float(t) + 0.1f);

  auto run = [&](Context& ctx, const ModelWeights& w, const LoraWeights& a, std::vector<float>* lp,
                 std::vector<float>* grads) {
    auto b = train_batch_build(ctx, seqs, pl, c.vocab_size);
    ASSERT_TRUE(b.ok());
    TrainModel m;
    LoraWeights g = lora_allocate(c, a.cfg, ctx.device(), DType::f32);
    m.lora = &a;
    m.lora_grads = &g;
    Tensor t = tensor_empty(ctx.device(), DType::f32, {b->n_completion});
    train_model_forward(ctx, m, w, *b, t, nullptr, true);
    Tensor d = tensor_from_f32(ctx.device(), DType::f32, coef, {int64_t(coef.size())});
    ModelWeights unused;
    train_model_backward(ctx, m, w, *b, d, unused);
    ctx.synchronize();
    *lp = tensor_to_f32(t);
    *grads = tensor_to_f32(g.arena);
  };
  std::vector<float> ref_lp, ref_g;
  run(cpu, hw.value(), ha, &ref_lp, &ref_g);
  double gmax = 0;
  for (float x : ref_g) gmax = std::max(gmax, double(std::fabs(x)));
  for (DType dt : {DType::f32, DType::bf16}) {
    ContextOptions co;
    co.device = Device::cuda;
    Context gpu(co);
    ModelWeights w = weights_allocate(c, Device::cuda, dt);
    tensor_copy_convert(w.arena, hw.value().arena);
    LoraWeights a = lora_allocate(c, ha.cfg, Device::cuda, dt);
    tensor_copy_convert(a.arena, ha.arena);
    std::vector<float> lp, g;
    run(gpu, w, a, &lp, &g);
    const bool f32 = dt == DType::f32;
    expect_close(lp.data(), ref_lp.data(), int64_t(lp.size()), f32 ? 1e-4 : 0.1, f32 ? 1e-4 : 0.05,
                 std::string("logp ") + dtype_name(dt));
    expect_close(g.data(), ref_g.data(), int64_t(g.size()), (f32 ? 1e-4 : 0.05) * gmax, f32 ? 1e-3 : 0.1,
                 std::string("adapter grads ") + dtype_name(dt));
  }
}
