// `grpo plan-memory [CFG] [--preset NAME] [--ranks N]`: the per-GPU memory of a
// training run (train/memory_plan.h) for ZeRO-0 and ZeRO-1 at 1, 2, 4 and 8
// ranks (or N), from a run config's model and batch settings or a preset's
// shape with the default settings. Prints a Markdown table.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/engine_config.h"
#include "model/presets.h"
#include "train/memory_plan.h"
#include "train/run_config.h"

namespace {

struct Args {
  std::string config, preset;
  std::vector<std::string> sets;
  int ranks = 0;
  double gpu_gib = 80;
  int64_t prompt_tokens = 256;
};

int run(const Args& a) {
  using namespace grpo;
  const char* cmd = "plan-memory";
  if (a.config.empty() && a.preset.empty())
    return cli::fail(cmd, "give a run config (its model.path) or --preset NAME, e.g. grpo plan-memory --preset qwen3-8b");
  if (a.ranks < 0 || a.ranks > 4096) return cli::fail(cmd, "--ranks must be between 1 and 4096");
  if (a.gpu_gib <= 0) return cli::fail(cmd, "--gpu-gib must be > 0 (the device memory in GiB, 80 for an H100)");
  RunConfig cfg;
  if (!a.config.empty()) {
    auto c = run_config_load(a.config, a.sets);
    if (!c.ok()) return cli::fail(cmd, c.status().message());
    cfg = c.value();
  } else if (!a.sets.empty()) {
    return cli::fail(cmd, "--set needs a run config to change; give CFG too");
  }
  ModelConfig mc;
  if (!a.preset.empty()) {
    auto p = preset_config(a.preset);
    if (!p.ok()) return cli::fail(cmd, p.status().message());
    mc = p.value();
  } else {
    if (cfg.model.path.empty())
      return cli::fail(cmd, a.config + ": model.path is empty (the built-in demo model); give --preset NAME for a shape");
    const std::string cj = (std::filesystem::path(cfg.model.path) / "config.json").string();
    auto m = model_config_load(cj);
    if (!m.ok()) return cli::fail(cmd, m.status().message());
    mc = m.value();
  }
  MemoryPlanInput in;
  in.model = mc;
  in.dtype = cfg.model.dtype;
  // As the trainer sizes its largest micro-batch (train/loop_setup.cpp memory_use).
  const int64_t seq_len = a.prompt_tokens + std::max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens);
  in.micro_batch_tokens = std::max(seq_len, std::min(cfg.train.micro_batch_tokens, cfg.train.micro_batch * seq_len));
  in.recompute = cfg.train.activation_recompute;
  in.reference = cfg.train.beta > 0 && !cfg.lora.enabled;
  const int64_t n_seqs = cfg.rollout.prompts_per_step * cfg.rollout.num_generations;
  const int max_seqs = int(cfg.engine.max_num_seqs > 0 ? cfg.engine.max_num_seqs : std::clamp<int64_t>(n_seqs, 1, 256));
  const int max_len = int(cfg.engine.max_model_len > 0 ? cfg.engine.max_model_len : mc.max_position_embeddings);
  in.engine_buffers = engine_buffer_bytes(mc, in.dtype, max_seqs, int(cfg.engine.max_num_batched_tokens), max_len,
                                          int(cfg.engine.block_size));
  in.device_gib = a.gpu_gib;
  in.gpu_memory_utilization = cfg.engine.gpu_memory_utilization;
  in.block_size = int(cfg.engine.block_size);
  const std::vector<int> ranks = a.ranks > 0 ? std::vector<int>{a.ranks} : std::vector<int>{1, 2, 4, 8};
  std::printf("%s", memory_plan_table(in, memory_plan(in, ranks)).c_str());
  std::printf("activations: micro-batches of %lld tokens%s; prompts assumed %lld tokens (--prompt-tokens)\n",
              (long long)in.micro_batch_tokens, in.recompute ? " with recompute" : "", (long long)a.prompt_tokens);
  return 0;
}

grpo::cli::CommandRegistrar reg(
    "plan-memory", "Per-GPU memory of a training run for ZeRO-0/1 at 1, 2, 4, 8 ranks", [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      sub->add_option("config", a->config, "Run config (TOML); its model.path gives the model shape");
      sub->add_option("--preset", a->preset, "Model shape from a preset instead (e.g. qwen3-8b, llama-3.1-8b)");
      sub->add_option("--set", a->sets, "Override a config key (key=value), as for grpo train");
      sub->add_option("--ranks", a->ranks, "Only this number of ranks (default: 1, 2, 4 and 8)");
      sub->add_option("--gpu-gib", a->gpu_gib, "Device memory per GPU in GiB (default 80)");
      sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length assumed for the activation estimate");
      return [a]() { return run(*a); };
    });

}  // namespace
