// Engine flags shared by the engine-running subcommands (see engine_flags.h).
#include "cli/engine_flags.h"

#include <CLI/CLI.hpp>

#include "model/checkpoint.h"

namespace grpo::cli {

void add_spec_flags(CLI::App* sub, SpecFlags* f) {
  sub->add_option("--spec", f->method, "Speculative decoding: off, draft (needs --draft-model) or ngram (prompt lookup)")
      ->check(CLI::IsMember({"off", "draft", "ngram"}));
  sub->add_option("--draft-model", f->draft_model, "Draft model directory (same vocabulary as the model)");
  sub->add_option("--num-speculative-tokens,--k", f->k, "Draft tokens per step at most");
  sub->add_option("--ngram-min", f->ngram_min, "Prompt lookup: shortest suffix matched");
  sub->add_option("--ngram-max", f->ngram_max, "Prompt lookup: longest suffix matched");
  sub->add_flag("--no-adaptive-spec", f->no_adaptive, "Always draft k tokens (no cost model)");
}

Result<SpeculativeOptions> spec_options_from_flags(const SpecFlags& f) {
  SpeculativeOptions o;
  GRPO_ASSIGN_OR_RETURN(o.method, spec_method_from_string(f.method));
  o.draft_model = f.draft_model;
  o.num_speculative_tokens = f.k;
  o.ngram_min = f.ngram_min;
  o.ngram_max = f.ngram_max;
  o.adaptive = !f.no_adaptive;
  if (o.method == SpecMethod::draft && o.draft_model.empty())
    return error_status("--spec draft needs --draft-model DIR (a model with the same vocabulary), or use --spec ngram");
  if (o.method != SpecMethod::draft && !o.draft_model.empty())
    return error_status("--draft-model is set but --spec is \"" + f.method + "\"; add --spec draft");
  Status s = o.validate();
  if (!s.ok()) return s.with_context("flags --k / --ngram-min / --ngram-max");
  return o;
}

Result<std::unique_ptr<ModelWeights>> spec_load_draft(const SpeculativeOptions& o, const ModelConfig& target,
                                                     int max_model_len, Context& ctx, DType dt) {
  if (o.method != SpecMethod::draft) return std::unique_ptr<ModelWeights>{};
  auto w = model_load(o.draft_model, ctx.device(), dt, &ctx);
  if (!w.ok()) return w.status().with_context("engine.speculative.draft_model " + o.draft_model);
  GRPO_TRY(spec_check_draft(target, w.value().config, max_model_len));
  return std::make_unique<ModelWeights>(std::move(w).value());
}

}  // namespace grpo::cli
