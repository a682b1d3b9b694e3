// Presets and `grpo init-model`: tiny models written and reloaded, the init
// statistics transformers uses, determinism, and the real-size shapes' parameter
// counts (checked by hand arithmetic, not by writing 1 GB files).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "model/checkpoint.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace grpo;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
ModelWeights init_and_load(const InitModelOptions& o) {
  Status s = init_model_write(o);
  EXPECT_TRUE(s.ok()) << s.message();
  auto r = model_load(o.out_dir, Device::cpu, DType::f32);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : ModelWeights{};
}
}  // namespace

TEST(Presets, TinyPresetsWriteLoadableModels) {
  // Hand counts, C=64, L=2, Hq=4, Hkv=2, D=16, F=128, V=512:
  //   per layer: norms 2·64 + wqkv (4+2+2)·16·64 = 8192 + wo 64·64 = 4096 + gate/up 2·128·64 = 16384
  //   + down 64·128 = 8192 -> 36,992; embed 512·64 = 32,768; final norm 64.
  //   tiny-llama / tiny-mistral (untied): 2·36,992 + 32,768 + 64 + 32,768 = 139,584
  //   tiny-qwen2 (tied, q/k/v bias 128 per layer): 2·37,120 + 32,768 + 64 = 107,072
  //   tiny-qwen3 (tied, q_norm + k_norm 32 per layer): 2·37,024 + 32,768 + 64 = 106,880
  const std::map<std::string, int64_t> n_params = {
      {"tiny-llama", 139584}, {"tiny-qwen2", 107072}, {"tiny-qwen3", 106880}, {"tiny-mistral", 139584}};
  for (const auto& [preset, want] : n_params) {
    SCOPED_TRACE(preset);
    TempDir tmp;
    ModelWeights w = init_and_load({.preset = preset, .out_dir = tmp.path, .seed = 5, .dtype = DType::f32});
    const ModelConfig& c = w.config;
    EXPECT_EQ(c.model_type, preset.substr(5));
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.intermediate_size, 128);
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.n_params(), want);
    EXPECT_EQ(c.torch_dtype, "float32");
    EXPECT_FALSE(fs::exists(tmp.path + "/tokenizer.json"));  // tiny presets: only when asked
    // transformers' init: norms 1, biases 0, weights N(0, 0.02).
    auto all = [](const Tensor& t, float v) {
      for (int64_t i = 0; i < t.numel(); ++i)
        if (t.ptr<float>()[i] != v) return false;
      return true;
    };
    for (const auto& L : w.layers) {
      EXPECT_TRUE(all(L.attn_norm, 1.f));
      EXPECT_TRUE(all(L.mlp_norm, 1.f));
      if (c.qk_norm) EXPECT_TRUE(all(L.q_norm, 1.f) && all(L.k_norm, 1.f));
      if (c.attention_bias) EXPECT_TRUE(all(L.bqkv, 0.f));
    }
    EXPECT_TRUE(all(w.final_norm, 1.f));
    double s = 0, s2 = 0;
    const int64_t n = w.embed.numel();
    for (int64_t i = 0; i < n; ++i) {
      double v = w.embed.ptr<float>()[i];
      s += v;
      s2 += v * v;
    }
    double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
    EXPECT_LT(std::fabs(mean), 0.001);  // 5 standard errors (0.02/sqrt(32768) = 1.1e-4) would be 0.00055
    EXPECT_NEAR(sd, 0.02, 0.0005);
    const Tensor& gu = w.layers[1].w_gate_up;
    double g2 = 0;
    for (int64_t i = 0; i < gu.numel(); ++i) g2 += double(gu.ptr<float>()[i]) * gu.ptr<float>()[i];
    EXPECT_NEAR(std::sqrt(g2 / gu.numel()), 0.02, 0.0007);
  }
}

