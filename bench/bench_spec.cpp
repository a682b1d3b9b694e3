// Speculative decoding benchmark (issue 18): plain decoding vs speculative decoding in one
// process, with the engine `grpo generate` builds (the [engine] flags, cli/engine_flags.h:
// the same flag names, the same memory accounting), at several concurrencies and the GRPO
// shape (B prompts x G samples), for four proposers:
//   self      the target as its own draft (acceptance upper bound)
//   ngram     prompt lookup on GSM8K prompts
//   layerskip the target's first L layers with its own final norm and LM head (self-drafting)
//   random    a random-weights draft of the target's architecture (lower bound)
//   model     the draft model of --draft-model DIR (the engine flag), e.g. one trained with `grpo sft`
//             on the target's data (tools/device/spec_sft_bench.sh)
//   NAME-vocab  draft NAME with the draft vocabulary of --draft-vocab FILE (its LM head keeps those ids)
// Lengths are forced (ignore_eos, min_tokens = max_tokens), so random weights do real work.
// Each case runs plain first, then speculative, on fresh engines with identical options but
// [engine.speculative]; the first generate of each engine is a warm-up (graph capture,
// allocator) and is not timed. With --repeat R the plain run and every proposer's run are
// repeated R times in turn (plain, proposers, plain, ...) and the run of median tokens/s of
// each is reported, so that drift of the machine between runs falls on both sides.
// Prints tokens/s of both, the ratio and the acceptance rate; --json writes
// bench/results-style JSON.
//
// CPU smoke (ctest bench_spec_smoke): --llama2c BIN TOK converts stories260K first.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cli/engine_flags.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "model/llama2c.h"
#include "model/presets.h"
#include "tokenizer/tokenizer.h"

using namespace grpo;

