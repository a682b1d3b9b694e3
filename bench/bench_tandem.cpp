// Tandem GRPO step benchmark (issue 17): one GRPO step (rollout + train + sync)
// with a frozen partner writing part of every rollout, against the vanilla step
// in the same process (the peer). Random weights, forced lengths (ignore_eos +
// min_tokens), the GRPO shape of bench_grpo (B prompts x G samples, prompt P,
// N new tokens). The partner is a second model with the policy's vocabulary:
// --partner same (a same-size frozen copy: same preset, other seed) or a preset
// with --partner-layers / --partner-hidden overrides (e.g. qwen3-0.6b at hidden
// 512, 8 layers: about a quarter of Qwen2.5-0.5B, same 151936-token vocabulary).
// Prints both steps' time split, the ratio tandem/vanilla, the trained-token
// fraction and device memory of each; writes bench/results/tandem_step-<preset>-<partner>-<strategy>.json.
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
#include "tokenizer/tokenizer.h"
#include "train/loop_rollout.h"
#include "train/optimizer.h"
#include "train/train_step.h"

using namespace grpo;
using grpo::bench::device_used_bytes;
using grpo::bench::today;

namespace {

struct Shape {
  int n_prompts = 8, group = 8, prompt_len = 128, new_tokens = 512, micro_tokens = 16384, steps = 3;
  double kv_gb = 16;
  bool graphs = true;
};

// Runs `steps` GRPO steps and returns the last one's metrics (the first warms up graphs and caches).
nlohmann::json run_steps(Context& ctx, ModelWeights& w, const ModelWeights* partner, const TandemOptions& topt,
                         const Shape& sh, bool* ok) {
  const size_t used0 = device_used_bytes();
  // The [engine] section's path, as `grpo train` builds its engine (engine/engine_config.h).
  EngineConfig ec;
  ec.kv_cache_mib = int64_t(sh.kv_gb * 1024.0);
  ec.max_num_seqs = sh.n_prompts * sh.group;
  ec.max_num_batched_tokens = std::max(8192, sh.n_prompts * sh.group);
  ec.cuda_graphs = sh.graphs ? CudaGraphsMode::automatic : CudaGraphsMode::off;
  auto eo_r = engine_options_from_config(ec, ctx.device(), w.config, w.dtype, MemoryUse{}, sh.n_prompts * sh.group);
  if (!eo_r.ok()) {
    std::fprintf(stderr, "bench_tandem: %s\n", eo_r.status().message().c_str());
    *ok = false;
    return {};
  }
  const EngineOptions eo = eo_r.value();
  EngineTandem et{partner, topt};
  Engine engine(ctx, w, nullptr, eo, partner ? &et : nullptr);
  Optimizer opt = optimizer_create(ctx, w, AdamWConfig{});
  TrainModel tm;
  GrpoStepOptions so;
  so.loss.loss_type = LossType::dapo;
  so.loss.epsilon_high = 0.28f;
  so.loss.max_completion_length = sh.new_tokens;
  so.micro.max_tokens = sh.micro_tokens;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, w.config.vocab_size - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  nlohmann::json last;
  for (int step = 0; step < sh.steps; ++step) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(sh.n_prompts),
                                              std::vector<int32_t>(static_cast<size_t>(sh.prompt_len)));
    for (auto& p : prompts)
      for (auto& x : p) x = tok(rng);
    SamplingParams sp;
    sp.n = sh.group;
    sp.max_tokens = sp.min_tokens = sh.new_tokens;
    sp.ignore_eos = true;
    sp.seed = uint64_t(step + 1);
    ctx.synchronize();
    const int64_t steps0 = engine.stats().steps, replays0 = engine.stats().graph_replays;
    const double t0 = now_seconds();
    auto outs = engine.generate(prompts, sp);
    if (!outs.ok()) {
      std::fprintf(stderr, "bench_tandem: %s\n", outs.status().message().c_str());
      *ok = false;
      return last;
    }
    ctx.synchronize();
    const double t1 = now_seconds();
    std::vector<GrpoSample> samples;
    double gen = 0, trained = 0;
    for (auto& o : *outs) {
      GrpoSample s;
      s.prompt = o.prompt_ids;
      s.completion = o.completion_ids;
      s.advantage = nd(rng);
      s.rollout_logp = o.model_mask.empty() ? o.logprobs_raw : o.logprobs_trained;
      if (!o.model_mask.empty()) s.weights = tandem_loss_weights(o.model_mask, 0.2f);
      for (uint8_t x : o.model_mask) trained += x;
      gen += double(o.completion_ids.size());
      samples.push_back(std::move(s));
    }
    auto st = grpo_train_step(ctx, tm, w, opt, 1e-6, samples, so);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_tandem: %s\n", st.status().message().c_str());
      *ok = false;
      return last;
    }
    ctx.synchronize();
    const double t2 = now_seconds();
    engine.reset_prefix_cache();
    const double t3 = now_seconds();
    const int64_t steps = engine.stats().steps - steps0, replays = engine.stats().graph_replays - replays0;
    std::printf("  %s step %d: rollout %.3f s (%.0f tok/s, %lld engine steps, %lld graph replays)  train %.3f s  "
                "total %.3f s  trained tokens %.3f\n",
                partner ? "tandem " : "vanilla", step, t1 - t0, gen / (t1 - t0), (long long)steps, (long long)replays,
                t2 - t1, t3 - t0, partner ? trained / gen : 1.0);
    last = {{"rollout_s", t1 - t0}, {"train_s", t2 - t1}, {"sync_s", t3 - t2}, {"seconds", t3 - t0},
            {"generated_tokens", gen}, {"rollout_tokens_per_s", gen / (t1 - t0)},
            {"trained_token_frac", partner ? trained / gen : 1.0},
            {"kv_blocks", engine.n_kv_blocks()}, {"kv_bytes_per_block", engine.kv_bytes_per_block()},
            {"graph_replays", engine.stats().graph_replays}, {"engine_steps", steps},
            {"device_bytes_engine_and_optimizer", device_used_bytes() - used0}};
  }
  *ok = true;
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "qwen2.5-0.5b", partner = "same", device = "cuda", strategy = "token",
              out_dir = "bench/results", tokenizer;
  int partner_layers = 0, partner_hidden = 0, partner_heads = 0, partner_kv_heads = 0, partner_ffn = 0;
  double p_trained = 0.5;
  Shape sh;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset") preset = next();
    else if (a == "--partner") partner = next();
    else if (a == "--partner-layers") partner_layers = std::stoi(next());
    else if (a == "--partner-hidden") partner_hidden = std::stoi(next());
    else if (a == "--partner-heads") partner_heads = std::stoi(next());
    else if (a == "--partner-kv-heads") partner_kv_heads = std::stoi(next());
    else if (a == "--partner-ffn") partner_ffn = std::stoi(next());
    else if (a == "--strategy") strategy = next();
    else if (a == "--tokenizer") tokenizer = next();
    else if (a == "--p-trained") p_trained = std::stod(next());
    else if (a == "--device") device = next();
    else if (a == "--prompts") sh.n_prompts = std::stoi(next());
    else if (a == "--group") sh.group = std::stoi(next());
    else if (a == "--prompt-len") sh.prompt_len = std::stoi(next());
    else if (a == "--new") sh.new_tokens = std::stoi(next());
    else if (a == "--steps") sh.steps = std::stoi(next());
    else if (a == "--kv-gb") sh.kv_gb = std::stod(next());
    else if (a == "--no-graphs") sh.graphs = false;
    else if (a == "--out-dir") out_dir = next();
    else {
      std::fprintf(stderr, "usage: bench_tandem [--preset P] [--partner same|PRESET] [--partner-layers L] "
                           "[--partner-hidden H] [--partner-heads N] [--partner-kv-heads N] [--partner-ffn F] [--strategy token|chunk|word] [--tokenizer DIR] [--p-trained p] [--device cuda|cpu] "
                           "[--prompts B] [--group G] [--prompt-len P] [--new N] [--steps S] [--kv-gb G] "
                           "[--no-graphs] [--out-dir D]\n");
      return 2;
    }
  }
  auto cfg = preset_config(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_tandem: %s\n", cfg.status().message().c_str());
    return 1;
  }
  PresetOverrides ov;
  ov.vocab_size = cfg->vocab_size;
  ov.n_layers = partner_layers;
  ov.hidden_size = partner_hidden;
  ov.n_heads = partner_heads;
  ov.n_kv_heads = partner_kv_heads;
  ov.intermediate_size = partner_ffn;
  auto pcfg = preset_config(partner == "same" ? preset : partner, ov);
  if (!pcfg.ok()) {
    std::fprintf(stderr, "bench_tandem: --partner: %s\n", pcfg.status().message().c_str());
    return 1;
  }
  auto strat = tandem_strategy_from_string(strategy);
  if (!strat.ok() || (strat.value() == TandemStrategy::word && tokenizer.empty())) {
    std::fprintf(stderr, "bench_tandem: --strategy must be token, chunk or word (word: with --tokenizer DIR, the "
                         "tokenizer whose token texts decide word starts, e.g. ../shared/data/tokenizers/qwen2)\n");
    return 2;
  }
  TandemOptions topt;
  topt.strategy = strat.value();
  if (topt.strategy == TandemStrategy::word) {
    auto tok = Tokenizer::load(tokenizer);
    if (!tok.ok()) {
      std::fprintf(stderr, "bench_tandem: --tokenizer: %s\n", tok.status().message().c_str());
      return 1;
    }
    topt.token_flags = tandem_word_flags(tok.value(), cfg->vocab_size);
  }
  topt.p_trained = p_trained;
  topt.chunk_size = 16;
  topt.seed = 1;
  if (!topt.validate(cfg->vocab_size).ok()) {
    std::fprintf(stderr, "bench_tandem: %s\n", topt.validate(cfg->vocab_size).message().c_str());
    return 2;
  }
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  Context ctx(co);
  const DType dt = co.device == Device::cuda ? DType::bf16 : DType::f32;
  const size_t base = device_used_bytes();
  ModelWeights w = weights_random(*cfg, co.device, dt, 1234, &ctx);
  const size_t policy_bytes = device_used_bytes() - base;

  std::printf("bench_tandem: %s (%lld params) with partner %s (%lld params, %d layers, hidden %d), strategy %s, "
              "p_trained %.2f, B=%d G=%d P=%d N=%d\n",
              preset.c_str(), (long long)cfg->n_params(), partner.c_str(), (long long)pcfg->n_params(),
              pcfg->n_layers, pcfg->hidden_size, strategy.c_str(), p_trained, sh.n_prompts, sh.group,
              sh.prompt_len, sh.new_tokens);
  bool ok = false;
  const nlohmann::json vanilla = run_steps(ctx, w, nullptr, topt, sh, &ok);
  if (!ok) return 1;
  const size_t before_partner = device_used_bytes();
  ModelWeights pw = weights_random(*pcfg, co.device, dt, 4321, &ctx);
  const size_t partner_bytes = device_used_bytes() - before_partner;
  const nlohmann::json tandem = run_steps(ctx, w, &pw, topt, sh, &ok);
  if (!ok) return 1;
  const double ratio = tandem["seconds"].get<double>() / vanilla["seconds"].get<double>();
  const double rollout_ratio = tandem["rollout_s"].get<double>() / vanilla["rollout_s"].get<double>();
  std::printf("| step | vanilla s | tandem s | ratio | rollout ratio | partner weights MB | trained frac |\n");
  std::printf("| %s + %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.3f |\n", preset.c_str(), partner.c_str(),
              vanilla["seconds"].get<double>(), tandem["seconds"].get<double>(), ratio, rollout_ratio,
              double(partner_bytes) / 1e6, tandem["trained_token_frac"].get<double>());

  const std::string ptag = partner == "same" ? "same" : partner + "-L" + std::to_string(pcfg->n_layers) + "-H" +
                                                            std::to_string(pcfg->hidden_size) +
                           (partner_heads || partner_kv_heads ? "-A" + std::to_string(pcfg->n_heads) + "x" +
                                                                    std::to_string(pcfg->n_kv_heads)
                                                              : std::string());
  std::string cmd = "bench_tandem --preset " + preset + " --partner " + partner;
  if (partner_layers) cmd += " --partner-layers " + std::to_string(partner_layers);
  if (partner_hidden) cmd += " --partner-hidden " + std::to_string(partner_hidden);
  if (partner_heads) cmd += " --partner-heads " + std::to_string(partner_heads);
  if (partner_kv_heads) cmd += " --partner-kv-heads " + std::to_string(partner_kv_heads);
  if (partner_ffn) cmd += " --partner-ffn " + std::to_string(partner_ffn);
  cmd += " --strategy " + strategy + " --p-trained " + std::to_string(p_trained);
  if (!tokenizer.empty()) cmd += " --tokenizer " + tokenizer;
  nlohmann::json metrics = tandem;
  metrics["policy_weight_bytes"] = policy_bytes;
  metrics["partner_weight_bytes"] = partner_bytes;
  metrics["partner_params"] = pcfg->n_params();
  nlohmann::json j = {
      {"bench", "tandem_step"}, {"date", today()}, {"device", device}, {"command", cmd},
      {"config", {{"preset", preset}, {"partner", ptag}, {"strategy", strategy}, {"p_trained", p_trained},
                  {"prompts", sh.n_prompts}, {"group", sh.group}, {"prompt_len", sh.prompt_len},
                  {"new_tokens", sh.new_tokens}, {"cuda_graphs", sh.graphs}, {"loss", "dapo"}}},
      {"metrics", metrics},
      {"peer", {{"name", "vanilla grpo step (same process)"}, {"metrics", vanilla}}},
      {"ratios", {{"step_tandem_over_vanilla", ratio}, {"rollout_tandem_over_vanilla", rollout_ratio}}}};
  const std::string path = out_dir + "/tandem_step-" + preset + "-" + ptag + "-" + strategy + ".json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
