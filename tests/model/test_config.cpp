// config.json parsing against the published config.json of real models (as on
// the Hugging Face Hub), error messages, and the write-back.
#include <gtest/gtest.h>

#include "model/config.h"
#include "test_util.h"

using namespace grpo;
using nlohmann::json;

namespace {

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
  "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Llama-3.2-1B-Instruct (the base model has "eos_token_id": 128001).
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kLlama2_7B = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

ModelConfig parse(const char* s) {
  auto r = model_config_from_json(json::parse(s));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : ModelConfig{};
}

std::string parse_error(json j) {
  auto r = model_config_from_json(j);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

}  // namespace

TEST(Config, Qwen25) {
  ModelConfig c = parse(kQwen25_05B);
  EXPECT_EQ(c.arch, Arch::qwen2);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.n_layers, 24);
  EXPECT_EQ(c.n_heads, 14);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);  // qwen2 always has q/k/v bias
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window=false
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151643});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  // 494,032,768: see PresetsTest for the arithmetic.
  EXPECT_EQ(c.n_params(), 494032768);
}

TEST(Config, Qwen3) {
  ModelConfig c = parse(kQwen3_06B);
  EXPECT_EQ(c.arch, Arch::qwen3);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != 1024 / 16
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151645});
  EXPECT_EQ(c.n_params(), 596049920);
}

TEST(Config, Llama32WithLlama3RopeScaling) {
  ModelConfig c = parse(kLlama32_1B);
  EXPECT_EQ(c.arch, Arch::llama);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c.n_params(), 1235814400);
  // "type" (older spelling) and "linear" scaling
  json j = json::parse(kLlama32_1B);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig l = model_config_from_json(j).value();
  EXPECT_EQ(l.rope_scaling.type, "linear");
  EXPECT_FLOAT_EQ(l.rope_scaling.factor, 2.f);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(parse_error(j).find("\"yarn\" is not supported"), std::string::npos);
  // transformers 5 spelling: rope_parameters
  json k = json::parse(kLlama32_1B);
  k.erase("rope_theta");
  k["rope_parameters"] = k["rope_scaling"];
  k.erase("rope_scaling");
  k["rope_parameters"]["rope_theta"] = 500000.0;
  ModelConfig v5 = model_config_from_json(k).value();
  EXPECT_FLOAT_EQ(v5.rope_theta, 500000.f);
  EXPECT_EQ(v5.rope_scaling.type, "llama3");
}

TEST(Config, MistralSlidingWindow) {
  ModelConfig c = parse(kMistral7B);
  EXPECT_EQ(c.arch, Arch::mistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_window, std::vector<int>(32, 4096));  // mistral windows every layer
  EXPECT_EQ(c.attn_window(31), 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_params(), 7241732096);  // Mistral-7B-v0.1's published parameter count
  json j = json::parse(kMistral7B);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(model_config_from_json(j).value().sliding_window, 0);
  j["sliding_window"] = 32768;  // not smaller than the context: no window
  EXPECT_EQ(model_config_from_json(j).value().sliding_window, 0);
  EXPECT_TRUE(model_config_from_json(j).value().layer_window.empty());
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(model_config_from_json(j).value().sliding_window, 4096);
  j["sliding_window"] = 0;
  EXPECT_NE(parse_error(j).find("\"sliding_window\" must be positive or null"), std::string::npos);
  j["sliding_window"] = 24;
  j["layer_types"] = json::array();  // MistralConfig does not read layer_types: every layer windows
  for (int l = 0; l < 32; ++l) j["layer_types"].push_back("full_attention");
  EXPECT_EQ(model_config_from_json(j).value().layer_window, std::vector<int>(32, 24));
}

