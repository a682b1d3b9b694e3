// model_save / model_load: HF names and the split of fused tensors (checked
// against the arena layout documented in weights.h, not through arch.cpp),
// round trips in every dtype and sharded, load errors, atomic replacement.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "model/checkpoint.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace grpo;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// C=8, 2 heads of D=4, 1 KV head, F=12, V=16, L=2; qwen2: q/k/v bias, tied.
json small_qwen2() {
  return {{"model_type", "qwen2"}, {"hidden_size", 8}, {"intermediate_size", 12}, {"num_hidden_layers", 2},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"vocab_size", 16},
          {"max_position_embeddings", 64}, {"tie_word_embeddings", true}, {"bos_token_id", 1}, {"eos_token_id", 2}};
}

ModelWeights counting_weights(const ModelConfig& cfg) {
  ModelWeights w = weights_allocate(cfg, Device::cpu, DType::f32);
  float* p = w.arena.ptr<float>();
  for (int64_t i = 0; i < w.arena.numel(); ++i) p[i] = float(i);  // exact in f32 below 2^24
  return w;
}

ModelWeights random_weights(const std::string& preset, uint64_t seed) {
  ModelConfig cfg = preset_config(preset).value();
  ModelWeights w = weights_allocate(cfg, Device::cpu, DType::f32);
  tensor_fill_zero(w.arena);
  weights_init_random(w, seed);
  return w;
}

void expect_same_params(ModelWeights& a, ModelWeights& b) {
  auto pa = a.params(), pb = b.params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].first, pb[i].first);
    ASSERT_EQ(pa[i].second->nbytes(), pb[i].second->nbytes());
    EXPECT_EQ(std::memcmp(pa[i].second->data, pb[i].second->data, pa[i].second->nbytes()), 0) << pa[i].first;
  }
}

std::string load_error(const std::string& dir) {
  auto r = model_load(dir, Device::cpu, DType::f32);
  EXPECT_FALSE(r.ok()) << dir << " loaded although it is broken";
  return r.ok() ? "" : r.status().message();
}

// Rewrites dir/model.safetensors through `edit` (which may drop or add items).
void rewrite_weights(const std::string& dir, const std::function<void(std::vector<SafetensorsWriteItem>&)>& edit) {
  auto sf = SafetensorsFile::open(dir + "/model.safetensors").value();
  std::vector<SafetensorsWriteItem> items;
  for (const auto& e : sf.entries()) items.push_back({e.name, sf.tensor(e.name).value(), e.dtype, {}});
  edit(items);
  ASSERT_TRUE(safetensors_write(dir + "/model.safetensors", items).ok());
}

}  // namespace

