// LoRA GRPO step against full fine-tuning (issue 19, item 6): on a randomly
// initialised preset model, one GRPO step (the engine generates B prompts x G
// samples of forced length, then forward + backward + AdamW over them) in one of
// two modes, one mode per process so that each process's device memory is its own:
//   --mode full : every weight trained (f32 master, gradients, Adam m and v for all)
//   --mode lora : base frozen in bf16; rank-r adapters on the seven projections
//                 trained (their f32 master, gradients, m, v); the engine applies
//                 the adapters unmerged (two extra small GEMMs per projection)
// Prints rollout / train seconds and the device memory in use after the steps
// (the process's own allocations: weights, optimizer state, KV pool, activations),
// and writes bench/results/lora_step-<preset>-<mode>.json. tools/device/lora_bench.sh
// runs both modes in one call and writes the comparison (bench/results/lora_vs_full-<preset>.json).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_util.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "model/presets.h"
#include "model/train_model.h"
#include "train/lora_setup.h"
#include "train/optimizer.h"
#include "train/train_step.h"

using namespace grpo;
using grpo::bench::device_used_bytes;
using grpo::bench::today;

int main(int argc, char** argv) {
  std::string preset = "qwen2.5-0.5b", device = "cuda", mode = "lora", out_dir = "bench/results";
  int n_prompts = 8, group = 8, prompt_len = 128, new_tokens = 256, steps = 3, micro_tokens = 8192, rank = 16;
  double kv_gb = 8.0;
  bool graphs = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset") preset = next();
    else if (a == "--device") device = next();
    else if (a == "--mode") mode = next();
    else if (a == "--r") rank = std::stoi(next());
    else if (a == "--prompts") n_prompts = std::stoi(next());
    else if (a == "--group") group = std::stoi(next());
    else if (a == "--prompt-len") prompt_len = std::stoi(next());
    else if (a == "--new-tokens") new_tokens = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--micro-tokens") micro_tokens = std::stoi(next());
    else if (a == "--kv-gb") kv_gb = std::stod(next());
    else if (a == "--no-graphs") graphs = false;
    else if (a == "--out") out_dir = next();
    else {
      std::fprintf(stderr, "usage: bench_lora [--preset P] [--device cuda|cpu] [--mode lora|full] [--r R] "
                           "[--prompts B] [--group G] [--prompt-len P] [--new-tokens N] [--steps S] "
                           "[--micro-tokens T] [--kv-gb GB] [--no-graphs] [--out DIR]\n");
      return 2;
    }
  }
  if (mode != "lora" && mode != "full") {
    std::fprintf(stderr, "bench_lora: --mode %s: use lora or full\n", mode.c_str());
    return 2;
  }
  auto cfg = preset_config(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", cfg.status().message().c_str());
    return 1;
  }
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  Context ctx(co);
  const DType dt = co.device == Device::cuda ? DType::bf16 : DType::f32;
  const size_t used0 = device_used_bytes();
  ModelWeights w = weights_random(*cfg, co.device, dt, 1234, &ctx);

  LoraSection ls;
  ls.enabled = true;
  ls.r = rank;
  ls.alpha = 2.0 * rank;
  auto lc = lora_config_from(ls, preset);
  if (!lc.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", lc.status().message().c_str());
    return 2;
  }
  std::unique_ptr<LoraWeights> adapters;
  AdamWConfig ac;
  ac.max_grad_norm = 1.0f;
  Optimizer opt;
  TrainModel tm;
  if (mode == "lora") {
    adapters = lora_create_adapters(w, lc.value(), 7);
    opt = optimizer_create_lora(ctx, *adapters, ac);
    tm.lora = adapters.get();
  } else {
    opt = optimizer_create(ctx, w, ac);
  }
  // The [engine] section's path, as `grpo train` builds its engine (engine/engine_config.h).
  EngineConfig ec;
  ec.kv_cache_mib = int64_t(kv_gb * 1024.0);
  ec.max_num_seqs = n_prompts * group;
  ec.max_num_batched_tokens = std::max(8192, n_prompts * group);
  ec.cuda_graphs = graphs ? CudaGraphsMode::automatic : CudaGraphsMode::off;
  auto eo_r = engine_options_from_config(ec, co.device, w.config, w.dtype, MemoryUse{}, n_prompts * group);
  if (!eo_r.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", eo_r.status().message().c_str());
    return 2;
  }
  EngineOptions eo = eo_r.value();
  eo.lora = adapters.get();
  Engine engine(ctx, w, nullptr, eo);
  GrpoStepOptions so;
  so.loss.loss_type = LossType::dapo;
  so.loss.max_completion_length = new_tokens;
  so.micro.max_tokens = micro_tokens;

  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, cfg->vocab_size - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  double rollout_s = 0, train_s = 0;
  int timed = 0;
  nlohmann::json last;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n_prompts),
                                              std::vector<int32_t>(static_cast<size_t>(prompt_len)));
    for (auto& p : prompts)
      for (auto& x : p) x = tok(rng);
    SamplingParams sp;
    sp.n = group;
    sp.max_tokens = new_tokens;
    sp.min_tokens = new_tokens;
    sp.ignore_eos = true;
    sp.seed = uint64_t(step + 1);
    ctx.synchronize();
    const double t0 = now_seconds();
    auto outs = engine.generate(prompts, sp);
    if (!outs.ok()) {
      std::fprintf(stderr, "bench_lora: %s\n", outs.status().message().c_str());
      return 1;
    }
    ctx.synchronize();
    const double t1 = now_seconds();
    std::vector<GrpoSample> samples;
    for (auto& o : *outs) {
      GrpoSample s;
      s.prompt = o.prompt_ids;
      s.completion = o.completion_ids;
      s.rollout_logp = o.logprobs_raw;
      s.advantage = nd(rng);
      samples.push_back(std::move(s));
    }
    auto st = grpo_train_step(ctx, tm, w, opt, 1e-5, samples, so);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_lora: %s\n", st.status().message().c_str());
      return 1;
    }
    ctx.synchronize();
    const double t2 = now_seconds();
    engine.reset_prefix_cache();
    std::printf("[%s] step %d: rollout %.3f s  train %.3f s  mismatch max %.4g  grad_norm %.3g\n", mode.c_str(), step,
                t1 - t0, t2 - t1, st->metrics.roll_abs_max, st->optim.grad_norm);
    if (step > 0 || steps == 1) {  // the first step pays for lazy allocations and graph warm-up
      rollout_s += t1 - t0;
      train_s += t2 - t1;
      ++timed;
    }
    last = {{"logprob_mismatch_max", st->metrics.roll_abs_max}, {"grad_norm", st->optim.grad_norm}};
  }
  const LoraMemory mem = lora_memory(*cfg, lc.value(), dt);
  last["rollout_s"] = rollout_s / timed;
  last["train_s"] = train_s / timed;
  last["step_s"] = (rollout_s + train_s) / timed;
  last["device_bytes_in_use"] = double(device_used_bytes() - used0);
  last["trained_params"] = double(mode == "lora" ? mem.adapter_params : weights_numel(*cfg));
  last["param_optimizer_bytes_computed"] = double(mode == "lora" ? mem.lora_bytes : mem.full_bytes);
  std::printf("[%s] mean over %d steps: rollout %.3f s  train %.3f s  device memory in use %.1f MiB  "
              "(parameters + optimizer, computed: %.1f MiB)\n",
              mode.c_str(), timed, rollout_s / timed, train_s / timed,
              double(last["device_bytes_in_use"]) / 1048576.0,
              double(last["param_optimizer_bytes_computed"]) / 1048576.0);
  nlohmann::json conf = {{"preset", preset}, {"mode", mode}, {"r", rank}, {"alpha", 2 * rank},
                         {"prompts", n_prompts}, {"group", group}, {"prompt_len", prompt_len},
                         {"new_tokens", new_tokens}, {"micro_tokens", micro_tokens}, {"steps", steps},
                         {"cuda_graphs", eo.use_cuda_graphs}, {"dtype", dtype_name(dt)}};
  std::string cmdline = "bench_lora --preset " + preset + " --device " + device + " --mode " + mode + " --r " +
                        std::to_string(rank);
  nlohmann::json j = {{"bench", "lora_step"}, {"date", today()}, {"device", device}, {"command", cmdline},
                      {"config", conf}, {"metrics", last}};
  const std::string path = out_dir + "/lora_step-" + preset + "-" + mode + ".json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
