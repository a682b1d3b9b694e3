// [lora] → LoraConfig, adapter creation, adapter checkpoints, memory accounting.
#include "train/lora_setup.h"

#include <cmath>

namespace grpo {

Result<LoraConfig> lora_config_from(const LoraSection& s, const std::string& base_model) {
  LoraConfig lc;
  lc.enabled = s.enabled;
  auto bad = [](const std::string& key, const std::string& value, const std::string& why) {
    return error_status(key + " = " + value + ": " + why);
  };
  if (s.r < 1 || s.r > 4096) return bad("lora.r", std::to_string(s.r), "must be in [1, 4096]");
  if (!(s.alpha > 0)) return bad("lora.alpha", std::to_string(s.alpha), "must be > 0");
  if (s.dropout != 0)
    return bad("lora.dropout", std::to_string(s.dropout),
               "LoRA dropout is not supported in training: GRPO recomputes the sampler's logprobs and dropout would "
               "perturb them; set 0");
  lc.r = int(s.r);
  lc.alpha = float(s.alpha);
  lc.dropout = 0.f;
  lc.use_rslora = s.use_rslora;
  lc.base_model = base_model;
  lc.targets.clear();
  for (const auto& name : s.target_modules) {
    auto t = lora_target_parse(name);
    if (!t.ok()) return t.status().with_context("lora.target_modules");
    lc.targets.push_back(t.value());
  }
  std::sort(lc.targets.begin(), lc.targets.end());
  GRPO_TRY(lc.validate().with_context("[lora]"));
  return lc;
}

std::unique_ptr<LoraWeights> lora_create_adapters(const ModelWeights& base, const LoraConfig& lc, uint64_t seed) {
  auto w = std::make_unique<LoraWeights>(lora_allocate(base.config, lc, base.device, base.dtype));
  lora_init(*w, seed);
  return w;
}

Result<std::unique_ptr<LoraWeights>> lora_adapters_from(const ModelWeights& base, const LoraConfig& lc,
                                                        const std::string& dir) {
  auto l = lora_load(dir, base.config, base.device, base.dtype);
  if (!l.ok()) return l.status().with_context("lora.init_from");
  const LoraConfig& f = l.value().cfg;
  auto differ = [&](const std::string& key, const std::string& file, const std::string& cfg) {
    return error_status("lora.init_from = " + dir + ": the adapter has " + key + " = " + file + " but [lora] has " +
                        cfg + "; set " + key + " to match the adapter");
  };
  if (f.r != lc.r) return differ("lora.r", std::to_string(f.r), std::to_string(lc.r));
  if (f.alpha != lc.alpha) return differ("lora.alpha", std::to_string(f.alpha), std::to_string(lc.alpha));
  if (f.use_rslora != lc.use_rslora)
    return differ("lora.use_rslora", f.use_rslora ? "true" : "false", lc.use_rslora ? "true" : "false");
  if (f.targets != lc.targets) {
    std::string a, b;
    for (auto t : f.targets) a += std::string(a.empty() ? "" : ", ") + lora_target_peft_name(t);
    for (auto t : lc.targets) b += std::string(b.empty() ? "" : ", ") + lora_target_peft_name(t);
    return differ("lora.target_modules", "[" + a + "]", "[" + b + "]");
  }
  auto w = std::make_unique<LoraWeights>(std::move(l).value());
  w->cfg.base_model = lc.base_model;
  return w;
}

Status lora_save_from_optimizer(const std::string& dir, const Optimizer& opt) {
  GRPO_CHECK(opt.adapters);
  LoraWeights master;
  lora_bind(master, opt.adapters->model, opt.adapters->cfg, opt.master);
  return lora_save(dir, master);
}

LoraMemory lora_memory(const ModelConfig& mc, const LoraConfig& lc, DType dt) {
  const int64_t es = int64_t(dtype_size(dt));
  const int64_t n = weights_numel(mc), a = lora_numel(mc, lc);
  // Trained parameters: the compute copy, an f32 master unless the compute copy is
  // f32 already, and f32 gradients, m and v.
  auto trained = [&](int64_t k) { return k * (es + (dt == DType::f32 ? 0 : 4) + 12); };
  LoraMemory m;
  m.full_bytes = trained(n);
  m.lora_bytes = n * es + trained(a);
  m.adapter_params = a;
  return m;
}

}  // namespace grpo
