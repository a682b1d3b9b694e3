// Named model shapes and random initialisation (`grpo init-model`): tiny test
// models of each architecture and the real shapes of small public models,
// written as HF directories (config.json with the real HF keys, so that
// transformers can load them, + model.safetensors + tokenizer files).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "model/weights.h"

namespace grpo {

// Test-only shape overrides (0 = keep the preset's value).
struct PresetOverrides {
  int vocab_size = 0;
  int n_layers = 0;
  int hidden_size = 0;  // head_dim follows hidden/heads except where the preset sets it explicitly (qwen3)
  int n_heads = 0;      // attention heads (head_dim then follows hidden/heads, qwen3 included)
  int n_kv_heads = 0;
  int intermediate_size = 0;
};

// "tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "qwen2.5-0.5b",
// "qwen2.5-1.5b", "qwen3-0.6b", "llama-3.2-1b", "qwen3-8b", "llama-3.1-8b".
std::vector<std::string> preset_names();
Result<ModelConfig> preset_config(const std::string& name, const PresetOverrides& ov = {});
// Sub-folder of shared/data/tokenizers whose files the preset ships by default
// ("qwen2" for Qwen presets); "" when the preset writes no tokenizer unless asked.
std::string preset_tokenizer_subdir(const std::string& name);

// transformers' _init_weights: linear and embedding weights ~ N(0, initializer_range),
// norm weights 1, biases 0. Deterministic for a seed, independent of thread count and dtype.
// Host arenas only.
void weights_init_random(ModelWeights& w, uint64_t seed, Context* ctx = nullptr);

// What a tokenizer directory declares (from tokenizer.json / tokenizer_config.json).
struct TokenizerInfo {
  int n_tokens = 0;  // max id + 1 over the vocabulary and added tokens
  int bos_id = -1;
  int eos_id = -1;
};
Result<TokenizerInfo> tokenizer_info(const std::string& dir);

struct InitModelOptions {
  std::string preset;
  std::string out_dir;
  uint64_t seed = 0;
  DType dtype = DType::bf16;  // bf16 or f32
  std::string tokenizer_dir;  // directory with tokenizer files to copy; "" = none
  PresetOverrides overrides;
};

// Writes a randomly initialised model. With a tokenizer, tiny presets take its
// vocabulary size and bos/eos ids; real presets check that it fits their vocabulary.
Status init_model_write(const InitModelOptions& opt, Context* ctx = nullptr);

}  // namespace grpo

namespace grpo {
// Randomly initialised weights (as weights_init_random) on any device: filled
// on the host, then copied. For benchmarks and tests of real-size shapes.
ModelWeights weights_random(const ModelConfig& cfg, Device dev, DType dt, uint64_t seed, Context* ctx = nullptr);
}  // namespace grpo
