// Model hyper-parameters, read from a Hugging Face config.json. Apart from
// runtime parameters (engine/trainer options). Unknown architectures and bad
// values are rejected in model_config_from_json with a message naming the field.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace grpo {

enum class Arch { llama, qwen2, qwen3, mistral };
const char* arch_name(Arch a);

struct RopeScaling {
  std::string type = "none";        // none | llama3 | linear | dynamic? (only none/llama3/linear supported)
  float factor = 1.f;
  float low_freq_factor = 1.f;       // llama3
  float high_freq_factor = 4.f;      // llama3
  int original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  Arch arch = Arch::llama;
  std::string model_type;          // as in config.json ("llama", "qwen2", "qwen3", "mistral")
  int vocab_size = 0;              // V
  int hidden_size = 0;             // C
  int intermediate_size = 0;       // F
  int n_layers = 0;                // L
  int n_heads = 0;                 // Hq
  int n_kv_heads = 0;              // Hkv
  int head_dim = 0;                // D (explicit for qwen3, else C / Hq)
  int max_position_embeddings = 0;
  float rope_theta = 10000.f;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;     // q/k/v bias (qwen2 always)
  bool qk_norm = false;            // per-head RMSNorm on q and k (qwen3)
  // Sliding-window attention, as transformers applies it (masking_utils): a query
  // at position p attends keys k with p - W < k <= p. sliding_window is W for the
  // layers that use it (0 = no layer does); layer_window[l] is W or 0 (full causal)
  // for layer l. Mistral windows every layer; Qwen2/Qwen3 window the layers that
  // layer_types marks "sliding_attention" (by default the layers >= max_window_layers
  // when use_sliding_window is true); Llama never windows. A window no smaller than
  // max_position_embeddings changes nothing and is stored as 0.
  int sliding_window = 0;
  std::vector<int> layer_window;   // (L) when sliding_window > 0, else empty
  float initializer_range = 0.02f; // std of the normal init (presets)
  RopeScaling rope_scaling;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // config.json eos_token_id (int or list)
  std::string torch_dtype = "float32";
  nlohmann::json raw;              // the original config.json, written back on save

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  int qkv_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  int attn_window(int layer) const { return layer_window.empty() ? 0 : layer_window[size_t(layer)]; }
  int64_t n_params() const;        // parameters stored (tied embeddings counted once)
  Status validate() const;
};

Result<ModelConfig> model_config_from_json(const nlohmann::json& j);
Result<ModelConfig> model_config_load(const std::string& path);  // config.json path
nlohmann::json model_config_to_json(const ModelConfig& c);

}  // namespace grpo
