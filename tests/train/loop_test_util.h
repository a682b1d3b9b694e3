// Shared helpers of the GRPO-loop tests: a tiny real model (the pretrained
// stories260K Llama, V = 512, converted to an HF directory once per process),
// a small arithmetic run config around it, temp dirs and metrics.jsonl reading.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/llama2c.h"
#include "train/run_config.h"

namespace grpo::test {

inline std::string make_temp_dir(const char* tag) {
  std::string t = std::string("/tmp/grpo_loop_") + tag + "_XXXXXX";
  char* d = mkdtemp(t.data());
  GRPO_CHECK(d != nullptr);
  return d;
}

// HF directory of stories260K (model + tokenizer files), converted once.
// Removed when the test process exits.
inline const std::string& tiny_model_dir() {
  struct Dir {
    std::string path;
    ~Dir() { std::filesystem::remove_all(path); }
  };
  static const Dir dir{make_temp_dir("model")};
  static const bool converted = [] {
    const std::string src = std::string(GRPO_SHARED_DIR) + "/data/models/stories260K";
    Status s = convert_llama2c(src + "/stories260K.bin", src + "/tok512.bin", dir.path);
    GRPO_CHECK_MSG(s.ok(), s.message().c_str());
    return true;
  }();
  (void)converted;
  return dir.path;
}

// A few-second run on the CPU: B = 2 prompts × G = 4 samples, 12 new tokens,
// a length reward next to correctness so that groups have reward spread
// (non-zero advantages, so the weights really move).
inline std::string tiny_config_toml(const std::string& model_dir, int steps) {
  return "[model]\npath = \"" + model_dir + "\"\ndtype = \"f32\"\ndevice = \"cpu\"\n"
         "[data]\nenv = \"arithmetic\"\nseed = 3\n"
         "[data.arithmetic]\ndifficulty = 0\ntrain_size = 1000\ntest_size = 20\n"
         "[rollout]\nnum_generations = 4\nprompts_per_step = 2\nmax_new_tokens = 12\nseed = 7\n"
         "[train]\nsteps = " + std::to_string(steps) + "\nlr = 3e-3\nlr_schedule = \"linear\"\nmicro_batch = 3\n"
         "loss_type = \"dapo\"\nepsilon_high = 0.28\n"
         "[eval]\nevery = 2\nn_prompts = 3\nmax_new_tokens = 8\n"
         "[checkpoint]\nevery = 2\nkeep_last = 2\n"
         "[log]\nprogress = \"off\"\ntensorboard = true\nlevel = \"warn\"\n"
         "[[reward]]\nname = \"correct\"\nweight = 1.0\n"
         "[[reward]]\nname = \"length_linear\"\nweight = 1.0\ntarget = 8\nscale = 64\nunit = \"chars\"\n";
}

inline RunConfig tiny_config(int steps, const std::vector<std::string>& sets = {}) {
  auto c = run_config_parse(tiny_config_toml(tiny_model_dir(), steps), "tiny.toml", sets);
  GRPO_CHECK_MSG(c.ok(), c.status().message().c_str());
  return c.value();
}

// metrics.jsonl records: step records (those with "loss") and eval records separately.
struct MetricsFile {
  std::vector<nlohmann::json> steps, evals;
};
inline MetricsFile read_metrics(const std::string& path) {
  MetricsFile m;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    (j.contains("loss") ? m.steps : m.evals).push_back(j);
  }
  return m;
}

}  // namespace grpo::test