namespace {

struct Case {
  std::string draft;  // self | ngram | layerskip | random
  int n_prompts = 1, group = 1;
};

struct Timed {
  double seconds = 0, tokens = 0;
  int64_t proposed = 0, accepted = 0, steps = 0;
  int64_t drafting_steps = 0;  // speculative engine: steps that verified drafts (the rest ran plain)
  // Adaptive k: the plan's measured costs at the run's batch size B (ms): a plain step, a verify
  // forward over B·(k + 1) tokens, a draft round over B sequences, the rest of a drafting step.
  double plain_ms = 0, verify_ms = 0, draft_ms = 0, overhead_ms = 0;
};

Result<Timed> time_generate(Context& ctx, ModelWeights& w, const Tokenizer* tok, const EngineOptions& eo,
                            const ModelWeights* draft, const std::vector<std::vector<int32_t>>& prompts,
                            const SamplingParams& sp) {
  Engine eng(ctx, w, tok, eo, nullptr, draft);
  // Warm-up: a short generate over the same batch shape (graphs, allocator, cost-model calibration).
  SamplingParams warm = sp;
  warm.max_tokens = warm.min_tokens = std::min(sp.max_tokens, 16);
  GRPO_TRY(eng.generate(prompts, warm).status());
  const EngineStats s0 = eng.stats();
  ctx.synchronize();
  const double t0 = now_seconds();
  auto out = eng.generate(prompts, sp);
  if (!out.ok()) return out.status();
  ctx.synchronize();
  Timed t;
  t.seconds = now_seconds() - t0;
  for (const auto& o : out.value()) t.tokens += double(o.completion_ids.size());
  t.proposed = eng.stats().spec_proposed - s0.spec_proposed;
  t.accepted = eng.stats().spec_accepted - s0.spec_accepted;
  t.steps = eng.stats().steps - s0.steps;
  t.drafting_steps = eng.stats().spec_steps - s0.spec_steps;
  if (const SpecAdaptive* a = eng.spec_adaptive()) {
    const double B = double(prompts.size()) * double(sp.n), k = double(eo.speculative.num_speculative_tokens);
    t.plain_ms = a->plain.empty() ? 0 : 1e3 * a->plain.predict(B);
    t.verify_ms = a->verify.empty() ? 0 : 1e3 * a->verify.predict(B * (k + 1));
    t.draft_ms = a->draft.empty() ? 0 : 1e3 * a->draft.predict(B);
    t.overhead_ms = 1e3 * a->overhead();
  }
  return t;
}

std::vector<std::string> gsm8k_questions(const std::string& path, size_t n) {
  std::vector<std::string> qs;
  std::ifstream f(path);
  std::string line;
  while (qs.size() < n && std::getline(f, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("question")) qs.push_back(j["question"].get<std::string>());
  }
  return qs;
}

// The run of median tokens/s (the upper median of an even count).
const Timed* median_run(const std::vector<Timed>& runs) {
  std::vector<const Timed*> by;
  for (const Timed& t : runs) by.push_back(&t);
  std::sort(by.begin(), by.end(), [](const Timed* a, const Timed* b) { return a->tokens / a->seconds < b->tokens / b->seconds; });
  return by[by.size() / 2];
}

std::vector<double> rates(const std::vector<Timed>& runs) {
  std::vector<double> r;
  for (const Timed& t : runs) r.push_back(t.tokens / t.seconds);
  return r;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) v.push_back(std::stoi(x));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_spec: plain vs speculative decoding with the engine of grpo generate"};
  std::string model, llama2c_bin, llama2c_tok, gsm8k = std::string(GRPO_SHARED_DIR) + "/data/gsm8k/test.jsonl";
  std::string device = "cpu", dtype_s, json_path, sizes_s = "1,8,64", grpo_s = "8x8", drafts_s = "self,ngram,layerskip,random";
  int new_tokens = 128, layerskip = 0, k = 4, repeat = 1;
  float temperature = 1.f;
  bool adaptive = true;
  app.add_option("--model", model, "HF model directory (the target)");
  app.add_option("--llama2c", llama2c_bin, "llama2.c checkpoint to convert and use instead of --model");
  app.add_option("--llama2c-tokenizer", llama2c_tok, "its tokenizer (tok512.bin)");
  app.add_option("--gsm8k", gsm8k, "GSM8K jsonl whose questions are the prompts")->capture_default_str();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_s, "f32 or bf16 (default: bf16 on cuda, f32 on cpu)");
  app.add_option("--sizes", sizes_s, "concurrent sequences (one prompt each), comma-separated")->capture_default_str();
  app.add_option("--grpo", grpo_s, "GRPO shape BxG (prompts x samples); empty: none")->capture_default_str();
  app.add_option("--drafts", drafts_s, "proposers to run")->capture_default_str();
  app.add_option("--new", new_tokens, "tokens generated per sequence (forced)")->capture_default_str();
  app.add_option("--layers", layerskip, "layerskip draft: the target's first L layers (0: a quarter)");
  app.add_option("--draft-k", k, "drafts per step at most")->capture_default_str();
  app.add_option("--temperature", temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_flag("!--fixed-k", adaptive, "draft k every step (no adaptive k)");
  app.add_option("--repeat", repeat, "runs of each case, alternating; the median is reported")
      ->capture_default_str()
      ->check(CLI::Range(1, 99));
  app.add_option("--json", json_path, "write the results here");
  bool trace = false;
  app.add_flag("--trace", trace, "log every drafting step's sizes and times (debug log)");
  EngineConfig ecfg;
  cli::add_engine_flags(&app, &ecfg);
  CLI11_PARSE(app, argc, argv);
  if (trace) log_set_level(LogLevel::debug);
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "bench_spec: %s\n", m.c_str());
    return 1;
  };
  // --draft-model (the engine flag, without --spec here): the proposer "model".
  const std::string draft_dir = ecfg.speculative.draft_model;
  ecfg.speculative.draft_model.clear();
  // --draft-vocab: the proposers named NAME-vocab run NAME's draft with that draft vocabulary.
  const std::string draft_vocab = ecfg.speculative.draft_vocab;
  const int64_t draft_vocab_size = ecfg.speculative.draft_vocab_size;
  ecfg.speculative.draft_vocab.clear();
  ecfg.speculative.draft_vocab_size = 0;
  if (Status s = cli::engine_flags_validate(ecfg); !s.ok()) return fail(s.message());
  if (!llama2c_bin.empty()) {
    model = (std::filesystem::temp_directory_path() / "bench_spec_llama2c").string();
    if (Status s = convert_llama2c(llama2c_bin, llama2c_tok, model); !s.ok()) return fail(s.message());
  }
  if (model.empty()) return fail("--model (an HF directory) or --llama2c is required");
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  Context ctx(co);
  const DType dt = dtype_s.empty() ? (co.device == Device::cuda ? DType::bf16 : DType::f32)
                                   : (dtype_s == "bf16" ? DType::bf16 : DType::f32);
  auto wr = model_load(model, co.device, dt, &ctx);
  if (!wr.ok()) return fail(wr.status().message());
  ModelWeights w = std::move(wr).value();
  auto tr = Tokenizer::load(model);
  if (!tr.ok()) return fail("the model directory needs a tokenizer.json for the GSM8K prompts: " + tr.status().message());
  auto tok = std::make_unique<Tokenizer>(std::move(tr).value());

  // Drafts, loaded once.
  if (layerskip <= 0) layerskip = std::max(1, w.config.n_layers / 4);
  auto lr = model_load(model, co.device, dt, &ctx);
  if (!lr.ok()) return fail(lr.status().message());
  ModelWeights skip = std::move(lr).value();
  skip.config.n_layers = std::min(layerskip, w.config.n_layers);
  skip.layers.resize(size_t(skip.config.n_layers));
  ModelWeights rnd = weights_random(w.config, co.device, dt, 4321, &ctx);
  ModelWeights trained_draft;
  if (!draft_dir.empty()) {
    auto dr = model_load(draft_dir, co.device, dt, &ctx);
    if (!dr.ok()) return fail("--draft-model: " + dr.status().message());
    trained_draft = std::move(dr).value();
  }

  std::vector<Case> cases;
  std::vector<std::string> drafts;
  {
    std::stringstream ss(drafts_s);
    std::string d;
    while (std::getline(ss, d, ','))
      if (!d.empty()) drafts.push_back(d);
  }
  auto base_of = [](const std::string& d) {
    const std::string suffix = "-vocab";
    return d.size() > suffix.size() && d.compare(d.size() - suffix.size(), suffix.size(), suffix) == 0
               ? d.substr(0, d.size() - suffix.size())
               : d;
  };
  for (const std::string& d : drafts) {
    const std::string b = base_of(d);
    if (b != "self" && b != "ngram" && b != "layerskip" && b != "random" && b != "model")
      return fail("--drafts: unknown proposer \"" + d +
                  "\" (use self, ngram, layerskip, random, model; NAME-vocab for a draft with --draft-vocab)");
    if (b == "model" && draft_dir.empty()) return fail("--drafts " + d + " needs --draft-model DIR");
    if (b != d && (b == "ngram" || draft_vocab.empty()))
      return fail("--drafts " + d + ": a -vocab proposer is a draft model run with --draft-vocab FILE");
  }
  std::vector<std::pair<int, int>> shapes;
  for (int s : parse_list(sizes_s)) shapes.push_back({s, 1});
  if (!grpo_s.empty()) {
    const size_t x = grpo_s.find('x');
    if (x == std::string::npos) return fail("--grpo " + grpo_s + ": expected BxG, e.g. 8x8");
    shapes.push_back({std::stoi(grpo_s.substr(0, x)), std::stoi(grpo_s.substr(x + 1))});
  }
  size_t max_prompts = 0;
  for (auto [b, g] : shapes) max_prompts = std::max(max_prompts, size_t(b));
  const auto questions = gsm8k_questions(gsm8k, max_prompts);
  if (questions.size() < max_prompts) return fail("--gsm8k " + gsm8k + ": fewer questions than prompts needed");

  std::printf("bench_spec: %s (%d layers, %lld params) on %s, %d new tokens, T = %.2f, k <= %d, adaptive %s, "
              "layerskip draft = first %d layers\n",
              model.c_str(), w.config.n_layers, (long long)w.config.n_params(), device.c_str(), new_tokens,
              temperature, k, adaptive ? "on" : "off", skip.config.n_layers);
  std::printf("%-10s %6s %6s %12s %12s %7s %10s %14s\n", "draft", "B", "G", "plain tok/s", "spec tok/s", "ratio",
              "acceptance", "drafting/steps");
  nlohmann::json rows = nlohmann::json::array();
  for (auto [B, G] : shapes) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < B; ++i) {
      const auto ids = tok->encode(questions[size_t(i)], /*add_special_tokens=*/true);
      prompts.emplace_back(ids.begin(), ids.end());
    }
    SamplingParams sp;
    sp.n = G;
    sp.temperature = temperature;
    sp.max_tokens = sp.min_tokens = new_tokens;
    sp.ignore_eos = true;
    sp.seed = 1;
    EngineConfig pc = ecfg;
    pc.speculative = SpeculativeConfig{};
    auto peo = cli::engine_flags_options(pc, co.device, w, &rnd, dt, std::max(64, B * G));
    if (!peo.ok()) return fail(peo.status().message());
    EngineOptions plain_eo = peo.value();
    plain_eo.max_num_seqs = std::max(plain_eo.max_num_seqs, B * G);
    // Engine options of every proposer (the same memory budget as plain decoding's).
    std::vector<EngineOptions> spec_eos;
    std::vector<const ModelWeights*> spec_ws;
    for (const std::string& name : drafts) {
      const std::string d = base_of(name);
      EngineConfig c = pc;
      c.speculative.method = d == "ngram" ? SpecMethod::ngram : SpecMethod::draft;
      if (d != name) {
        c.speculative.draft_vocab = draft_vocab;
        c.speculative.draft_vocab_size = draft_vocab_size;
      }
      c.speculative.num_speculative_tokens = k;
      c.speculative.adaptive = adaptive;
      if (d != "ngram") c.speculative.draft_model = d == "model" ? draft_dir : "bench_spec:" + d;  // loaded here
      spec_ws.push_back(d == "self"        ? &w
                        : d == "layerskip" ? &skip
                        : d == "random"    ? &rnd
                        : d == "model"     ? &trained_draft
                                           : nullptr);
      auto eo = cli::engine_flags_options(c, co.device, w, &rnd, dt, std::max(64, B * G));
      if (!eo.ok()) return fail(eo.status().message());
      EngineOptions seo = eo.value();
      seo.max_num_seqs = plain_eo.max_num_seqs;
      seo.kv_cache_bytes = plain_eo.kv_cache_bytes;
      spec_eos.push_back(seo);
    }
    std::vector<Timed> plain_runs;
    std::vector<std::vector<Timed>> spec_runs(drafts.size());
    for (int rep = 0; rep < repeat; ++rep) {
      auto plain = time_generate(ctx, w, tok.get(), plain_eo, nullptr, prompts, sp);
      if (!plain.ok()) return fail(plain.status().message());
      plain_runs.push_back(plain.value());
      for (size_t di = 0; di < drafts.size(); ++di) {
        auto spec = time_generate(ctx, w, tok.get(), spec_eos[di], spec_ws[di], prompts, sp);
        if (!spec.ok()) return fail(spec.status().message());
        spec_runs[di].push_back(spec.value());
      }
    }
    const Timed* plain = median_run(plain_runs);
    for (size_t di = 0; di < drafts.size(); ++di) {
      const std::string& d = drafts[di];
      const Timed* spec = median_run(spec_runs[di]);
      const double tp = plain->tokens / plain->seconds, ts = spec->tokens / spec->seconds;
      const double acc = spec->proposed ? double(spec->accepted) / double(spec->proposed) : 0.0;
      std::printf("%-10s %6d %6d %12.1f %12.1f %7.3f %10.3f %6lld/%-7lld\n", d.c_str(), B, G, tp, ts, ts / tp, acc,
                  (long long)spec->drafting_steps, (long long)spec->steps);
      if (spec->plain_ms > 0)
        std::printf("           plan costs (ms): plain %.3f, verify of B(k+1) %.3f, draft round %.3f, rest of a "
                    "drafting step %.3f\n",
                    spec->plain_ms, spec->verify_ms, spec->draft_ms, spec->overhead_ms);
      std::fflush(stdout);
      rows.push_back({{"draft", d}, {"prompts", B}, {"group", G}, {"sequences", B * G},
                      {"plain_tokens_per_s", tp}, {"spec_tokens_per_s", ts}, {"ratio", ts / tp},
                      {"acceptance", acc}, {"proposed", spec->proposed}, {"accepted", spec->accepted},
                      {"plain_steps", plain->steps}, {"spec_steps", spec->steps},
                      {"spec_drafting_steps", spec->drafting_steps},
                      {"plain_tokens_per_s_runs", rates(plain_runs)}, {"spec_tokens_per_s_runs", rates(spec_runs[di])},
                      {"plan_ms", {{"plain", spec->plain_ms}, {"verify", spec->verify_ms}, {"draft_round", spec->draft_ms},
                                   {"drafting_step_rest", spec->overhead_ms}}}});
    }
  }
  if (!json_path.empty()) {
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    nlohmann::json j = {{"bench", "spec"},
                        {"date", bench::today()},
                        {"device", device},
                        {"command", cmd},
                        {"config", {{"model", model}, {"new_tokens", new_tokens}, {"temperature", temperature},
                                    {"k", k}, {"adaptive", adaptive}, {"layerskip_layers", skip.config.n_layers},
                                    {"draft_vocab", draft_vocab}, {"draft_vocab_size", draft_vocab_size}}},
                        {"metrics", {{"cases", rows}}},
                        {"peer", {{"name", "plain decoding, same engine options"}}}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