// Qwen2Config / Qwen3Config: sliding_window only with use_sliding_window; layers
// >= max_window_layers slide unless layer_types says which.
TEST(Config, QwenSlidingWindowLayers) {
  for (const char* src : {kQwen25_05B, kQwen3_06B}) {
    json j = json::parse(src);
    const int L = j["num_hidden_layers"].get<int>();
    j["use_sliding_window"] = true;
    j["sliding_window"] = 1024;
    j["max_window_layers"] = 20;
    ModelConfig c = model_config_from_json(j).value();
    EXPECT_EQ(c.sliding_window, 1024);
    ASSERT_EQ(int(c.layer_window.size()), L);
    for (int l = 0; l < L; ++l) EXPECT_EQ(c.attn_window(l), l >= 20 ? 1024 : 0) << "layer " << l;
    j.erase("max_window_layers");  // default 28: the 24- and 28-layer models have no sliding layer
    EXPECT_EQ(model_config_from_json(j).value().sliding_window, 0);
    j["max_window_layers"] = 0;
    j.erase("sliding_window");  // default 4096
    EXPECT_EQ(model_config_from_json(j).value().layer_window, std::vector<int>(size_t(L), 4096));
    // layer_types overrides max_window_layers
    j["layer_types"] = json::array();
    for (int l = 0; l < L; ++l) j["layer_types"].push_back(l % 2 ? "sliding_attention" : "full_attention");
    c = model_config_from_json(j).value();
    for (int l = 0; l < L; ++l) EXPECT_EQ(c.attn_window(l), l % 2 ? 4096 : 0) << "layer " << l;
    // a sliding layer without a window is an error in transformers too
    j["use_sliding_window"] = false;
    EXPECT_NE(parse_error(j).find("layer_types[1] is \"sliding_attention\" but the config has no window"),
              std::string::npos);
    j["use_sliding_window"] = true;
    j["layer_types"][3] = "chunked_attention";
    EXPECT_NE(parse_error(j).find("layer_types[3] = \"chunked_attention\" is not supported"), std::string::npos);
    j["layer_types"] = json::array({"full_attention"});
    EXPECT_NE(parse_error(j).find("\"layer_types\" must be a list of num_hidden_layers"), std::string::npos);
    // all-full layer_types: no window at all
    j["layer_types"] = json::array();
    for (int l = 0; l < L; ++l) j["layer_types"].push_back("full_attention");
    EXPECT_TRUE(model_config_from_json(j).value().layer_window.empty());
  }
}

TEST(Config, LlamaIgnoresSlidingWindowKeys) {  // LlamaConfig has no window
  json j = json::parse(kLlama32_1B);
  j["sliding_window"] = 16;
  j["use_sliding_window"] = true;
  j["layer_types"] = json::array({"sliding_attention"});
  ModelConfig c = model_config_from_json(j).value();
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.layer_window.empty());
  EXPECT_EQ(c.attn_window(3), 0);
}

TEST(Config, Llama2) {
  ModelConfig c = parse(kLlama2_7B);
  EXPECT_EQ(c.arch, Arch::llama);
  EXPECT_EQ(c.n_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);  // default
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_EQ(c.n_params(), 6738415616);  // Llama-2-7b's published parameter count
  json j = json::parse(kLlama2_7B);
  j.erase("num_key_value_heads");  // old configs: MHA
  EXPECT_EQ(model_config_from_json(j).value().n_kv_heads, 32);
}

TEST(Config, Errors) {
  json q = json::parse(kQwen25_05B);
  json j = q;
  j["model_type"] = "gpt2";
  std::string m = parse_error(j);
  EXPECT_NE(m.find("\"gpt2\""), std::string::npos) << m;
  EXPECT_NE(m.find("llama, qwen2, qwen3, mistral"), std::string::npos) << m;
  j = q;
  j.erase("hidden_size");
  EXPECT_NE(parse_error(j).find("\"hidden_size\" is missing"), std::string::npos);
  j = q;
  j["num_hidden_layers"] = "24";
  EXPECT_NE(parse_error(j).find("\"num_hidden_layers\" must be an integer"), std::string::npos);
  j = q;
  j["tie_word_embeddings"] = 1;
  EXPECT_NE(parse_error(j).find("\"tie_word_embeddings\" must be true or false"), std::string::npos);
  j = q;
  j["num_key_value_heads"] = 3;
  EXPECT_NE(parse_error(j).find("multiple of num_key_value_heads"), std::string::npos);
  j = q;
  j["vocab_size"] = 0;
  EXPECT_NE(parse_error(j).find("\"vocab_size\" must be positive"), std::string::npos);
  j = q;
  j["hidden_act"] = "gelu";
  EXPECT_NE(parse_error(j).find("hidden_act"), std::string::npos);
  j = q;
  j["eos_token_id"] = "x";
  EXPECT_NE(parse_error(j).find("eos_token_id"), std::string::npos);
  j = q;
  j.erase("model_type");
  EXPECT_NE(parse_error(j).find("model_type"), std::string::npos);
  EXPECT_NE(parse_error(json::array()).find("JSON object"), std::string::npos);
}

