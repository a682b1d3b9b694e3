// Subcommand registry for the `grpo` binary. Each subcommand lives in its own
// file and registers itself with a static CommandRegistrar; main.cpp needs no
// edit to add one. setup() declares the options on the CLI11 subcommand and
// returns the function that runs it (returning the process exit code).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace grpo::cli {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App* sub)>;

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* help, CommandSetup setup);
};

// Prints "grpo <cmd>: error: <msg>" to stderr and returns exit code 1.
int fail(const std::string& cmd, const std::string& msg);

}  // namespace grpo::cli