TEST(Checkpoint, SaveWritesHfNamesAndSplitsFusedTensors) {
  TempDir tmp;
  ModelConfig cfg = model_config_from_json(small_qwen2()).value();
  ModelWeights w = counting_weights(cfg);
  ASSERT_TRUE(model_save(tmp.path + "/ck", w, {.dtype = SaveDType::f32}).ok());
  auto sf = SafetensorsFile::open(tmp.path + "/ck/model.safetensors").value();
  std::set<std::string> names;
  for (const auto& e : sf.entries()) names.insert(e.name);
  std::set<std::string> want = {"model.embed_tokens.weight", "model.norm.weight"};  // tied: no lm_head.weight
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                          "self_attn.v_proj.bias", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      want.insert(p + s);
  }
  EXPECT_EQ(names, want);
  EXPECT_EQ(sf.metadata().at("format"), "pt");
  // weights.h: wqkv rows are q (Hq·D = 8), then k (4), then v (4); w_gate_up rows gate (12) then up (12).
  const int C = 8, Q = 8, KV = 4, F = 12;
  const LayerWeights& L1 = w.layers[1];
  auto at = [&](const char* name, int64_t i) { return sf.tensor(name).value().ptr<float>()[i]; };
  EXPECT_EQ(sf.find("model.layers.1.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{KV, C}));
  for (int i = 0; i < KV; ++i)
    for (int j = 0; j < C; ++j) {
      EXPECT_EQ(at("model.layers.1.self_attn.k_proj.weight", i * C + j), L1.wqkv.ptr<float>()[(Q + i) * C + j]);
      EXPECT_EQ(at("model.layers.1.self_attn.v_proj.weight", i * C + j), L1.wqkv.ptr<float>()[(Q + KV + i) * C + j]);
    }
  EXPECT_EQ(at("model.layers.1.self_attn.q_proj.weight", 13), L1.wqkv.ptr<float>()[13]);
  EXPECT_EQ(at("model.layers.1.self_attn.v_proj.bias", 3), L1.bqkv.ptr<float>()[Q + KV + 3]);
  EXPECT_EQ(at("model.layers.1.mlp.up_proj.weight", 5 * C + 7), L1.w_gate_up.ptr<float>()[(F + 5) * C + 7]);
  EXPECT_EQ(at("model.layers.1.mlp.gate_proj.weight", 5 * C + 7), L1.w_gate_up.ptr<float>()[5 * C + 7]);
  EXPECT_EQ(at("model.layers.0.mlp.down_proj.weight", 17), w.layers[0].w_down.ptr<float>()[17]);
  EXPECT_EQ(at("model.norm.weight", 7), w.final_norm.ptr<float>()[7]);
  // config.json carries the HF keys and the saved dtype.
  json cj = json::parse(read_file(tmp.path + "/ck/config.json").value());
  EXPECT_EQ(cj["torch_dtype"], "float32");
  EXPECT_EQ(cj["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(cj["num_key_value_heads"], 1);
}

TEST(Checkpoint, RoundTripEveryPresetAndDtype) {
  Context ctx(ContextOptions{.n_threads = 2});
  for (const char* preset : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    SCOPED_TRACE(preset);
    TempDir tmp;
    ModelWeights w = random_weights(preset, 7);
    ASSERT_TRUE(model_save(tmp.path, w, {.dtype = SaveDType::f32}).ok());
    auto r = model_load(tmp.path, Device::cpu, DType::f32, &ctx);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r.value().config.torch_dtype, "float32");
    EXPECT_EQ(r.value().config.n_params(), w.config.n_params());
    expect_same_params(w, r.value());
    // bf16 file -> f32 arena equals the bf16 rounding of the original.
    TempDir b;
    ASSERT_TRUE(model_save(b.path, w, {.dtype = SaveDType::bf16}).ok());
    auto rb = model_load(b.path, Device::cpu, DType::f32);
    ASSERT_TRUE(rb.ok()) << rb.status().message();
    EXPECT_EQ(rb.value().config.torch_dtype, "bfloat16");
    auto pa = w.params(), pb = rb.value().params();
    for (size_t i = 0; i < pa.size(); ++i)
      for (int64_t k = 0; k < pa[i].second->numel(); k += 7)
        ASSERT_EQ(pb[i].second->ptr<float>()[k], bf16_to_f32(f32_to_bf16(pa[i].second->ptr<float>()[k])))
            << pa[i].first << "[" << k << "]";
    // bf16 arena from the bf16 file, saved "as loaded", is byte-identical.
    auto rbb = model_load(b.path, Device::cpu, DType::bf16);
    ASSERT_TRUE(rbb.ok());
    TempDir c;
    ASSERT_TRUE(model_save(c.path, rbb.value(), {}).ok());
    EXPECT_EQ(read_file(c.path + "/model.safetensors").value(), read_file(b.path + "/model.safetensors").value());
    // f16 too.
    TempDir h;
    ASSERT_TRUE(model_save(h.path, w, {.dtype = SaveDType::f16}).ok());
    auto rh = model_load(h.path, Device::cpu, DType::f32);
    ASSERT_TRUE(rh.ok());
    EXPECT_EQ(rh.value().embed.ptr<float>()[3], f16_to_f32(f32_to_f16(w.embed.ptr<float>()[3])));
  }
}

TEST(Checkpoint, ShardedRoundTrip) {
  TempDir tmp;
  ModelWeights w = random_weights("tiny-llama", 3);
  ASSERT_TRUE(model_save(tmp.path, w, {.dtype = SaveDType::f32, .max_shard_bytes = 100000}).ok());
  EXPECT_FALSE(fs::exists(tmp.path + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(tmp.path + "/model.safetensors.index.json"));
  int n_shards = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) n_shards += e.path().extension() == ".safetensors";
  EXPECT_GE(n_shards, 3);
  auto r = model_load(tmp.path, Device::cpu, DType::f32);
  ASSERT_TRUE(r.ok()) << r.status().message();
  expect_same_params(w, r.value());
  // Saving unsharded over it removes the stale shards and index.
  ASSERT_TRUE(model_save(tmp.path, w, {.dtype = SaveDType::f32}).ok());
  EXPECT_FALSE(fs::exists(tmp.path + "/model.safetensors.index.json"));
  n_shards = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) n_shards += e.path().extension() == ".safetensors";
  EXPECT_EQ(n_shards, 1);
  EXPECT_TRUE(model_load(tmp.path, Device::cpu, DType::f32).ok());
}

TEST(Checkpoint, LoadErrorsNameTensorFileAndFix) {
  TempDir tmp;
  ModelWeights w = random_weights("tiny-qwen2", 1);
  const std::string dir = tmp.path + "/m";
  ASSERT_TRUE(model_save(dir, w, {.dtype = SaveDType::bf16}).ok());
  const std::string good_cfg = read_file(dir + "/config.json").value();

  // Missing tensor.
  rewrite_weights(dir, [](auto& items) { std::erase_if(items, [](auto& it) { return it.name == "model.layers.1.mlp.up_proj.weight"; }); });
  std::string m = load_error(dir);
  EXPECT_NE(m.find("\"model.layers.1.mlp.up_proj.weight\" with shape [128, 64] is missing"), std::string::npos) << m;
  EXPECT_NE(m.find("does not match its config.json"), std::string::npos) << m;

  // Shape mismatch with config.json.
  ASSERT_TRUE(model_save(dir, w, {.dtype = SaveDType::bf16}).ok());
  json cj = json::parse(good_cfg);
  cj["intermediate_size"] = 96;
  tmp.write("m/config.json", cj.dump());
  m = load_error(dir);
  EXPECT_NE(m.find("\"model.layers.0.mlp.gate_proj.weight\" in " + dir + "/model.safetensors has shape [128, 64] but "
                   "config.json implies [96, 64]"),
            std::string::npos)
      << m;

  // Untied config without lm_head.weight.
  cj = json::parse(good_cfg);
  cj["tie_word_embeddings"] = false;
  tmp.write("m/config.json", cj.dump());
  m = load_error(dir);
  EXPECT_NE(m.find("\"lm_head.weight\""), std::string::npos) << m;
  EXPECT_NE(m.find("tie_word_embeddings=false"), std::string::npos) << m;

  // Unknown model_type and malformed config.json.
  cj = json::parse(good_cfg);
  cj["model_type"] = "phi3";
  tmp.write("m/config.json", cj.dump());
  m = load_error(dir);
  EXPECT_NE(m.find("phi3"), std::string::npos);
  EXPECT_NE(m.find(dir + "/config.json"), std::string::npos) << m;
  tmp.write("m/config.json", "{");
  EXPECT_NE(load_error(dir).find("malformed JSON"), std::string::npos);
  tmp.write("m/config.json", good_cfg);
  ASSERT_TRUE(model_load(dir, Device::cpu, DType::f32).ok());

  // Tied model with an lm_head.weight present and an unknown extra tensor: loaded, extras ignored.
  std::vector<float> extra(4, 1.f);
  rewrite_weights(dir, [&](auto& items) {
    items.push_back({"lm_head.weight", items[0].src, items[0].dtype, {}});
    items.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", tensor_borrow(extra.data(), DType::f32, Device::cpu, {4}), DType::f32, {}});
    items.push_back({"model.visual.proj", tensor_borrow(extra.data(), DType::f32, Device::cpu, {4}), DType::f32, {}});
  });
  ASSERT_TRUE(model_load(dir, Device::cpu, DType::f32).ok());

  // Integer weights.
  std::vector<int32_t> ints(64, 1);
  rewrite_weights(dir, [&](auto& items) {
    for (auto& it : items)
      if (it.name == "model.norm.weight") it = {it.name, tensor_borrow(ints.data(), DType::i32, Device::cpu, {64}), DType::i32, {}};
  });
  m = load_error(dir);
  EXPECT_NE(m.find("\"model.norm.weight\""), std::string::npos) << m;
  EXPECT_NE(m.find("has dtype I32"), std::string::npos) << m;

  // Truncated weights file.
  ASSERT_TRUE(model_save(dir, w, {.dtype = SaveDType::bf16}).ok());
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  m = load_error(dir);
  EXPECT_NE(m.find(dir + "/model.safetensors"), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;

  // Not a model directory.
  TempDir empty;
  EXPECT_NE(load_error(empty.path).find("config.json"), std::string::npos);
}

TEST(Checkpoint, AtomicReplaceKeepsUnrelatedFilesAndSurvivesFailure) {
  TempDir tmp;
  const std::string dir = tmp.path + "/ck";
  ModelWeights a = random_weights("tiny-qwen3", 1), b = random_weights("tiny-qwen3", 2);
  ASSERT_TRUE(model_save(dir, a, {.dtype = SaveDType::f32}).ok());
  tmp.write("ck/trainer_state.json", "{\"step\": 5}");
  fs::create_directories(dir + "/optim");
  tmp.write("ck/optim/adam.bin", "xyz");

  // A save that fails (missing tokenizer source) leaves the previous checkpoint intact.
  SaveOptions bad{.dtype = SaveDType::f32, .tokenizer_src_dir = tmp.path + "/no_such_tokenizer"};
  Status s = model_save(dir, b, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no_such_tokenizer"), std::string::npos) << s.message();
  auto r = model_load(dir, Device::cpu, DType::f32);
  ASSERT_TRUE(r.ok()) << r.status().message();
  expect_same_params(a, r.value());
  for (const auto& e : fs::directory_iterator(tmp.path)) EXPECT_EQ(e.path().filename(), "ck");  // no temp dirs left

  // A good save replaces the weights, keeps unrelated files, copies tokenizer files.
  TempDir tok;
  tok.write("tokenizer.json", "{\"model\": {}}");
  tok.write("merges.txt", "#version: 0.2\n");
  tok.write("unrelated.txt", "not copied");
  ASSERT_TRUE(model_save(dir, b, {.dtype = SaveDType::f32, .tokenizer_src_dir = tok.path}).ok());
  r = model_load(dir, Device::cpu, DType::f32);
  ASSERT_TRUE(r.ok());
  expect_same_params(b, r.value());
  EXPECT_EQ(read_file(dir + "/trainer_state.json").value(), "{\"step\": 5}");
  EXPECT_EQ(read_file(dir + "/optim/adam.bin").value(), "xyz");
  EXPECT_EQ(read_file(dir + "/tokenizer.json").value(), "{\"model\": {}}");
  EXPECT_TRUE(fs::exists(dir + "/merges.txt"));
  EXPECT_FALSE(fs::exists(dir + "/unrelated.txt"));
  for (const auto& e : fs::directory_iterator(tmp.path)) EXPECT_EQ(e.path().filename(), "ck");
  // Extra files and a trailing slash in the path.
  ASSERT_TRUE(model_save(dir + "/", b, {.extra_files = {{"note.txt", "hi"}}}).ok());
  EXPECT_EQ(read_file(dir + "/note.txt").value(), "hi");
  for (const auto& e : fs::directory_iterator(tmp.path)) EXPECT_EQ(e.path().filename(), "ck");
}

// model_read_into: a kept arena (filled with junk first) gets exactly the file's
// values, whatever the chunking and thread count; the expected values are the
// counting weights rounded by f32_to_bf16 element by element, not the reader.
TEST(Checkpoint, ReadIntoKeptArenaSmallChunksManyThreads) {
  TempDir tmp;
  ModelConfig cfg = model_config_from_json(small_qwen2()).value();
  ModelWeights w = counting_weights(cfg);
  for (int64_t i = 0; i < w.arena.numel(); ++i) w.arena.ptr<float>()[i] *= 0.37f;  // values bf16 must round
  ASSERT_TRUE(model_save(tmp.path, w, {.dtype = SaveDType::bf16}).ok());
  for (DType dt : {DType::bf16, DType::f32})
    for (auto [threads, chunk] : {std::pair{1, size_t(1) << 20}, {3, size_t(6)}, {8, size_t(34)}}) {
      ModelWeights host = weights_allocate(cfg, Device::cpu, dt);
      std::memset(host.arena.data, 0xAB, host.arena.nbytes());
      auto r = model_read_into(tmp.path, host, threads, chunk);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(r.value().torch_dtype, "bfloat16");
      auto pw = w.params(), ph = host.params();
      ASSERT_EQ(pw.size(), ph.size());
      for (size_t k = 0; k < pw.size(); ++k) {
        const float* src = pw[k].second->ptr<float>();
        for (int64_t i = 0; i < pw[k].second->numel(); ++i) {
          const uint16_t want = f32_to_bf16(src[i]);
          if (dt == DType::bf16)
            ASSERT_EQ(ph[k].second->ptr<uint16_t>()[i], want) << pw[k].first << "[" << i << "] chunk " << chunk;
          else
            ASSERT_EQ(ph[k].second->ptr<float>()[i], bf16_to_f32(want)) << pw[k].first << "[" << i << "]";
        }
      }
    }
}

TEST(Checkpoint, ReadIntoRefusesOtherShapesNamingTheTensor) {
  TempDir tmp;
  ModelConfig cfg = model_config_from_json(small_qwen2()).value();
  ASSERT_TRUE(model_save(tmp.path, counting_weights(cfg), {.dtype = SaveDType::f32}).ok());
  json other = small_qwen2();
  other["intermediate_size"] = 16;
  ModelWeights host = weights_allocate(model_config_from_json(other).value(), Device::cpu, DType::f32);
  auto r = model_read_into(tmp.path, host, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mlp"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("has shape"), std::string::npos) << r.status().message();
  ModelWeights dev_like;  // not allocated
  EXPECT_FALSE(model_read_into(tmp.path, dev_like, 1).ok());
}
