// `grpo convert <format>`: converts foreign checkpoints into HF directories.
// Formats: llama2c (Karpathy's llama2.c legacy .bin + tokenizer .bin).
#include <string>

#include "cli/command.h"
#include "core/timer.h"
#include "model/llama2c.h"

namespace {

struct Args {
  std::string model, tokenizer, out;
};

grpo::cli::CommandRegistrar reg("convert", "Convert a checkpoint of another format into a Hugging Face directory",
                                [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->require_subcommand(1);
  CLI::App* l2c = sub->add_subcommand("llama2c", "llama2.c legacy checkpoint (e.g. stories260K.bin + tok512.bin)");
  l2c->add_option("--model", a->model, "llama2.c checkpoint (.bin)")->required()->check(CLI::ExistingFile);
  l2c->add_option("--tokenizer", a->tokenizer, "llama2.c tokenizer (.bin)")->required()->check(CLI::ExistingFile);
  l2c->add_option("--out", a->out, "Output directory")->required();
  return [a, l2c]() {
    if (!l2c->parsed()) return grpo::cli::fail("convert", "name a format: llama2c");
    double t0 = grpo::now_seconds();
    grpo::Status s = grpo::convert_llama2c(a->model, a->tokenizer, a->out);
    if (!s.ok()) return grpo::cli::fail("convert", s.message());
    std::printf("wrote %s in %.2f s\n", a->out.c_str(), grpo::now_seconds() - t0);
    return 0;
  };
});

}  // namespace
