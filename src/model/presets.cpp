// Presets and random initialisation. Real shapes are those of the published
// config.json files (Qwen2.5-0.5B/1.5B and Qwen3-0.6B as in
// shared/peers/hf_grpo_step.py ARCHS; Llama-3.2-1B from its model card config).
#include "model/presets.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace grpo {

using nlohmann::json;

namespace {

json qwen2_base() {
  return {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"hidden_act", "silu"},
          {"attention_dropout", 0.0}, {"initializer_range", 0.02}, {"use_cache", true},
          {"use_sliding_window", false}, {"rope_scaling", nullptr}};
}

json preset_json(const std::string& n) {
  if (n == "qwen2.5-0.5b" || n == "qwen2.5-1.5b") {
    json j = qwen2_base();
    bool small = n == "qwen2.5-0.5b";
    j.update({{"hidden_size", small ? 896 : 1536}, {"intermediate_size", small ? 4864 : 8960},
              {"num_hidden_layers", small ? 24 : 28}, {"max_window_layers", small ? 24 : 28},
              {"num_attention_heads", small ? 14 : 12}, {"num_key_value_heads", 2}, {"vocab_size", 151936},
              {"max_position_embeddings", 32768}, {"sliding_window", 32768}, {"rope_theta", 1000000.0},
              {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}, {"bos_token_id", 151643},
              {"eos_token_id", 151643}});
    return j;
  }
  if (n == "qwen3-0.6b") {
    return {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"attention_dropout", 0.0}, {"initializer_range", 0.02}, {"use_cache", true},
            {"hidden_size", 1024}, {"intermediate_size", 3072}, {"num_hidden_layers", 28}, {"max_window_layers", 28},
            {"num_attention_heads", 16}, {"num_key_value_heads", 8}, {"head_dim", 128}, {"vocab_size", 151936},
            {"max_position_embeddings", 40960}, {"rope_theta", 1000000.0}, {"rope_scaling", nullptr},
            {"rms_norm_eps", 1e-6}, {"sliding_window", nullptr}, {"use_sliding_window", false},
            {"tie_word_embeddings", true}, {"bos_token_id", 151643}, {"eos_token_id", 151645}};
  }
  if (n == "llama-3.2-1b") {
    return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"attention_dropout", 0.0}, {"mlp_bias", false}, {"pretraining_tp", 1},
            {"initializer_range", 0.02}, {"use_cache", true}, {"hidden_size", 2048}, {"intermediate_size", 8192},
            {"num_hidden_layers", 16}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 64},
            {"vocab_size", 128256}, {"max_position_embeddings", 131072}, {"rope_theta", 500000.0},
            {"rope_scaling",
             {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}}},
            {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true}, {"bos_token_id", 128000}, {"eos_token_id", 128001}};
  }
  // The 8B shapes of the ZeRO-1 memory table (docs/distributed.md): Qwen3-8B's and
  // Llama-3.1-8B's published config.json values.
  if (n == "qwen3-8b") {
    return {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"attention_dropout", 0.0}, {"initializer_range", 0.02}, {"use_cache", true},
            {"hidden_size", 4096}, {"intermediate_size", 12288}, {"num_hidden_layers", 36}, {"max_window_layers", 36},
            {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 128}, {"vocab_size", 151936},
            {"max_position_embeddings", 40960}, {"rope_theta", 1000000.0}, {"rope_scaling", nullptr},
            {"rms_norm_eps", 1e-6}, {"sliding_window", nullptr}, {"use_sliding_window", false},
            {"tie_word_embeddings", false}, {"bos_token_id", 151643}, {"eos_token_id", 151645}};
  }
  if (n == "llama-3.1-8b") {
    return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"attention_dropout", 0.0}, {"mlp_bias", false}, {"pretraining_tp", 1},
            {"initializer_range", 0.02}, {"use_cache", true}, {"hidden_size", 4096}, {"intermediate_size", 14336},
            {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
            {"vocab_size", 128256}, {"max_position_embeddings", 131072}, {"rope_theta", 500000.0},
            {"rope_scaling",
             {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}}},
            {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"bos_token_id", 128000}, {"eos_token_id", 128001}};
  }
  // Tiny test models: C=64, L=2, 4 heads of 16, 2 KV heads, F=128, V=512. Each
  // exercises its architecture's distinguishing feature (bias, qk-norm, untied
  // head, llama3 rope scaling, sliding_window key).
  json t = {{"hidden_act", "silu"}, {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 512},
            {"max_position_embeddings", 2048}, {"initializer_range", 0.02}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"use_cache", true}};
  if (n == "tiny-llama") {
    t.update({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"attention_bias", false},
              {"mlp_bias", false}, {"head_dim", 16}, {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0},
              {"rope_scaling",
               {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                {"original_max_position_embeddings", 8192}}},
              {"tie_word_embeddings", false}});
    return t;
  }
  if (n == "tiny-qwen2") {
    json q = qwen2_base();
    q.update(t);
    q.update({{"tie_word_embeddings", true}, {"sliding_window", 2048}, {"max_window_layers", 2}});
    return q;
  }
  if (n == "tiny-qwen3") {
    t.update({{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"attention_bias", false},
              {"head_dim", 16}, {"tie_word_embeddings", true}, {"sliding_window", nullptr},
              {"use_sliding_window", false}, {"rope_scaling", nullptr}});
    return t;
  }
  if (n == "tiny-mistral") {
    t.update({{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}, {"sliding_window", nullptr},
              {"tie_word_embeddings", false}, {"rms_norm_eps", 1e-5}});
    return t;
  }
  return nullptr;
}

