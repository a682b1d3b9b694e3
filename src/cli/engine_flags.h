// Engine flags shared by the subcommands that run the engine (`grpo generate`, and
// `grpo serve` where it exists): speculative decoding ([engine.speculative]).
#pragma once
#include <memory>
#include <string>

#include "core/context.h"
#include "core/status.h"
#include "engine/speculative.h"
#include "model/weights.h"

namespace CLI {
class App;
}

namespace grpo::cli {

struct SpecFlags {
  std::string method = "off";  // --spec off|draft|ngram
  std::string draft_model;     // --draft-model DIR
  int k = 4;                   // --num-speculative-tokens / --k
  int ngram_min = 1, ngram_max = 4;
  bool no_adaptive = false;
};

void add_spec_flags(CLI::App* sub, SpecFlags* f);
// Fills opt.speculative-style options from the flags; errors name the flag.
Result<SpeculativeOptions> spec_options_from_flags(const SpecFlags& f);
// Loads the draft model of method draft (nullptr otherwise), checked against the target.
Result<std::unique_ptr<ModelWeights>> spec_load_draft(const SpeculativeOptions& o, const ModelConfig& target,
                                                     int max_model_len, Context& ctx, DType dt);

}  // namespace grpo::cli
