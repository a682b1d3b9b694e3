// Helpers for the remote reward tests: a temporary directory, scoring inputs
// and a remote function built from a parameter table.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "env/rewards.h"

namespace grpo::remote_test {

struct TmpDir {
  std::string path;
  TmpDir() {
    static std::atomic<int> n{0};
    path = (std::filesystem::temp_directory_path() /
            ("grpo_remote_reward_" + std::to_string(getpid()) + "_" + std::to_string(n++)))
               .string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& content) const {
    std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
};

// Completions with their examples and telemetry, kept alive for RewardInput views.
struct Batch {
  std::vector<std::string> prompts, completions;
  std::vector<Example> examples;
  std::vector<Telemetry> tels;
  std::vector<RewardInput> inputs() const {
    std::vector<RewardInput> in;
    for (size_t i = 0; i < completions.size(); ++i) in.push_back({prompts[i], completions[i], &examples[i], &tels[i]});
    return in;
  }
  void add(const std::string& prompt, const std::string& completion, const std::string& answer) {
    prompts.push_back(prompt);
    completions.push_back(completion);
    Example ex;
    ex.id = "t/" + std::to_string(examples.size());
    ex.question = "q" + std::to_string(examples.size());
    ex.answer = answer;
    ex.meta = {{"level", int(examples.size())}};
    examples.push_back(ex);
    Telemetry t;
    t.n_tokens = int64_t(completion.size());
    tels.push_back(t);
  }
};

inline bool have_python() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

}  // namespace grpo::remote_test
