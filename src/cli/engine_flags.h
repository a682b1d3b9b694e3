// The engine flags shared by the subcommands that run the rollout engine
// (`grpo generate`, `grpo serve`): one CLI11 option per EngineConfig field
// (engine/engine_config.h), with the same names as the [engine] config keys
// (block_size -> --block-size) and the same allowed lists.
#pragma once
#include <CLI/CLI.hpp>

#include "engine/engine_config.h"

namespace grpo::cli {

// Registers the flags on `app`, writing into *cfg (which must outlive the parse).
// Defaults are cfg's values at the call. Call engine_flags_validate after parsing.
void add_engine_flags(CLI::App* app, EngineConfig* cfg);

// cfg.validate() with flag names instead of config keys ("--block-size = 0: ...").
Status engine_flags_validate(const EngineConfig& cfg);

}  // namespace grpo::cli