TEST(Presets, DeterministicAcrossRunsThreadsAndDtype) {
  TempDir a, b, c, d;
  ASSERT_TRUE(init_model_write({.preset = "tiny-qwen2", .out_dir = a.path, .seed = 11, .dtype = DType::f32}).ok());
  Context ctx(ContextOptions{.n_threads = 2});
  ASSERT_TRUE(init_model_write({.preset = "tiny-qwen2", .out_dir = b.path, .seed = 11, .dtype = DType::f32}, &ctx).ok());
  ASSERT_TRUE(init_model_write({.preset = "tiny-qwen2", .out_dir = c.path, .seed = 12, .dtype = DType::f32}).ok());
  ASSERT_TRUE(init_model_write({.preset = "tiny-qwen2", .out_dir = d.path, .seed = 11, .dtype = DType::bf16}).ok());
  std::string fa = read_file(a.path + "/model.safetensors").value();
  EXPECT_EQ(fa, read_file(b.path + "/model.safetensors").value());
  EXPECT_NE(fa, read_file(c.path + "/model.safetensors").value());
  // bf16 model = the f32 model rounded.
  auto sa = SafetensorsFile::open(a.path + "/model.safetensors").value();
  auto sd = SafetensorsFile::open(d.path + "/model.safetensors").value();
  const char* name = "model.layers.0.mlp.down_proj.weight";
  Tensor ta = sa.tensor(name).value(), td = sd.tensor(name).value();
  ASSERT_EQ(td.dtype, DType::bf16);
  for (int64_t i = 0; i < ta.numel(); ++i) ASSERT_EQ(td.ptr<uint16_t>()[i], f32_to_bf16(ta.ptr<float>()[i]));
  EXPECT_EQ(json::parse(read_file(d.path + "/config.json").value())["torch_dtype"], "bfloat16");
}

TEST(Presets, RealShapes) {
  // Parameter counts from the shapes (tied embeddings counted once):
  // Qwen2.5-0.5B: V=151936, C=896, F=4864, L=24, Hq=14, Hkv=2, D=64, q/k/v bias.
  //   layer = 896 + 1152·896 + 1152 + 896·896 + 896 + 2·4864·896 + 896·4864 = 14,912,384
  //   24·14,912,384 + 151936·896 + 896 = 357,897,216 + 136,134,656 + 896 = 494,032,768
  // Qwen2.5-1.5B: C=1536, F=8960, L=28, Hq=12, Hkv=2, D=128.
  //   layer = 1536 + 2048·1536 + 2048 + 1536·1536 + 1536 + 2·8960·1536 + 1536·8960 = 46,797,824
  //   28·46,797,824 + 151936·1536 + 1536 = 1,310,339,072 + 233,373,696 + 1536 = 1,543,714,304
  // Qwen3-0.6B: C=1024, F=3072, L=28, Hq=16, Hkv=8, D=128, q_norm/k_norm, no bias.
  //   layer = 1024 + 4096·1024 + 2·128 + 1024·2048 + 1024 + 2·3072·1024 + 1024·3072 = 15,730,944
  //   28·15,730,944 + 151936·1024 + 1024 = 440,466,432 + 155,582,464 + 1024 = 596,049,920
  // Llama-3.2-1B: V=128256, C=2048, F=8192, L=16, Hq=32, Hkv=8, D=64.
  //   layer = 2048 + 3072·2048 + 2048·2048 + 2048 + 2·8192·2048 + 2048·8192 = 60,821,504
  //   16·60,821,504 + 128256·2048 + 2048 = 973,144,064 + 262,668,288 + 2048 = 1,235,814,400
  auto q05 = preset_config("qwen2.5-0.5b").value();
  EXPECT_EQ(q05.n_params(), 494032768);
  EXPECT_EQ(q05.head_dim, 64);
  EXPECT_TRUE(q05.attention_bias && q05.tie_word_embeddings);
  EXPECT_FLOAT_EQ(q05.rope_theta, 1e6f);
  EXPECT_EQ(preset_config("qwen2.5-1.5b").value().n_params(), 1543714304);
  auto q3 = preset_config("qwen3-0.6b").value();
  EXPECT_EQ(q3.n_params(), 596049920);
  EXPECT_EQ(q3.max_position_embeddings, 40960);
  EXPECT_TRUE(q3.qk_norm);
  auto l = preset_config("llama-3.2-1b").value();
  EXPECT_EQ(l.n_params(), 1235814400);
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(l.rope_scaling.factor, 32.f);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l.max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(l.rms_norm_eps, 1e-5f);
  EXPECT_EQ(l.bos_token_id, 128000);
  // The config.json written for it has the keys transformers' LlamaConfig reads.
  json j = model_config_to_json(l);
  for (const char* k : {"architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rope_theta",
                        "rope_scaling", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "torch_dtype"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(preset_tokenizer_subdir("qwen3-0.6b"), "qwen2");
  EXPECT_EQ(preset_tokenizer_subdir("llama-3.2-1b"), "");
  auto bad = preset_config("gpt-5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tiny-llama"), std::string::npos);
}

TEST(Presets, Overrides) {
  auto c = preset_config("qwen2.5-0.5b", {.vocab_size = 1000, .n_layers = 1, .hidden_size = 112}).value();
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.n_layers, 1);
  EXPECT_EQ(c.hidden_size, 112);
  EXPECT_EQ(c.head_dim, 8);  // 112 / 14
  auto q3 = preset_config("tiny-qwen3", {.hidden_size = 32}).value();
  EXPECT_EQ(q3.head_dim, 16);  // explicit head_dim is kept for qwen3
  EXPECT_FALSE(preset_config("tiny-llama", {.hidden_size = 30}).ok());  // 30 / 4 heads gives an odd head_dim
}