TEST(Config, LoadNamesTheFile) {
  TempDir tmp;
  json j = json::parse(kQwen25_05B);
  j["model_type"] = "gpt_neox";
  std::string p = tmp.write("config.json", j.dump());
  auto r = model_config_load(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(p), std::string::npos);
  EXPECT_NE(r.status().message().find("gpt_neox"), std::string::npos);
  std::string bad = tmp.write("bad.json", "{\"model_type\": \"qwen2\", ");
  auto r2 = model_config_load(bad);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("malformed JSON"), std::string::npos);
  EXPECT_NE(r2.status().message().find(bad), std::string::npos);
  auto r3 = model_config_load(tmp.path + "/none.json");
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("cannot open"), std::string::npos);
  EXPECT_TRUE(model_config_load(tmp.write("ok.json", kQwen3_06B)).ok());
}

TEST(Config, WriteBackKeepsRawAndUpdatesChanges) {
  for (const char* s : {kQwen25_05B, kQwen3_06B, kLlama32_1B, kMistral7B, kLlama2_7B}) {
    json orig = json::parse(s);
    ModelConfig c = parse(s);
    json back = model_config_to_json(c);
    // Unchanged config: every original key keeps its value (spelling included).
    for (auto it = orig.begin(); it != orig.end(); ++it) EXPECT_EQ(back[it.key()], it.value()) << it.key() << " in " << s;
    ModelConfig again = model_config_from_json(back).value();
    EXPECT_EQ(again.n_params(), c.n_params());
    EXPECT_EQ(again.rope_scaling.type, c.rope_scaling.type);
    EXPECT_EQ(again.eos_token_ids, c.eos_token_ids);
  }
  ModelConfig c = parse(kQwen25_05B);
  c.n_layers = 2;
  c.vocab_size = 1000;
  c.eos_token_ids = {5, 6};
  c.torch_dtype = "float32";
  json back = model_config_to_json(c);
  EXPECT_EQ(back["num_hidden_layers"], 2);
  EXPECT_EQ(back["vocab_size"], 1000);
  EXPECT_EQ(back["eos_token_id"], json::array({5, 6}));
  EXPECT_EQ(back["torch_dtype"], "float32");
  EXPECT_EQ(back["transformers_version"], "4.40.1");  // unknown keys survive
  EXPECT_EQ(back["rms_norm_eps"], 1e-06);
  // Built in code (no raw JSON): every field HF needs is written.
  ModelConfig fresh;
  fresh.arch = Arch::qwen3;
  fresh.model_type = "qwen3";
  fresh.vocab_size = 64; fresh.hidden_size = 32; fresh.intermediate_size = 64; fresh.n_layers = 1;
  fresh.n_heads = 2; fresh.n_kv_heads = 1; fresh.head_dim = 32; fresh.qk_norm = true;
  fresh.max_position_embeddings = 128;
  json fj = model_config_to_json(fresh);
  EXPECT_EQ(fj["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(fj["head_dim"], 32);
  EXPECT_EQ(fj["rms_norm_eps"], 1e-06);
  ModelConfig fr = model_config_from_json(fj).value();
  EXPECT_EQ(fr.n_params(), fresh.n_params());
}
