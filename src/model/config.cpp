// config.json -> ModelConfig and back. Field names and defaults follow the
// transformers configuration classes of each architecture (LlamaConfig,
// Qwen2Config, Qwen3Config, MistralConfig). transformers 5 moved rope_theta
// and rope_scaling into "rope_parameters"; both spellings are read.
#include "model/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace grpo {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
    case Arch::mistral: return "mistral";
  }
  return "?";
}

namespace {

const char* kSupported = "llama, qwen2, qwen3, mistral";

// Reads an optional integer field; absent or null leaves *out unchanged.
Status get_int(const json& j, const char* key, int* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return error_status(std::string("required field \"") + key + "\" is missing");
    return ok_status();
  }
  if (it->is_number_integer() || it->is_number_unsigned()) {
    int64_t v = it->get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return error_status(std::string("field \"") + key + "\" is out of range");
    *out = int(v);
    return ok_status();
  }
  if (it->is_number_float()) {  // 1.0e3-style integers written by some tools
    double d = it->get<double>();
    if (d == std::floor(d) && std::fabs(d) < 2e9) {
      *out = int(d);
      return ok_status();
    }
  }
  return error_status(std::string("field \"") + key + "\" must be an integer, got " + it->dump());
}

Status get_float(const json& j, const char* key, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_number()) return error_status(std::string("field \"") + key + "\" must be a number, got " + it->dump());
  *out = float(it->get<double>());
  return ok_status();
}

Status get_bool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_boolean()) return error_status(std::string("field \"") + key + "\" must be true or false, got " + it->dump());
  *out = it->get<bool>();
  return ok_status();
}

Status parse_rope_scaling(const json& rs, RopeScaling* out) {
  if (rs.is_null()) return ok_status();
  if (!rs.is_object()) return error_status("field \"rope_scaling\" must be an object or null, got " + rs.dump());
  std::string type;
  for (const char* k : {"rope_type", "type"}) {
    auto it = rs.find(k);
    if (it != rs.end() && it->is_string()) { type = it->get<std::string>(); break; }
  }
  if (type.empty() || type == "default") return ok_status();
  if (type != "llama3" && type != "linear")
    return error_status("rope_scaling type \"" + type + "\" is not supported (supported: default, linear, llama3)");
  out->type = type;
  GRPO_TRY(get_float(rs, "factor", &out->factor));
  if (!(out->factor > 0)) return error_status("rope_scaling.factor must be positive");
  if (type == "llama3") {
    GRPO_TRY(get_float(rs, "low_freq_factor", &out->low_freq_factor));
    GRPO_TRY(get_float(rs, "high_freq_factor", &out->high_freq_factor));
    GRPO_TRY(get_int(rs, "original_max_position_embeddings", &out->original_max_position_embeddings, true)
                 .with_context("rope_scaling"));
  }
  return ok_status();
}

// Shortest decimal of a float, as a double: 1e-6f is written "1e-06", not 9.99999997e-07.
double float_nice(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  *r.ptr = 0;
  return std::strtod(buf, nullptr);
}


