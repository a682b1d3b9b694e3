// `grpo init-model`: writes a randomly initialised HF model from a preset.
// Qwen presets ship the shared Qwen2 tokenizer by default, found next to the
// repository (../shared/data/tokenizers, located from /proc/self/exe).
#include <filesystem>
#include <string>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "core/context.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/presets.h"

namespace fs = std::filesystem;

namespace {

// The repository root above the running binary (a folder with CMakeLists.txt and src/model), or "".
std::string repo_root_from_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (p = p.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
    if (fs::exists(p / "CMakeLists.txt") && fs::is_directory(p / "src" / "model")) return p.string();
  return "";
}

// A folder holding tokenizer files: `dir` itself, or its preset sub-folder (e.g. dir/qwen2).
std::string resolve_tokenizer_dir(const std::string& dir, const std::string& preset) {
  if (fs::exists(fs::path(dir) / "tokenizer.json")) return dir;
  std::string sub = grpo::preset_tokenizer_subdir(preset);
  if (!sub.empty() && fs::exists(fs::path(dir) / sub / "tokenizer.json")) return (fs::path(dir) / sub).string();
  return "";
}

std::span<const grpo::EnumName<grpo::DType>> stored_dtype_names() {
  static constexpr grpo::EnumName<grpo::DType> n[] = {{"bf16", grpo::DType::bf16}, {"f32", grpo::DType::f32}};
  return n;
}

struct Args {
  std::string preset, out, tokenizer_dir;
  grpo::DType dtype = grpo::DType::bf16;
  uint64_t seed = 0;
  int vocab = 0, layers = 0, hidden = 0, threads = 0;
  bool no_tokenizer = false;
};

grpo::cli::CommandRegistrar reg("init-model", "Write a randomly initialised Hugging Face model from a preset",
                                [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  std::string names;
  for (const auto& n : grpo::preset_names()) names += (names.empty() ? "" : ", ") + n;
  sub->add_option("--preset", a->preset, "Model shape: " + names)->required();
  sub->add_option("--out", a->out, "Output directory")->required();
  sub->add_option("--seed", a->seed, "RNG seed (same seed, same weights)");
  grpo::cli::add_enum(sub, "--dtype", &a->dtype, stored_dtype_names(), "Stored dtype");
  sub->add_option("--tokenizer-dir", a->tokenizer_dir,
                  "Tokenizer files to ship (a folder with tokenizer.json, or shared/data/tokenizers); "
                  "tiny presets take its vocabulary size");
  sub->add_flag("--no-tokenizer", a->no_tokenizer, "Write no tokenizer files");
  sub->add_option("--vocab-size", a->vocab, "Override vocab_size (tests)");
  sub->add_option("--layers", a->layers, "Override num_hidden_layers (tests)");
  sub->add_option("--hidden", a->hidden, "Override hidden_size (tests)");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all)");
  return [a]() {
    grpo::InitModelOptions o;
    o.preset = a->preset;
    o.out_dir = a->out;
    o.seed = a->seed;
    o.dtype = a->dtype;
    o.overrides = {a->vocab, a->layers, a->hidden};
    if (!a->no_tokenizer) {
      if (!a->tokenizer_dir.empty()) {
        o.tokenizer_dir = resolve_tokenizer_dir(a->tokenizer_dir, a->preset);
        if (o.tokenizer_dir.empty())
          return grpo::cli::fail("init-model", "--tokenizer-dir " + a->tokenizer_dir + " has no tokenizer.json");
      } else if (!grpo::preset_tokenizer_subdir(a->preset).empty()) {
        std::string root = repo_root_from_exe();
        std::string shared = root.empty() ? "" : (fs::path(root).parent_path() / "shared" / "data" / "tokenizers").string();
        o.tokenizer_dir = shared.empty() ? "" : resolve_tokenizer_dir(shared, a->preset);
        if (o.tokenizer_dir.empty())
          GRPO_LOG_WARN("init-model: no tokenizer found next to the repository; pass --tokenizer-dir (writing none)");
      }
    }
    grpo::ContextOptions co;
    co.n_threads = a->threads;
    grpo::Context ctx(co);
    double t0 = grpo::now_seconds();
    grpo::Status s = grpo::init_model_write(o, &ctx);
    if (!s.ok()) return grpo::cli::fail("init-model", s.message());
    std::printf("wrote %s (preset %s, seed %llu, %s%s%s) in %.2f s\n", o.out_dir.c_str(), o.preset.c_str(),
                (unsigned long long)o.seed, grpo::dtype_name(a->dtype), o.tokenizer_dir.empty() ? "" : ", tokenizer from ",
                o.tokenizer_dir.c_str(), grpo::now_seconds() - t0);
    return 0;
  };
});

}  // namespace
