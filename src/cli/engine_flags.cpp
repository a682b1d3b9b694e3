// Engine flags of the engine-running subcommands (see engine_flags.h).
#include "cli/engine_flags.h"

#include <cstring>
#include <string>

#include "cli/enum_flag.h"
#include "engine/speculative.h"

namespace grpo::cli {

std::span<const EnumName<Device>> device_flag_names() {
  static constexpr EnumName<Device> n[] = {{"cpu", Device::cpu}, {"cuda", Device::cuda}};
  return n;
}
std::span<const EnumName<DType>> engine_dtype_flag_names() {
  static constexpr EnumName<DType> n[] = {{"f32", DType::f32}, {"bf16", DType::bf16}};
  return n;
}

void add_engine_flags(CLI::App* app, EngineConfig* c) {
  const std::string g = "Engine";
  app->add_option("--block-size", c->block_size, "Tokens per KV block")->capture_default_str()->group(g);
  app->add_option("--max-num-seqs", c->max_num_seqs, "Sequences per step at most (0 = the command's default)")
      ->capture_default_str()->group(g);
  app->add_option("--max-num-batched-tokens,--max-batched-tokens", c->max_num_batched_tokens,
                  "Tokens per step at most (chunked prefill)")
      ->capture_default_str()->group(g);
  app->add_option("--max-model-len", c->max_model_len, "Context length (0 = the model's)")->capture_default_str()->group(g);
  app->add_flag("!--no-prefix-caching,!--no-prefix-cache", c->enable_prefix_caching, "Disable prefix caching")->group(g);
  app->add_flag("!--no-chunked-prefill", c->enable_chunked_prefill, "Admit prompts only whole")->group(g);
  add_enum(app, "--cuda-graphs", &c->cuda_graphs, cuda_graphs_names(),
           "Capture decode steps in CUDA graphs (auto = on when the device is CUDA)")
      ->group(g);
  app->add_flag_callback("--no-cuda-graphs", [c] { c->cuda_graphs = CudaGraphsMode::off; }, "Same as --cuda-graphs off")
      ->group(g);
  app->add_option("--cuda-graph-max-context", c->cuda_graph_max_context,
                  "Decode graphs serve contexts up to this (0 = min(max-model-len, 2048))")
      ->group(g);
  add_enum(app, "--kv-cache-dtype", &c->kv_cache_dtype, kv_cache_dtype_names(),
           "KV cache element type: auto (the weights' dtype) or fp8 (= fp8_e4m3: one byte per element, scale 1.0, "
           "saturating at +-448; needs head_dim % 16 == 0)")
      ->group(g);
  app->add_option("--gpu-memory-utilization", c->gpu_memory_utilization,
                  "Fraction of the GPU's memory the process may use; the KV cache gets what the weights and buffers "
                  "leave")
      ->capture_default_str()->group(g);
  app->add_option("--kv-cache-mib", c->kv_cache_mib,
                  "KV cache budget in MiB (0 = from --gpu-memory-utilization on CUDA, 256 on the CPU)")
      ->capture_default_str()->group(g);
  const std::string gs = "Speculative decoding";
  SpeculativeConfig* sp = &c->speculative;
  add_enum(app, "--spec", &sp->method, spec_method_names(),
           "Speculative decoding: off, draft (a draft model, --draft-model) or ngram (prompt lookup)")
      ->group(gs);
  app->add_option("--draft-model", sp->draft_model, "Draft model directory (same vocabulary as the model)")->group(gs);
  app->add_option("--num-speculative-tokens,--k", sp->num_speculative_tokens, "Draft tokens per step at most")
      ->capture_default_str()->group(gs);
  app->add_option("--ngram-min", sp->ngram_min, "Prompt lookup: shortest suffix matched")->capture_default_str()->group(gs);
  app->add_option("--ngram-max", sp->ngram_max, "Prompt lookup: longest suffix matched")->capture_default_str()->group(gs);
  app->add_flag("!--no-adaptive-spec", sp->adaptive, "Always draft k tokens (no cost model)")->group(gs);
  app->add_option("--spec-probe-every", sp->probe_every,
                  "Adaptive: steps between probe steps while drafting is off")
      ->capture_default_str()->group(gs);
  app->add_option("--draft-vocab", sp->draft_vocab,
                  "JSON file of token ids the draft's LM head keeps (FR-Spec; `grpo draft-vocab` writes one)")
      ->group(gs);
  app->add_option("--draft-vocab-size", sp->draft_vocab_size, "Keep the first N ids of --draft-vocab (0: all)")
      ->capture_default_str()->group(gs);
  add_enum(app, "--spec-acceptance", &sp->acceptance, spec_acceptance_names(),
           "At temperature > 0: rejection (speculative sampling) or match (drafts kept iff equal to the "
           "target's seeded sample: outputs identical to plain decoding)")
      ->group(gs);
}

// [engine.speculative] keys and their flags (the flags do not follow the key names).
static const std::pair<const char*, const char*> kSpecFlags[] = {
    {"speculative.method", "spec"},
    {"speculative.draft_model", "draft-model"},
    {"speculative.num_speculative_tokens", "num-speculative-tokens"},
    {"speculative.ngram_min", "ngram-min"},
    {"speculative.ngram_max", "ngram-max"},
    {"speculative.adaptive", "no-adaptive-spec"},
    {"speculative.probe_every", "spec-probe-every"},
    {"speculative.acceptance", "spec-acceptance"},
    {"speculative.draft_vocab_size", "draft-vocab-size"},
    {"speculative.draft_vocab", "draft-vocab"}};

Status engine_flags_validate(const EngineConfig& c) {
  Status s = c.validate("");
  if (s.ok()) return s;
  // "block_size = 0: ..." -> "--block-size = 0: ..."; [engine.speculative] keys have their own flags.
  std::string m = s.message();
  // Message text may name other keys too ("... but speculative.method = ..."): rename those first.
  for (const auto& [key, flag] : kSpecFlags)
    for (size_t at = m.find(key); at != std::string::npos; at = m.find(key, at + 2))
      m.replace(at, std::strlen(key), std::string("--") + flag);
  if (m.rfind("--", 0) == 0) return error_status(m);
  const size_t eq = m.find(' ');
  std::string key = m.substr(0, eq);
  for (char& ch : key)
    if (ch == '_') ch = '-';
  return error_status("--" + key + m.substr(eq));
}

Result<std::unique_ptr<ModelWeights>> engine_flags_load_draft(const EngineConfig& cfg, const ModelConfig& target,
                                                              Context& ctx, DType dt) {
  const int ctx_len = cfg.max_model_len > 0 ? int(cfg.max_model_len) : target.max_position_embeddings;
  auto d = spec_load_draft(cfg.speculative.options(), target, ctx_len, ctx, dt);
  if (!d.ok()) return error_status("--draft-model: " + d.status().message());
  return d;
}

Result<EngineOptions> engine_flags_options(const EngineConfig& cfg, Device dev, const ModelWeights& w,
                                           const ModelWeights* draft, DType dt, int default_max_num_seqs) {
  MemoryUse mem;
  if (dev == Device::cuda) {
    size_t used = 0;
    device_memory_in_use(&used, &mem.total);
    mem.weights = w.arena.nbytes() + (draft ? draft->arena.nbytes() : 0);
    mem.other = used > mem.weights ? used - mem.weights : 0;
  }
  auto eo = engine_options_from_config(cfg, dev, w.config, dt, mem, default_max_num_seqs);
  if (eo.ok()) return eo;
  // The draft vocabulary file is read here: an error about a speculative key names its flag.
  const std::string m = eo.status().message(), prefix = "engine.";
  for (const auto& [key, flag] : kSpecFlags)
    if (m.rfind(prefix + key, 0) == 0) return error_status(std::string("--") + flag + m.substr(prefix.size() + std::strlen(key)));
  return eo;
}

}  // namespace grpo::cli
