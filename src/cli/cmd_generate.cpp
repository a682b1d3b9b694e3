// `grpo generate`: runs the rollout engine on one prompt (text, chat, or ids)
// and prints the completion(s) and a throughput line. Same --seed, same output.
// Without --seed the engine seed 0 is used, so runs are reproducible too.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/enum_flag.h"
#include "core/context.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace grpo;

struct Args {
  std::string model, prompt, ids, system, lora;
  Device device = Device::cpu;
  std::optional<DType> dtype;  // default: f32 on cpu, bf16 on cuda
  bool chat = false, ignore_eos = false, show_logprobs = false;
  bool deterministic = false;
  float temperature = 1.f, top_p = 1.f, min_p = 0.f;
  int top_k = 0, max_tokens = 128, min_tokens = 0, n = 1, top_logprobs = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int> stop_ids;
  int threads = 0;
  EngineConfig engine;  // --block-size, --gpu-memory-utilization, ... (cli/engine_flags.h)
};

// Sequences per step when --max-num-seqs is not given (vLLM's default).
constexpr int kDefaultMaxNumSeqs = 256;

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (item.empty() || used != item.size() || v < INT32_MIN || v > INT32_MAX)
      return error_status("--ids: '" + item + "' is not an integer token id (expected e.g. --ids \"1,2,3\")");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) return error_status("--ids is empty");
  return ids;
}

Result<std::vector<int32_t>> build_prompt(const Args& a, const Tokenizer* tok) {
  if (!a.ids.empty()) return parse_ids(a.ids);
  if (!tok) return error_status("--prompt needs the model's tokenizer (or pass --ids)");
  std::string text = a.prompt;
  bool add_special = true;
  if (a.chat) {
    if (tok->chat_template().empty())
      return error_status("--chat: " + a.model + " has no chat template (tokenizer_config.json / chat_template.jinja); drop --chat");
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back(ChatMessage{"system", a.system, {}, {}, {}});
    msgs.push_back(ChatMessage{"user", a.prompt, {}, {}, {}});
    ChatOptions co;
    co.bos_token = tok->bos_token();
    co.eos_token = tok->eos_token();
    auto r = render_chat(tok->chat_template(), msgs, co);
    if (!r.ok()) return r.status().with_context("--chat");
    text = r.value();
    add_special = false;  // the template writes its own special tokens
  } else if (!a.system.empty()) {
    return error_status("--system only applies with --chat");
  }
  auto enc = tok->encode_checked(text, add_special);
  if (!enc.ok()) return enc.status().with_context("--prompt");
  return std::vector<int32_t>(enc.value().begin(), enc.value().end());
}

