// `grpo sft` end to end through the binary: a tiny model (init-model with the
// GPT-2 tokenizer) fits four prompt/completion pairs and is saved in HF
// format; bad JSONL lines are reported with their line number.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "model/checkpoint.h"

namespace fs = std::filesystem;

namespace {
struct TmpDir {
  std::string path;
  TmpDir() {
    path = (fs::temp_directory_path() / ("grpo_sft_test_" + std::to_string(getpid()))).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int sh(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string bin() { return GRPO_BINARY_PATH; }

// Writes a tiny f32 llama model with the GPT-2 tokenizer into dir/model.
void make_model(const TmpDir& t) {
  const std::string cmd = bin() + " init-model --preset tiny-llama --dtype f32 --seed 3 --out " + t.path +
                          "/model --tokenizer-dir " + GRPO_SHARED_DIR + "/data/tokenizers/gpt2 > " + t.path +
                          "/init.log 2>&1";
  ASSERT_EQ(sh(cmd), 0) << slurp(t.path + "/init.log");
}
}  // namespace

TEST(CmdSft, FitsAndSavesACheckpoint) {
  TmpDir t;
  make_model(t);
  {
    std::ofstream f(t.path + "/data.jsonl");
    f << R"({"prompt": "Q: two plus two?", "completion": " A: four"})" << "\n";
    f << R"({"prompt": "Q: one plus one?", "completion": " A: two"})" << "\n";
    f << "\n";  // blank lines are ignored
    f << R"({"prompt": "Q: capital of France?", "completion": " A: Paris"})" << "\n";
    f << R"({"prompt": "Q: colour of the sky?", "completion": " A: blue"})" << "\n";
  }
  const std::string cmd = bin() + " sft --model " + t.path + "/model --data " + t.path + "/data.jsonl --out " + t.path +
                          "/out --epochs 20 --batch-size 4 --micro-tokens 16 --lr 1e-2 --lr-scheduler cosine "
                          "--warmup-steps 2 --weight-decay 0.01 --threads 1 > " + t.path + "/sft.log 2>&1";
  ASSERT_EQ(sh(cmd), 0) << slurp(t.path + "/sft.log");
  const std::string log = slurp(t.path + "/sft.log");
  std::regex re("loss ([0-9.]+)");
  std::vector<double> losses;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    losses.push_back(std::stod((*it)[1]));
  ASSERT_EQ(losses.size(), 20u) << log;
  EXPECT_LT(losses.back(), 0.3 * losses.front()) << log;
  EXPECT_TRUE(fs::exists(t.path + "/out/config.json"));
  EXPECT_TRUE(fs::exists(t.path + "/out/tokenizer.json"));
  auto w = grpo::model_load(t.path + "/out", grpo::Device::cpu, grpo::DType::f32);
  EXPECT_TRUE(w.ok()) << w.status().message();
}

TEST(CmdSft, BadLinesNameTheirLineNumber) {
  TmpDir t;
  make_model(t);
  {
    std::ofstream f(t.path + "/bad.jsonl");
    f << R"({"prompt": "a", "completion": "b"})" << "\n";
    f << R"({"prompt": "a", "completion": )" << "\n";  // line 2: broken JSON
  }
  const std::string base = bin() + " sft --model " + t.path + "/model --out " + t.path + "/out --data ";
  EXPECT_NE(sh(base + t.path + "/bad.jsonl 2> " + t.path + "/err.log"), 0);
  EXPECT_NE(slurp(t.path + "/err.log").find("bad.jsonl:2"), std::string::npos) << slurp(t.path + "/err.log");
  {
    std::ofstream f(t.path + "/nofield.jsonl");
    f << R"({"prompt": "a", "completion": "b"})" << "\n";
    f << R"({"prompt": "a", "answer": "b"})" << "\n";  // line 2: no completion
  }
  EXPECT_NE(sh(base + t.path + "/nofield.jsonl 2> " + t.path + "/err2.log"), 0);
  const std::string err2 = slurp(t.path + "/err2.log");
  EXPECT_NE(err2.find("nofield.jsonl:2"), std::string::npos) << err2;
  EXPECT_NE(err2.find("completion"), std::string::npos) << err2;
  EXPECT_FALSE(fs::exists(t.path + "/out"));
}