// Per-layer windows following the transformers config classes: MistralConfig
// (sliding_window default 4096, every layer; layer_types not read), Qwen2Config /
// Qwen3Config (sliding_window default 4096, kept only with use_sliding_window;
// layer_types, else "sliding_attention" for layers >= max_window_layers, default 28).
// LlamaConfig has no window. Needs n_layers and max_position_embeddings parsed.
Status parse_sliding_window(const json& j, ModelConfig* c) {
  c->sliding_window = 0;
  c->layer_window.clear();
  if (c->arch == Arch::llama) return ok_status();
  int sw = 4096;
  bool have_sw = true;
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_null()) have_sw = false;
  else GRPO_TRY(get_int(j, "sliding_window", &sw, false));
  if (have_sw && sw <= 0)
    return error_status("field \"sliding_window\" must be positive or null, got " + std::to_string(sw));
  std::vector<bool> sliding(size_t(std::max(c->n_layers, 0)), false);
  if (c->arch == Arch::mistral) {
    std::fill(sliding.begin(), sliding.end(), have_sw);
  } else {
    bool use_sw = false;
    GRPO_TRY(get_bool(j, "use_sliding_window", &use_sw));
    if (!use_sw) have_sw = false;
    auto lt = j.find("layer_types");
    if (lt != j.end() && !lt->is_null()) {
      if (!lt->is_array() || int(lt->size()) != c->n_layers)
        return error_status("field \"layer_types\" must be a list of num_hidden_layers (" +
                            std::to_string(c->n_layers) + ") strings, got " + lt->dump());
      for (int l = 0; l < c->n_layers; ++l) {
        const json& e = (*lt)[size_t(l)];
        if (e == "sliding_attention") sliding[size_t(l)] = true;
        else if (e != "full_attention")
          return error_status("layer_types[" + std::to_string(l) + "] = " + e.dump() +
                              " is not supported (supported: \"full_attention\", \"sliding_attention\")");
      }
      for (int l = 0; l < c->n_layers; ++l)
        if (sliding[size_t(l)] && !have_sw)
          return error_status("layer_types[" + std::to_string(l) +
                              "] is \"sliding_attention\" but the config has no window (use_sliding_window is false "
                              "or sliding_window is null); set both, or mark the layer \"full_attention\"");
    } else if (have_sw) {
      int max_window_layers = 28;
      GRPO_TRY(get_int(j, "max_window_layers", &max_window_layers, false));
      for (int l = 0; l < c->n_layers; ++l) sliding[size_t(l)] = l >= max_window_layers;
    }
  }
  // Positions stay below max_position_embeddings, so a window that long masks nothing.
  if (!have_sw || sw >= c->max_position_embeddings) return ok_status();
  bool any = false;
  for (bool b : sliding) any = any || b;
  if (!any) return ok_status();
  c->sliding_window = sw;
  for (bool b : sliding) c->layer_window.push_back(b ? sw : 0);
  return ok_status();
}

}  // namespace

Result<ModelConfig> model_config_from_json(const json& j) {
  if (!j.is_object()) return error_status("config.json must hold a JSON object");
  ModelConfig c;
  c.raw = j;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return error_status("required field \"model_type\" is missing or not a string");
  c.model_type = mt->get<std::string>();
  if (c.model_type == "llama") c.arch = Arch::llama;
  else if (c.model_type == "qwen2") c.arch = Arch::qwen2;
  else if (c.model_type == "qwen3") c.arch = Arch::qwen3;
  else if (c.model_type == "mistral") c.arch = Arch::mistral;
  else
    return error_status("model_type \"" + c.model_type + "\" is not supported (supported: " + kSupported + ")");

  GRPO_TRY(get_int(j, "vocab_size", &c.vocab_size, true));
  GRPO_TRY(get_int(j, "hidden_size", &c.hidden_size, true));
  GRPO_TRY(get_int(j, "intermediate_size", &c.intermediate_size, true));
  GRPO_TRY(get_int(j, "num_hidden_layers", &c.n_layers, true));
  GRPO_TRY(get_int(j, "num_attention_heads", &c.n_heads, true));
  c.n_kv_heads = c.n_heads;  // HF: num_key_value_heads=None means multi-head attention
  GRPO_TRY(get_int(j, "num_key_value_heads", &c.n_kv_heads, false));
  c.head_dim = 0;
  GRPO_TRY(get_int(j, "head_dim", &c.head_dim, false));
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.hidden_size / c.n_heads;

  // Architecture defaults of the transformers config classes.
  c.max_position_embeddings = c.arch == Arch::llama ? 2048 : c.arch == Arch::mistral ? 4096 * 32 : 32768;
  GRPO_TRY(get_int(j, "max_position_embeddings", &c.max_position_embeddings, false));
  c.rms_norm_eps = 1e-6f;
  GRPO_TRY(get_float(j, "rms_norm_eps", &c.rms_norm_eps));
  GRPO_TRY(get_float(j, "initializer_range", &c.initializer_range));
  GRPO_TRY(get_bool(j, "tie_word_embeddings", &c.tie_word_embeddings));

  c.rope_theta = 10000.f;
  GRPO_TRY(get_float(j, "rope_theta", &c.rope_theta));
  if (auto it = j.find("rope_scaling"); it != j.end()) GRPO_TRY(parse_rope_scaling(*it, &c.rope_scaling));
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {  // transformers >= 5
    GRPO_TRY(get_float(*it, "rope_theta", &c.rope_theta).with_context("rope_parameters"));
    GRPO_TRY(parse_rope_scaling(*it, &c.rope_scaling).with_context("rope_parameters"));
  }

  // Attention bias: qwen2 always has q/k/v bias (no config field); llama and
  // qwen3 read attention_bias (default false); mistral has none.
  if (c.arch == Arch::qwen2) c.attention_bias = true;
  else if (c.arch != Arch::mistral) GRPO_TRY(get_bool(j, "attention_bias", &c.attention_bias));
  c.qk_norm = c.arch == Arch::qwen3;

  if (auto it = j.find("hidden_act"); it != j.end() && !(it->is_string() && *it == "silu"))
    return error_status("hidden_act " + it->dump() + " is not supported (only \"silu\")");
  bool mlp_bias = false;
  GRPO_TRY(get_bool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return error_status("mlp_bias=true is not supported");

  GRPO_TRY(parse_sliding_window(j, &c));

  GRPO_TRY(get_int(j, "bos_token_id", &c.bos_token_id, false));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) return error_status("field \"eos_token_id\" must be an integer or a list of integers");
        c.eos_token_ids.push_back(e.get<int>());
      }
    } else {
      return error_status("field \"eos_token_id\" must be an integer or a list of integers, got " + it->dump());
    }
  }
  for (const char* k : {"dtype", "torch_dtype"}) {  // transformers 5 writes "dtype"
    auto it = j.find(k);
    if (it != j.end() && it->is_string()) { c.torch_dtype = it->get<std::string>(); break; }
  }
  GRPO_TRY(c.validate());
  return c;
}

