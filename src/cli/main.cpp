// The `grpo` binary: dispatches to the registered subcommands. An unknown
// command is an error naming the known ones, even next to --help (CLI11 would
// otherwise print the top-level help for `grpo typo --help` and exit 0).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
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

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The first argument that is not an option must name a command: the top-level
// app has no options that take values. Returns the error text, or "" when fine.
std::string check_command(int argc, char** argv) {
  std::string cmd;
  for (int i = 1; i < argc && cmd.empty(); ++i)
    if (argv[i][0] != '-') cmd = argv[i];
  if (cmd.empty()) return "";
  std::vector<std::string> known;
  for (const auto& e : registry()) known.push_back(e.name);
  std::sort(known.begin(), known.end());
  if (std::find(known.begin(), known.end(), cmd) != known.end()) return "";
  std::string msg = "unknown command '" + cmd + "'; the commands are:";
  std::string best;
  size_t best_d = 3;  // suggest only close misspellings
  for (const auto& k : known) {
    msg += " " + k;
    if (size_t d = edit_distance(cmd, k); d < best_d) best_d = d, best = k;
  }
  if (!best.empty()) msg += " (did you mean '" + best + "'?)";
  return msg + ". Run `grpo --help` for what each does, `grpo <command> --help` for its options";
}

}  // namespace

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
  if (std::string err = check_command(argc, argv); !err.empty()) {
    std::fprintf(stderr, "grpo: error: %s\n", err.c_str());
    return 1;
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
