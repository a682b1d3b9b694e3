// The engine flags shared by the subcommands that run the rollout engine
// (`grpo generate`, `grpo serve`): one CLI11 option per EngineConfig field
// (engine/engine_config.h), with the same names as the [engine] config keys
// (block_size -> --block-size) and the same allowed lists. [engine.speculative]
// has shorter flags: --spec (method), --draft-model, --num-speculative-tokens (--k),
// --ngram-min, --ngram-max, --no-adaptive-spec, --spec-probe-every.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>

#include "core/context.h"
#include "engine/engine_config.h"
#include "model/weights.h"

namespace grpo::cli {

// Registers the flags on `app`, writing into *cfg (which must outlive the parse).
// Defaults are cfg's values at the call. Call engine_flags_validate after parsing.
void add_engine_flags(CLI::App* app, EngineConfig* cfg);

// cfg.validate() with flag names instead of config keys ("--block-size = 0: ...",
// "--num-speculative-tokens = 0: ...").
Status engine_flags_validate(const EngineConfig& cfg);

// The draft model of --spec draft (nullptr for the other methods), loaded on ctx's
// device in dtype dt and checked against the target (engine/speculative.h).
Result<std::unique_ptr<ModelWeights>> engine_flags_load_draft(const EngineConfig& cfg, const ModelConfig& target,
                                                              Context& ctx, DType dt);

// The EngineOptions of a command's engine for model `w` (plus the draft, if any):
// the flags' config with the device memory already in use counted against the KV
// budget on CUDA, and `default_max_num_seqs` where --max-num-seqs is not given.
Result<EngineOptions> engine_flags_options(const EngineConfig& cfg, Device dev, const ModelWeights& w,
                                           const ModelWeights* draft, DType dt, int default_max_num_seqs);

}  // namespace grpo::cli