Status ModelConfig::validate() const {
  auto pos = [](const char* name, int v) -> Status {
    if (v <= 0) return error_status(std::string("field \"") + name + "\" must be positive, got " + std::to_string(v));
    return ok_status();
  };
  GRPO_TRY(pos("vocab_size", vocab_size));
  GRPO_TRY(pos("hidden_size", hidden_size));
  GRPO_TRY(pos("intermediate_size", intermediate_size));
  GRPO_TRY(pos("num_hidden_layers", n_layers));
  GRPO_TRY(pos("num_attention_heads", n_heads));
  GRPO_TRY(pos("num_key_value_heads", n_kv_heads));
  GRPO_TRY(pos("head_dim", head_dim));
  GRPO_TRY(pos("max_position_embeddings", max_position_embeddings));
  if (n_heads % n_kv_heads != 0)
    return error_status("num_attention_heads (" + std::to_string(n_heads) + ") must be a multiple of num_key_value_heads (" +
                        std::to_string(n_kv_heads) + ")");
  if (head_dim % 2 != 0) return error_status("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0)) return error_status("field \"rms_norm_eps\" must be positive");
  if (!(rope_theta > 0)) return error_status("field \"rope_theta\" must be positive");
  if (rope_scaling.type == "llama3" && !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
    return error_status("rope_scaling: high_freq_factor must exceed low_freq_factor");
  if (!layer_window.empty() && int(layer_window.size()) != n_layers)
    return error_status("sliding window: " + std::to_string(layer_window.size()) + " layer windows for " +
                        std::to_string(n_layers) + " layers");
  for (int e : eos_token_ids)
    if (e < 0 || e >= vocab_size) return error_status("eos_token_id " + std::to_string(e) + " is outside the vocabulary");
  return ok_status();
}

int64_t ModelConfig::n_params() const {
  const int64_t C = hidden_size, V = vocab_size, F = intermediate_size, D = head_dim;
  int64_t layer = C + int64_t(qkv_dim()) * C + (attention_bias ? qkv_dim() : 0) + (qk_norm ? 2 * D : 0) +
                  C * q_dim() + C + 2 * F * C + C * F;
  return V * C + n_layers * layer + C + (tie_word_embeddings ? 0 : V * C);
}

Result<ModelConfig> model_config_load(const std::string& path) {
  std::ifstream f(path);
  if (!f) return error_status(path + ": cannot open (a Hugging Face model directory needs a config.json)");
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return error_status(path + ": malformed JSON; fix or re-download config.json");
  auto r = model_config_from_json(j);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

json model_config_to_json(const ModelConfig& c) {
  json j = c.raw.is_object() ? c.raw : json::object();
  // What the raw JSON says today; a field is rewritten only where the struct differs,
  // so untouched values keep their original spelling.
  ModelConfig base;
  bool have_base = false;
  if (!c.raw.is_null()) {
    auto r = model_config_from_json(c.raw);
    if (r.ok()) { base = r.value(); have_base = true; }
  }
  auto set_int = [&](const char* k, int v, int old) { if (!have_base || v != old || !j.contains(k)) j[k] = v; };
  j["model_type"] = c.model_type.empty() ? std::string(arch_name(c.arch)) : c.model_type;
  if (!j.contains("architectures")) {
    const char* cls = c.arch == Arch::llama ? "LlamaForCausalLM" : c.arch == Arch::qwen2 ? "Qwen2ForCausalLM"
                      : c.arch == Arch::qwen3 ? "Qwen3ForCausalLM" : "MistralForCausalLM";
    j["architectures"] = json::array({cls});
  }
  set_int("vocab_size", c.vocab_size, base.vocab_size);
  set_int("hidden_size", c.hidden_size, base.hidden_size);
  set_int("intermediate_size", c.intermediate_size, base.intermediate_size);
  set_int("num_hidden_layers", c.n_layers, base.n_layers);
  set_int("num_attention_heads", c.n_heads, base.n_heads);
  set_int("num_key_value_heads", c.n_kv_heads, base.n_kv_heads);
  if (j.contains("head_dim") || c.head_dim * c.n_heads != c.hidden_size || c.arch == Arch::qwen3)
    set_int("head_dim", c.head_dim, base.head_dim);
  set_int("max_position_embeddings", c.max_position_embeddings, base.max_position_embeddings);
  if (!have_base || c.rms_norm_eps != base.rms_norm_eps || !j.contains("rms_norm_eps"))
    j["rms_norm_eps"] = float_nice(c.rms_norm_eps);
  if (!have_base || c.initializer_range != base.initializer_range) j["initializer_range"] = float_nice(c.initializer_range);
  if (!have_base || c.rope_theta != base.rope_theta || !(j.contains("rope_theta") || j.contains("rope_parameters"))) {
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) j["rope_parameters"]["rope_theta"] = float_nice(c.rope_theta);
    else j["rope_theta"] = float_nice(c.rope_theta);
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch == Arch::llama || c.arch == Arch::qwen3) j["attention_bias"] = c.attention_bias;
  if (!j.contains("hidden_act")) j["hidden_act"] = "silu";
  const RopeScaling& rs = c.rope_scaling;
  const RopeScaling& brs = base.rope_scaling;
  bool rs_changed = !have_base || rs.type != brs.type || rs.factor != brs.factor || rs.low_freq_factor != brs.low_freq_factor ||
                    rs.high_freq_factor != brs.high_freq_factor ||
                    rs.original_max_position_embeddings != brs.original_max_position_embeddings;
  if (rs_changed && !j.contains("rope_parameters")) {
    if (rs.type == "none") {
      j["rope_scaling"] = nullptr;
    } else {
      json o = {{"rope_type", rs.type}, {"factor", float_nice(rs.factor)}};
      if (rs.type == "llama3") {
        o["low_freq_factor"] = float_nice(rs.low_freq_factor);
        o["high_freq_factor"] = float_nice(rs.high_freq_factor);
        o["original_max_position_embeddings"] = rs.original_max_position_embeddings;
      }
      j["rope_scaling"] = o;
    }
  }
  if (c.arch == Arch::mistral && (!have_base || c.sliding_window != base.sliding_window))
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (c.bos_token_id >= 0) set_int("bos_token_id", c.bos_token_id, base.bos_token_id);
  else if (j.contains("bos_token_id")) j["bos_token_id"] = nullptr;
  if (!have_base || c.eos_token_ids != base.eos_token_ids) {
    if (c.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
    else if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
    else j["eos_token_id"] = c.eos_token_ids;
  }
  j["torch_dtype"] = c.torch_dtype;
  if (j.contains("dtype")) j["dtype"] = c.torch_dtype;
  return j;
}

}  // namespace grpo
