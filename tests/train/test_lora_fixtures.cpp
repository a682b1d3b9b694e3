// LoRA against PyTorch + peft (tests/fixtures/lora, written by
// tools/ref/make_lora_fixtures.py on the GPU machine): we read peft's adapter
// files for a transformers-saved base, and the completion logprobs (with and
// without the adapter) and every lora_A / lora_B gradient of Σ coef·logp match.
// Writing: the adapter saved back by lora_save holds the same tensors under the
// same names and an adapter_config.json with peft's fields. CPU, fp32. Skips
// (naming the command) while the fixtures are absent.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
const char* kScript = "python3 tools/ref/make_lora_fixtures.py --out tests/fixtures/lora";
std::string fixture_dir(const std::string& v) { return std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/lora/" + v; }

void check_variant(const std::string& variant) {
  const std::string dir = fixture_dir(variant);
  if (!std::filesystem::exists(dir + "/case.json"))
    GTEST_SKIP() << "missing fixture " << dir << "/case.json: run `" << kScript
                 << "` (on a machine with torch + transformers + peft)";
  auto j = nlohmann::json::parse(read_file(dir + "/case.json").value());
  ASSERT_EQ(j["format"], "lora-fixture");
  ASSERT_EQ(j["version"], 1);
  Context ctx;
  auto w = model_load(dir + "/base", Device::cpu, DType::f32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const ModelConfig& c = w.value().config;
  auto lr = lora_load(dir + "/adapter", c, Device::cpu, DType::f32);
  ASSERT_TRUE(lr.ok()) << lr.status().message();
  LoraWeights& lw = lr.value();
  EXPECT_EQ(lw.cfg.targets.size(), 7u);

  std::vector<std::vector<int32_t>> seqs = j["sequences"].get<std::vector<std::vector<int32_t>>>();
  std::vector<int32_t> pl = j["prompt_lens"].get<std::vector<int32_t>>();
  auto b = train_batch_build(ctx, seqs, pl, c.vocab_size);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const std::vector<float> coef = j["coef"].get<std::vector<float>>();
  const std::vector<float> ref_logp = j["logp"].get<std::vector<float>>();
  const std::vector<float> ref_base = j["logp_base"].get<std::vector<float>>();
  ASSERT_EQ(int(ref_logp.size()), b.value().n_completion);

  TrainModel plain;
  Tensor lp = tensor_empty(Device::cpu, DType::f32, {b.value().n_completion});
  train_model_forward(ctx, plain, w.value(), b.value(), lp, nullptr, false);
  expect_close(lp.ptr<float>(), ref_base.data(), lp.numel(), 2e-5, 2e-5, variant + " logp without the adapter");

  TrainModel m;
  LoraWeights g = lora_allocate(c, lw.cfg, Device::cpu, DType::f32);
  m.lora = &lw;
  m.lora_grads = &g;
  train_model_forward(ctx, m, w.value(), b.value(), lp, nullptr, true);
  expect_close(lp.ptr<float>(), ref_logp.data(), lp.numel(), 2e-5, 2e-5, variant + " logp with the adapter");
  Tensor d = tensor_from_f32(Device::cpu, DType::f32, coef, {int64_t(coef.size())});
  ModelWeights unused;
  train_model_backward(ctx, m, w.value(), b.value(), d, unused);

  auto gf = SafetensorsFile::open(dir + "/grads.safetensors");
  ASSERT_TRUE(gf.ok()) << gf.status().message();
  int n_checked = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (auto t : lw.cfg.targets)
      for (bool is_b : {false, true}) {
        const std::string name = lora_peft_name(c, l, t, is_b);
        auto ref = gf.value().tensor_as(name, DType::f32);
        ASSERT_TRUE(ref.ok()) << ref.status().message();
        const LoraPair& p = g.layers[size_t(l)][size_t(t)];
        const std::vector<float> got = tensor_to_f32(is_b ? p.B : p.A);
        ASSERT_EQ(int64_t(got.size()), ref.value().numel()) << name;
        double scale = 0;
        for (int64_t i = 0; i < ref.value().numel(); ++i)
          scale = std::max(scale, double(std::fabs(ref.value().ptr<float>()[i])));
        expect_close(got.data(), ref.value().ptr<float>(), int64_t(got.size()), 1e-5 + 1e-4 * scale, 1e-4, name);
        ++n_checked;
      }
  EXPECT_EQ(n_checked, 2 * 7 * c.n_layers);

  // Writing: what we save is what peft saved (names, shapes, values) plus peft's config fields.
  const std::string out = (std::filesystem::temp_directory_path() / ("grpo_lora_fx_" + variant)).string();
  std::filesystem::remove_all(out);
  ASSERT_TRUE(lora_save(out, lw).ok());
  auto theirs = SafetensorsFile::open(dir + "/adapter/adapter_model.safetensors");
  auto ours = SafetensorsFile::open(out + "/adapter_model.safetensors");
  ASSERT_TRUE(theirs.ok() && ours.ok());
  ASSERT_EQ(theirs.value().entries().size(), ours.value().entries().size());
  for (const auto& e : theirs.value().entries()) {
    auto a = theirs.value().tensor_as(e.name, DType::f32);
    auto o = ours.value().tensor_as(e.name, DType::f32);
    ASSERT_TRUE(o.ok()) << "our adapter lacks " << e.name;
    EXPECT_EQ(tensor_to_f32(a.value()), tensor_to_f32(o.value())) << e.name;
  }
  auto jt = nlohmann::json::parse(read_file(dir + "/adapter/adapter_config.json").value());
  auto jo = nlohmann::json::parse(read_file(out + "/adapter_config.json").value());
  for (const char* k : {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "use_rslora",
                        "fan_in_fan_out", "use_dora"})
    if (jt.contains(k)) EXPECT_EQ(jo[k], jt[k]) << "adapter_config.json field " << k;
  std::filesystem::remove_all(out);
}
}  // namespace

TEST(LoraFixture, Llama) { check_variant("llama"); }
TEST(LoraFixture, Qwen2TiedBias) { check_variant("qwen2"); }
TEST(LoraFixture, Qwen3QkNormRslora) { check_variant("qwen3"); }
