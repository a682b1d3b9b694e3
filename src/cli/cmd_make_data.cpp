// `grpo make-data arithmetic`: writes examples of the synthetic arithmetic
// environment as JSONL ({"id","prompt","completion","answer"} per line), the
// SFT warm-up data of the embedded demo model (tools/demo/make_demo_model.sh).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "env/arithmetic.h"
#include "train/run_config.h"

namespace {

std::span<const grpo::EnumName<grpo::Split>> split_names() {
  static constexpr grpo::EnumName<grpo::Split> n[] = {{"train", grpo::Split::train}, {"test", grpo::Split::test}};
  return n;
}

struct Opts {
  std::string env = "arithmetic";
  grpo::Split split = grpo::Split::train;
  std::string out;
  size_t n = 1000;
  size_t offset = 0;
  uint64_t seed = 1;
  int difficulty = 1;
  grpo::ArithmeticStyle style = grpo::ArithmeticStyle::compact;
  std::string prompt_suffix = "\n";
};

int run(const Opts& o) {
  const std::string cmd = "make-data";
  grpo::ArithmeticConfig cfg;
  cfg.seed = o.seed;
  cfg.difficulty = o.difficulty;
  cfg.style = o.style;
  cfg.train_size = std::max(cfg.train_size, o.offset + o.n);
  grpo::Status st = cfg.validate();
  if (!st.ok()) return grpo::cli::fail(cmd, st.message());
  grpo::ArithmeticEnv env(cfg);
  const grpo::Split split = o.split;
  size_t avail = env.size(split);
  if (o.offset >= avail) return grpo::cli::fail(cmd, "--offset is past the end of the split");
  size_t n = std::min(o.n, avail - o.offset);
  std::ofstream f(o.out + ".tmp");
  if (!f) return grpo::cli::fail(cmd, "cannot write " + o.out + ".tmp (does the folder exist?)");
  for (size_t i = o.offset; i < o.offset + n; ++i) {
    grpo::Example ex = env.example(split, i);
    nlohmann::json j = {{"id", ex.id},
                        {"prompt", ex.question + o.prompt_suffix},
                        {"completion", env.reference_completion(ex)},
                        {"answer", ex.answer}};
    f << j.dump() << "\n";
  }
  f.close();
  if (!f || std::rename((o.out + ".tmp").c_str(), o.out.c_str()) != 0)
    return grpo::cli::fail(cmd, "failed to write " + o.out);
  std::printf("wrote %zu %s examples to %s\n", n, grpo::enum_name(split_names(), o.split), o.out.c_str());
  return 0;
}

grpo::cli::CommandRegistrar reg("make-data", "Write examples of a synthetic environment as JSONL (SFT data)",
                                [](CLI::App* sub) {
                                  auto o = std::make_shared<Opts>();
                                  sub->add_option("env", o->env, "environment (arithmetic)")
                                      ->check(CLI::IsMember({"arithmetic"}));
                                  sub->add_option("--out", o->out, "output .jsonl")->required();
                                  grpo::cli::add_enum(sub, "--split", &o->split, split_names(), "Split");
                                  sub->add_option("-n,--n", o->n, "number of examples");
                                  sub->add_option("--offset", o->offset, "first example index");
                                  sub->add_option("--seed", o->seed, "environment seed");
                                  sub->add_option("--difficulty", o->difficulty, "0..3");
                                  grpo::cli::add_enum(sub, "--style", &o->style, grpo::arithmetic_style_names(), "Problem style");
                                  sub->add_option("--prompt-suffix", o->prompt_suffix,
                                                  "text appended to each prompt (default newline)");
                                  return [o]() { return run(*o); };
                                });

}  // namespace