// xoshiro256** seeded through splitmix64: small, fast, reproducible everywhere.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& v : s) v = splitmix64(seed);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

constexpr int64_t kChunk = 1 << 16;  // elements per independently seeded RNG stream

// Marsaglia's polar method: two N(0, stddev) values per accepted draw, no trigonometry.
void fill_normal(float* out, int64_t n, float stddev, uint64_t seed) {
  Rng rng(seed);
  for (int64_t i = 0; i < n; i += 2) {
    double u, v, s;
    do {
      u = 2.0 * rng.uniform() - 1.0;
      v = 2.0 * rng.uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = std::sqrt(-2.0 * std::log(s) / s) * stddev;
    out[i] = float(u * f);
    if (i + 1 < n) out[i + 1] = float(v * f);
  }
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-0.6b",
          "llama-3.2-1b", "qwen3-8b", "llama-3.1-8b"};
}

std::string preset_tokenizer_subdir(const std::string& name) { return name.rfind("qwen", 0) == 0 ? "qwen2" : ""; }

Result<ModelConfig> preset_config(const std::string& name, const PresetOverrides& ov) {
  json j = preset_json(name);
  if (j.is_null()) {
    std::string list;
    for (const auto& p : preset_names()) list += (list.empty() ? "" : ", ") + p;
    return error_status("unknown preset \"" + name + "\" (presets: " + list + ")");
  }
  if (ov.vocab_size > 0) {  // special token ids beyond a shrunken vocabulary are dropped
    j["vocab_size"] = ov.vocab_size;
    for (const char* k : {"bos_token_id", "eos_token_id"})
      if (j.contains(k) && j[k].is_number_integer() && j[k].get<int>() >= ov.vocab_size) j[k] = nullptr;
  }
  if (ov.n_layers > 0) {
    j["num_hidden_layers"] = ov.n_layers;
    if (j.contains("max_window_layers")) j["max_window_layers"] = ov.n_layers;
  }
  if (ov.hidden_size > 0) {
    j["hidden_size"] = ov.hidden_size;
    if (j["model_type"] != "qwen3") j.erase("head_dim");
  }
  if (ov.n_heads > 0) {
    j["num_attention_heads"] = ov.n_heads;
    j.erase("head_dim");
  }
  if (ov.n_kv_heads > 0) j["num_key_value_heads"] = ov.n_kv_heads;
  if (ov.intermediate_size > 0) j["intermediate_size"] = ov.intermediate_size;
  auto r = model_config_from_json(j);
  if (!r.ok()) return r.status().with_context("preset " + name);
  return r;
}

void weights_init_random(ModelWeights& w, uint64_t seed, Context* ctx) {
  GRPO_CHECK_MSG(w.arena.on_cpu(), "weights_init_random fills host arenas; copy to the device afterwards");
  auto params = w.params();
  const float stddev = w.config.initializer_range;
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string& name = params[k].first;
    Tensor& t = *params[k].second;
    const int64_t n = t.numel();
    const bool norm = name.size() >= 4 && name.compare(name.size() - 4, 4, "norm") == 0;
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bqkv") == 0;
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
    auto body = [&](int64_t c0, int64_t c1) {
      std::vector<float> buf(static_cast<size_t>(kChunk));
      for (int64_t c = c0; c < c1; ++c) {
        int64_t b = c * kChunk, m = std::min(kChunk, n - b);
        if (norm || bias) std::fill(buf.begin(), buf.begin() + m, norm ? 1.f : 0.f);
        else fill_normal(buf.data(), m, stddev, seed ^ (uint64_t(k) << 40) ^ uint64_t(c) * 0x2545f4914f6cdd1dull);
        char* dst = static_cast<char*>(t.data) + size_t(b) * dtype_size(t.dtype);
        if (t.dtype == DType::bf16)
          for (int64_t i = 0; i < m; ++i) reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(buf[size_t(i)]);
        else
          convert_host(dst, t.dtype, buf.data(), DType::f32, size_t(m));
      }
    };
    if (ctx && n_chunks > 1) ctx->parallel_for(n_chunks, body);
    else body(0, n_chunks);
  }
}

