// The `grpo` binary: dispatches to the registered subcommands.
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "cli/command.h"

namespace grpo::cli {

namespace {
struct Entry {
  std::string name, help;
  CommandSetup setup;
};
std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* help, CommandSetup setup) {
  registry().push_back({name, help, std::move(setup)});
}

int fail(const std::string& cmd, const std::string& msg) {
  std::fprintf(stderr, "grpo %s: error: %s\n", cmd.c_str(), msg.c_str());
  return 1;
}

}  // namespace grpo::cli

int main(int argc, char** argv) {
  using namespace grpo::cli;
  CLI::App app{"grpo.cpp: GRPO post-training of LLMs in one native program (rollout engine + trainer)"};
  app.require_subcommand(1);
  std::map<CLI::App*, CommandRun> runs;
  for (auto& e : registry()) {
    CLI::App* sub = app.add_subcommand(e.name, e.help);
    runs[sub] = e.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  }
  for (auto& [sub, run] : runs)
    if (sub->parsed()) return run();
  return 1;
}
