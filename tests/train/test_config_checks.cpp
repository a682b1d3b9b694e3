// Settings the kernels cannot run, and the loss-family keys, are refused when
// a run is set up -- as config errors naming the key and what to set -- rather
// than aborting at the first op: `grpo train` configs, and the `grpo generate`
// / `grpo sft` flags through the binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "train/run_config.h"

using namespace grpo;
namespace fs = std::filesystem;

namespace {

std::string parse_error(const std::vector<std::string>& sets) {
  auto c = run_config_parse("", "test.toml", sets);
  return c.ok() ? std::string() : c.status().message();
}

void expect_error(const std::vector<std::string>& sets, const std::vector<std::string>& parts) {
  const std::string e = parse_error(sets);
  ASSERT_FALSE(e.empty()) << "accepted: " << ::testing::PrintToString(sets);
  for (const auto& p : parts) EXPECT_NE(e.find(p), std::string::npos) << "'" << p << "' not in: " << e;
}

struct TmpDir {
  std::string path;
  TmpDir() {
    path = (fs::temp_directory_path() / ("grpo_cfgcheck_test_" + std::to_string(getpid()))).string();
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

// Runs the binary with stderr+stdout into a file; returns the exit status and fills `out`.
int run_grpo(const TmpDir& t, const std::string& args, std::string* out) {
  const std::string log = t.path + "/out.log";
  const int st = std::system((std::string(GRPO_BINARY_PATH) + " " + args + " > " + log + " 2>&1").c_str());
  *out = slurp(log);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(ConfigChecks, ModelDtypeMustRunOnTheDevice) {
  expect_error({"model.device=cpu"}, {"model.dtype = \"bf16\"", "CPU backend runs f32 only", "model.dtype = \"f32\""});
  expect_error({"model.device=cpu", "model.dtype=f16"}, {"model.dtype = \"f16\"", "f32"});
  expect_error({"model.device=cuda:1", "model.dtype=f16"}, {"model.dtype = \"f16\"", "bf16 or f32", "\"bf16\""});
  EXPECT_EQ(parse_error({"model.device=cpu", "model.dtype=f32"}), "");
  EXPECT_EQ(parse_error({"model.device=cuda", "model.dtype=bf16"}), "");
  EXPECT_EQ(parse_error({"model.device=cuda", "model.dtype=f32"}), "");
}

TEST(ConfigChecks, LossFamilyKeys) {
  EXPECT_EQ(parse_error({"train.loss_type=cispo", "train.epsilon_high=5"}), "");
  expect_error({"train.loss_type=cispo"}, {"train.epsilon_high = 0", "cispo", ">= 1"});
  expect_error({"train.loss_type=cispo", "train.epsilon_high=0.28"}, {"train.epsilon_high = 0.28"});
  EXPECT_EQ(parse_error({"train.importance_sampling_level=sequence"}), "");
  expect_error({"train.importance_sampling_level=seq"},
               {"train.importance_sampling_level = \"seq\"", "token, sequence"});
  auto c = run_config_parse("", "test.toml", {"train.importance_sampling_level=sequence", "train.loss_type=cispo",
                                               "train.epsilon_high=5"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  // The resolved config written to the run directory parses back to the same values.
  auto back = run_config_parse(run_config_to_toml(c.value()), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->train.importance_sampling_level, IsLevel::sequence);
  EXPECT_EQ(back->train.loss_type, LossType::cispo);
}

TEST(ConfigChecks, CommandsRefuseDtypesTheCpuCannotRun) {
  TmpDir t;
  std::string out;
  // The dtype is refused before the (missing) model is looked at.
  const std::string missing = t.path + "/no-model";
  EXPECT_NE(run_grpo(t, "generate --model " + missing + " --prompt hi --device cpu --dtype bf16", &out), 0);
  EXPECT_NE(out.find("--dtype"), std::string::npos) << out;
  EXPECT_NE(out.find("f32"), std::string::npos) << out;
  EXPECT_EQ(out.find("no-model"), std::string::npos) << out;
  EXPECT_NE(run_grpo(t, "generate --model " + missing + " --prompt hi --device cpu --dtype f16", &out), 0);
  EXPECT_NE(out.find("--dtype"), std::string::npos) << out;

  std::ofstream(t.path + "/d.jsonl") << "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  EXPECT_NE(run_grpo(t, "sft --model " + missing + " --data " + t.path + "/d.jsonl --out " + t.path +
                            "/o --device cpu --dtype bf16", &out), 0);
  EXPECT_NE(out.find("--dtype f32"), std::string::npos) << out;
  EXPECT_NE(run_grpo(t, "sft --model " + missing + " --data " + t.path + "/d.jsonl --out " + t.path +
                            "/o --device cpu --dtype f16", &out), 0);
  EXPECT_NE(out.find("--dtype"), std::string::npos) << out;

  std::ofstream(t.path + "/run.toml") << "[model]\npath = \"" << missing << "\"\ndevice = \"cpu\"\n";
  EXPECT_NE(run_grpo(t, "train " + t.path + "/run.toml", &out), 0);
  EXPECT_NE(out.find("model.dtype = \"bf16\""), std::string::npos) << out;
  EXPECT_NE(out.find("model.dtype = \"f32\""), std::string::npos) << out;
  EXPECT_EQ(out.find("Aborted"), std::string::npos) << out;
}

// Enum-like flags parse through one name table each: a bad name is a usage
// error naming the flag, the value and the allowed names.
TEST(ConfigChecks, CommandFlagsNameTheirAllowedValues) {
  TmpDir t;
  struct Case {
    std::string args, allowed;
  };
  const std::string m = t.path + "/no-model", o = t.path + "/out";
  const std::vector<Case> cases = {
      {"generate --model " + m + " --prompt hi --device gpu", "'gpu' is not one of cpu, cuda"},
      {"generate --model " + m + " --prompt hi --dtype f16", "'f16' is not one of f32, bf16"},
      {"serve --model " + m + " --device tpu", "'tpu' is not one of cpu, cuda"},
      {"sft --model " + m + " --data d.jsonl --out " + o + " --dtype fp8", "'fp8' is not one of f32, bf16"},
      {"make-data arithmetic --out " + o + " --split dev", "'dev' is not one of train, test"},
      {"make-data arithmetic --out " + o + " --style fancy", "'fancy' is not one of compact, verbose, expression"},
      {"merge-lora --model " + m + " --lora l --out " + o + " --dtype f8", "'f8' is not one of as_loaded, bf16, f16, f32"},
      {"init-model --preset tiny-llama --out " + o + " --dtype f16", "'f16' is not one of bf16, f32"},
      {"tokenize --tokenizer " + m + " --text hi --on-error ignore", "'ignore' is not one of fail, skip"},
  };
  for (const auto& c : cases) {
    std::string out;
    EXPECT_NE(run_grpo(t, c.args, &out), 0) << c.args;
    EXPECT_NE(out.find(c.allowed), std::string::npos) << c.args << "\n" << out;
  }
}