TEST(Presets, TinyWithQwenTokenizerTakesItsVocabulary) {
  const std::string tok = std::string(GRPO_SHARED_DIR) + "/data/tokenizers/qwen2";
  if (!fs::exists(tok + "/tokenizer.json")) GTEST_SKIP() << "no shared qwen2 tokenizer";
  TempDir tmp;
  ASSERT_TRUE(init_model_write({.preset = "tiny-qwen2", .out_dir = tmp.path, .dtype = DType::bf16, .tokenizer_dir = tok}).ok());
  json cj = json::parse(read_file(tmp.path + "/config.json").value());
  // vocab.json has ids 0..151642 and the added tokens end at <|im_end|> = 151645.
  EXPECT_EQ(cj["vocab_size"], 151646);
  EXPECT_EQ(cj["eos_token_id"], 151645);  // tokenizer_config.json eos_token <|im_end|>
  EXPECT_TRUE(cj["bos_token_id"].is_null());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"})
    EXPECT_EQ(fs::file_size(tmp.path + "/" + f), fs::file_size(tok + "/" + f)) << f;
  // An explicit vocab_size smaller than the tokenizer is rejected.
  Status s = init_model_write({.preset = "tiny-llama", .out_dir = tmp.path + "/x", .tokenizer_dir = tok,
                               .overrides = {.vocab_size = 1000}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("151646 tokens"), std::string::npos) << s.message();
}

TEST(Presets, Cli) {
  TempDir tmp;
  std::string cmd = std::string(GRPO_BINARY_PATH) + " init-model --preset tiny-mistral --out " + tmp.path +
                    "/cli --seed 9 --dtype f32 > " + tmp.path + "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp.path + "/log.txt").value();
  ASSERT_TRUE(init_model_write({.preset = "tiny-mistral", .out_dir = tmp.path + "/lib", .seed = 9, .dtype = DType::f32}).ok());
  EXPECT_EQ(read_file(tmp.path + "/cli/model.safetensors").value(), read_file(tmp.path + "/lib/model.safetensors").value());
  std::string bad = std::string(GRPO_BINARY_PATH) + " init-model --preset nope --out " + tmp.path + "/n 2> " +
                    tmp.path + "/err.txt";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(read_file(tmp.path + "/err.txt").value().find("unknown preset \"nope\""), std::string::npos);
}
