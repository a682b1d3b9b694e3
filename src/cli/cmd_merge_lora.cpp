// `grpo merge-lora`: base model + PEFT LoRA adapter -> a Hugging Face checkpoint
// whose weights are W + scaling·B·A (what PEFT's merge_and_unload computes),
// with the base's config and tokenizer files.
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "core/log.h"
#include "model/checkpoint.h"
#include "model/lora.h"

namespace {

using namespace grpo;

std::span<const EnumName<SaveDType>> save_dtype_names() {
  static constexpr EnumName<SaveDType> n[] = {{"as_loaded", SaveDType::as_loaded}, {"bf16", SaveDType::bf16},
                                              {"f16", SaveDType::f16}, {"f32", SaveDType::f32}};
  return n;
}

struct Args {
  std::string model, lora, out;
  SaveDType dtype = SaveDType::as_loaded;
};

int run(const Args& a) {
  const std::string cmd = "merge-lora";
  if (a.out == a.model) return cli::fail(cmd, "--out must differ from --model (the base stays untouched)");
  SaveOptions so;
  so.dtype = a.dtype;
  // f32 on the host: the merge adds scaling·B·A once and rounds once, on save.
  auto w = model_load(a.model, Device::cpu, DType::f32);
  if (!w.ok()) return cli::fail(cmd, w.status().with_context("--model").message());
  auto l = lora_load(a.lora, w.value().config, Device::cpu, DType::f32);
  if (!l.ok()) return cli::fail(cmd, l.status().with_context("--lora").message());
  lora_merge_into(w.value(), l.value());
  so.tokenizer_src_dir = a.model;
  if (Status s = model_save(a.out, w.value(), so); !s.ok()) return cli::fail(cmd, s.message());
  GRPO_LOG_INFO("merge-lora: %s + %s (r=%d, scaling %g) -> %s", a.model.c_str(), a.lora.c_str(), l.value().cfg.r,
                double(l.value().scaling), a.out.c_str());
  return 0;
}

cli::CommandRegistrar reg("merge-lora", "Merge a PEFT LoRA adapter into its base model and save an HF checkpoint",
                          [](CLI::App* sub) {
                            auto a = std::make_shared<Args>();
                            sub->add_option("--model", a->model, "Base model directory (Hugging Face)")->required();
                            sub->add_option("--lora", a->lora, "PEFT LoRA adapter directory")->required();
                            sub->add_option("--out", a->out, "Output model directory")->required();
                            cli::add_enum(sub, "--dtype", &a->dtype, save_dtype_names(),
                                          "Saved dtype (as_loaded: the base's torch_dtype)");
                            return [a] { return run(*a); };
                          });

}  // namespace