Result<TokenizerInfo> tokenizer_info(const std::string& dir) {
  TokenizerInfo info;
  GRPO_ASSIGN_OR_RETURN(std::string text, read_file(dir + "/tokenizer.json"));
  json tj = json::parse(text, nullptr, false);
  if (tj.is_discarded() || !tj.is_object()) return error_status(dir + "/tokenizer.json: malformed JSON");
  std::map<std::string, int> ids;
  if (tj.contains("model") && tj["model"].is_object() && tj["model"].contains("vocab") && tj["model"]["vocab"].is_object())
    for (auto it = tj["model"]["vocab"].begin(); it != tj["model"]["vocab"].end(); ++it)
      if (it->is_number_integer()) ids[it.key()] = it->get<int>();
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array())
    for (const auto& a : tj["added_tokens"])
      if (a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
          a["content"].is_string())
        ids[a["content"].get<std::string>()] = a["id"].get<int>();
  for (const auto& [s, id] : ids) info.n_tokens = std::max(info.n_tokens, id + 1);
  if (info.n_tokens == 0) return error_status(dir + "/tokenizer.json: no vocabulary found");
  auto cfg = read_file(dir + "/tokenizer_config.json");
  if (cfg.ok()) {
    json c = json::parse(cfg.value(), nullptr, false);
    auto lookup = [&](const char* key) -> int {
      if (c.is_discarded() || !c.contains(key)) return -1;
      const json& v = c[key];
      std::string s;
      if (v.is_string()) s = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) s = v["content"].get<std::string>();
      auto it = ids.find(s);
      return it == ids.end() ? -1 : it->second;
    };
    info.bos_id = lookup("bos_token");
    info.eos_id = lookup("eos_token");
  }
  return info;
}

Status init_model_write(const InitModelOptions& opt, Context* ctx) {
  if (opt.dtype != DType::bf16 && opt.dtype != DType::f32)
    return error_status("init-model: --dtype must be bf16 or f32");
  GRPO_ASSIGN_OR_RETURN(ModelConfig cfg, preset_config(opt.preset, opt.overrides));
  if (!opt.tokenizer_dir.empty()) {
    GRPO_ASSIGN_OR_RETURN(TokenizerInfo tok, tokenizer_info(opt.tokenizer_dir));
    if (opt.preset.rfind("tiny-", 0) == 0) {
      if (opt.overrides.vocab_size == 0) cfg.vocab_size = tok.n_tokens;
      cfg.bos_token_id = tok.bos_id;  // -1: the tokenizer has no BOS (Qwen)
      cfg.eos_token_ids.clear();
      if (tok.eos_id >= 0) cfg.eos_token_ids = {tok.eos_id};
    }
    if (tok.n_tokens > cfg.vocab_size)
      return error_status("tokenizer in " + opt.tokenizer_dir + " has " + std::to_string(tok.n_tokens) +
                          " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size) +
                          "; pass a larger --vocab-size or another tokenizer");
    GRPO_TRY(cfg.validate());
  }
  cfg.torch_dtype = opt.dtype == DType::bf16 ? "bfloat16" : "float32";
  ModelWeights w = weights_allocate(cfg, Device::cpu, opt.dtype);
  tensor_fill_zero(w.arena);
  weights_init_random(w, opt.seed, ctx);
  SaveOptions so;
  so.dtype = opt.dtype == DType::bf16 ? SaveDType::bf16 : SaveDType::f32;
  so.tokenizer_src_dir = opt.tokenizer_dir;
  return model_save(opt.out_dir, w, so);
}

}  // namespace grpo

namespace grpo {
ModelWeights weights_random(const ModelConfig& cfg, Device dev, DType dt, uint64_t seed, Context* ctx) {
  ModelWeights host = weights_allocate(cfg, Device::cpu, dt);
  weights_init_random(host, seed, ctx);
  if (dev == Device::cpu) return host;
  ModelWeights w = weights_allocate(cfg, dev, dt);
  tensor_copy(w.arena, host.arena);
  return w;
}
}  // namespace grpo
