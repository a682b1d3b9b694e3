// LoRA in the trainer: the [lora] section turned into a LoraConfig, the
// adapters created for a base model, and adapter checkpoints (PEFT's files
// written from the optimizer's fp32 master copy).
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "model/lora.h"
#include "train/optimizer.h"
#include "train/run_config.h"

namespace grpo {

// Checks and converts [lora] (errors name the key). base_model is recorded in adapter_config.json.
Result<LoraConfig> lora_config_from(const LoraSection& s, const std::string& base_model);

// Adapters for `base`, in its dtype on its device, with PEFT's initialisation from `seed`.
std::unique_ptr<LoraWeights> lora_create_adapters(const ModelWeights& base, const LoraConfig& lc, uint64_t seed);
// Adapters read from a PEFT directory (lora.init_from), which must agree with `lc`
// (r, alpha, use_rslora, targets); errors name the differing key.
Result<std::unique_ptr<LoraWeights>> lora_adapters_from(const ModelWeights& base, const LoraConfig& lc,
                                                        const std::string& dir);

// Writes the adapters of a LoRA optimizer into `dir` as PEFT files (from the f32 master).
Status lora_save_from_optimizer(const std::string& dir, const Optimizer& opt);

// Parameter memory of training `mc` in `dt`: everything trained (AdamW: f32 master
// unless dt is f32, gradients, m, v) against LoRA (frozen base in dt + adapters trained).
struct LoraMemory {
  int64_t full_bytes = 0;  // full fine-tuning
  int64_t lora_bytes = 0;  // base + adapters with their optimizer state
  int64_t adapter_params = 0;
};
LoraMemory lora_memory(const ModelConfig& mc, const LoraConfig& lc, DType dt);

}  // namespace grpo