int run(const Args& a) {
  const char* cmd = "generate";
  if (a.prompt.empty() == a.ids.empty()) return cli::fail(cmd, "give exactly one of --prompt TEXT or --ids \"1,2,3\"");
  ContextOptions co;
  co.device = a.device;
  co.n_threads = a.threads;
  co.deterministic = a.deterministic;
  if (co.device == Device::cuda && !cuda_available())
    return cli::fail(cmd, "--device cuda: this build has no CUDA backend or no GPU is visible; use --device cpu");
  const DType dt = a.dtype.value_or(co.device == Device::cuda ? DType::bf16 : DType::f32);
  if (co.device == Device::cpu && dt != DType::f32) return cli::fail(cmd, "--dtype: the CPU backend runs f32 only");
  Context ctx(co);

  const double t_load = now_seconds();
  auto w = model_load(a.model, co.device, dt, &ctx);
  if (!w.ok()) return cli::fail(cmd, w.status().message());
  std::unique_ptr<Tokenizer> tok;
  auto t = Tokenizer::load(a.model);
  if (t.ok()) tok = std::make_unique<Tokenizer>(std::move(t).value());
  else if (!a.prompt.empty()) return cli::fail(cmd, t.status().message());
  else GRPO_LOG_WARN("generate: no tokenizer (%s); printing ids only", t.status().message().c_str());
  GRPO_LOG_INFO("generate: loaded %s in %.2f s", a.model.c_str(), now_seconds() - t_load);
  std::unique_ptr<LoraWeights> lora;  // applied unmerged by the engine
  if (!a.lora.empty()) {
    auto l = lora_load(a.lora, w.value().config, co.device, dt);
    if (!l.ok()) return cli::fail(cmd, l.status().with_context("--lora").message());
    lora = std::make_unique<LoraWeights>(std::move(l).value());
    GRPO_LOG_INFO("generate: LoRA adapter %s (r=%d, scaling %g)", a.lora.c_str(), lora->cfg.r, double(lora->scaling));
  }

  auto prompt = build_prompt(a, tok.get());
  if (!prompt.ok()) return cli::fail(cmd, prompt.status().message());

  if (Status fs = cli::engine_flags_validate(a.engine); !fs.ok()) return cli::fail(cmd, fs.message());
  auto draft = cli::engine_flags_load_draft(a.engine, w.value().config, ctx, dt);
  if (!draft.ok()) return cli::fail(cmd, draft.status().message());
  auto eo_r = cli::engine_flags_options(a.engine, co.device, w.value(), draft.value().get(), dt, kDefaultMaxNumSeqs);
  if (!eo_r.ok()) return cli::fail(cmd, eo_r.status().message());
  EngineOptions eo = eo_r.value();
  eo.lora = lora.get();

  SamplingParams p;
  p.temperature = a.temperature;
  p.top_p = a.top_p;
  p.top_k = a.top_k;
  p.min_p = a.min_p;
  p.seed = a.seed;
  p.n = a.n;
  p.max_tokens = a.max_tokens;
  p.min_tokens = a.min_tokens;
  p.stop = a.stop;
  p.stop_token_ids.assign(a.stop_ids.begin(), a.stop_ids.end());
  p.ignore_eos = a.ignore_eos;
  p.top_logprobs = a.top_logprobs;
  Status ps = p.validate(w.value().config.vocab_size);
  if (!ps.ok()) return cli::fail(cmd, ps.message());

  Engine eng(ctx, w.value(), tok.get(), eo, nullptr, draft.value().get());
  const double t0 = now_seconds();
  auto out = eng.generate({prompt.value()}, p);
  if (!out.ok()) return cli::fail(cmd, out.status().message());
  const double dt_s = now_seconds() - t0;

  int64_t n_gen = 0;
  double ttft = 0;
  for (const RequestOutput& r : out.value()) {
    if (p.n > 1) std::printf("--- sample %d ---\n", r.sample_index);
    if (tok) {
      std::printf("%s\n", r.text.c_str());
    } else {
      for (size_t j = 0; j < r.completion_ids.size(); ++j) std::printf("%s%d", j ? "," : "", r.completion_ids[j]);
      std::printf("\n");
    }
    if (a.show_logprobs)
      for (size_t j = 0; j < r.completion_ids.size(); ++j)
        std::printf("  [%zu] id %d logprob %.6f (processed %.6f)\n", j, r.completion_ids[j], r.logprobs_raw[j],
                    r.logprobs_processed[j]);
    std::printf("[finish: %s, %d tokens]\n", finish_reason_name(r.finish_reason), r.telemetry.generated_tokens);
    n_gen += r.telemetry.generated_tokens;
    ttft = std::max(ttft, r.telemetry.ttft_s);
  }
  std::printf("[generate] prompt %zu tokens, %lld generated in %.3f s: %.1f tok/s, TTFT %.1f ms, prefix-cache hits %lld "
              "tokens, %d KV blocks of %d (%s, %s, KV %s)\n",
              prompt.value().size(), (long long)n_gen, dt_s, dt_s > 0 ? double(n_gen) / dt_s : 0.0, ttft * 1e3,
              (long long)eng.stats().prefix_hit_tokens, eng.n_kv_blocks(), eo.block_size, device_name(co.device),
              dtype_name(dt), dtype_name(eng.kv_cache_dtype()));
  if (eo.speculative.enabled())
    std::printf("[generate] speculative %s: %lld drafts proposed, %lld accepted (%.1f%%), %lld engine steps\n",
                spec_method_name(eo.speculative.method), (long long)eng.stats().spec_proposed,
                (long long)eng.stats().spec_accepted,
                eng.stats().spec_proposed ? 100.0 * double(eng.stats().spec_accepted) / double(eng.stats().spec_proposed)
                                          : 0.0,
                (long long)eng.stats().steps);
  return 0;
}

cli::CommandRegistrar reg("generate", "Generate completions for a prompt with the rollout engine", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--model", a->model, "Hugging Face model directory")->required();
  sub->add_option("--lora", a->lora, "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to --model");
  sub->add_option("--prompt", a->prompt, "Prompt text (encoded with the model's tokenizer)");
  sub->add_option("--ids", a->ids, "Prompt token ids, comma-separated (e.g. \"1,2,3\")");
  sub->add_flag("--chat", a->chat, "Wrap --prompt in the tokenizer's chat template (user turn + generation prompt)");
  sub->add_option("--system", a->system, "System message for --chat");
  sub->add_option("--temperature", a->temperature, "Sampling temperature (0 = greedy)");
  sub->add_option("--top-p", a->top_p, "Nucleus sampling mass in (0, 1]");
  sub->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)");
  sub->add_option("--min-p", a->min_p, "Drop tokens below min_p x the best token's probability");
  sub->add_option("--seed", a->seed, "Per-request RNG seed (same seed, same output)");
  sub->add_option("--max-tokens", a->max_tokens, "Completion tokens at most");
  sub->add_option("--min-tokens", a->min_tokens, "EOS/stop ids are banned before this many tokens");
  sub->add_option("--stop", a->stop, "Stop string (repeatable); not included in the output");
  sub->add_option("--stop-id", a->stop_ids, "Stop token id (repeatable)");
  sub->add_option("--n", a->n, "Samples for the prompt");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at EOS");
  sub->add_flag("--logprobs", a->show_logprobs, "Print each token's logprob");
  sub->add_option("--top-logprobs", a->top_logprobs, "Also compute this many best logprobs per token");
  cli::add_enum(sub, "--device", &a->device, cli::device_flag_names(), "Device");
  cli::add_enum(sub, "--dtype", &a->dtype, cli::engine_dtype_flag_names(), "Weights/KV dtype", "f32 on cpu, bf16 on cuda");
  cli::add_engine_flags(sub, &a->engine);
  sub->add_flag("--deterministic", a->deterministic, "Batch-invariant kernels");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all)");
  return [a]() { return run(*a); };
});

}  // namespace
