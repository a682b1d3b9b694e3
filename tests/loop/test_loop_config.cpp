// `grpo train` refuses bad configs before any work (no run directory, no
// model load), with a message naming the key; the shipped example configs
// parse; and training-state checkpoint bookkeeping (state JSON round trip,
// which directories count as complete checkpoints).
#include <filesystem>
#include <fstream>

#include "loop_test_util.h"
#include "model/safetensors.h"
#include "train/checkpoint_state.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

struct CmdResult {
  int code = -1;
  std::string output;  // stdout + stderr
};

CmdResult run_grpo(const std::string& args) {
  const std::string log = make_temp_dir("cmd") + "/out.txt";
  const std::string cmd = std::string(GRPO_BINARY_PATH) + " " + args + " > " + log + " 2>&1";
  CmdResult r;
  int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(log);
  r.output.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  fs::remove_all(fs::path(log).parent_path());
  return r;
}

std::string write_config(const std::string& dir, const std::string& text) {
  std::string p = dir + "/run.toml";
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(TrainConfig, UnknownKeyFailsBeforeAnyWork) {
  const std::string dir = make_temp_dir("cfg");
  std::string text = tiny_config_toml(tiny_model_dir(), 2);
  text.insert(text.find("[train]\n") + 8, "learning_rate = 1e-5\n");
  const std::string out = dir + "/run";
  CmdResult r = run_grpo("train " + write_config(dir, text) + " --out " + out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("learning_rate"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[train]"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "the run directory must not be created for a bad config";
  fs::remove_all(dir);
}

TEST(TrainConfig, BadOverrideAndMissingModelFailBeforeAnyWork) {
  const std::string dir = make_temp_dir("cfg2");
  const std::string cfg = write_config(dir, tiny_config_toml(tiny_model_dir(), 2));
  CmdResult r = run_grpo("train " + cfg + " --out " + dir + "/a --set train.lr=-1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("train.lr"), std::string::npos) << r.output;
  r = run_grpo("train " + cfg + " --out " + dir + "/b --set model.path=/nonexistent/model");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("model.path"), std::string::npos) << r.output;
  r = run_grpo("train " + cfg + " --out " + dir + "/c --set rollout.nucleus=0.9");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("nucleus"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/a") || fs::exists(dir + "/b") || fs::exists(dir + "/c"));
  fs::remove_all(dir);
}

TEST(TrainConfig, PrintConfigShowsOverrides) {
  const std::string dir = make_temp_dir("cfg3");
  const std::string cfg = write_config(dir, tiny_config_toml(tiny_model_dir(), 2));
  CmdResult r = run_grpo("train " + cfg + " --set train.lr=0.25 --print-config");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("lr = 0.25"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TrainConfig, ExampleConfigsParse) {
  for (const char* name : {"default.toml", "gsm8k-qwen2.5.toml", "tandem.toml", "gsm8k-tandem-qwen2.5.toml"}) {
    const std::string p = std::string(GRPO_SOURCE_DIR) + "/examples/" + name;
    auto text = read_file(p);
    ASSERT_TRUE(text.ok()) << p;
    auto c = run_config_parse(text.value(), p);  // no file checks: the models are not in the test tree
    EXPECT_TRUE(c.ok()) << c.status().message();
  }
}

TEST(CheckpointState, JsonRoundTrip) {
  TrainerState s;
  s.step = 12;
  s.generation = 6;
  s.data_epoch = 1;
  s.data_index = 17;
  s.data_seed = 3;
  s.rollout_seed = 9;
  s.has_best = true;
  s.best_metric = 0.625;
  s.best_step = 10;
  s.evals_without_improvement = 1;
  s.lr_schedule = "cosine";
  s.lr = 1e-6;
  s.warmup_steps = 2;
  s.total_steps = 100;
  s.last_lr = 9.5e-7;
  s.mid_generation = true;
  auto back = trainer_state_from_json(nlohmann::json::parse(trainer_state_to_json(s).dump()), "state");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(trainer_state_to_json(back.value()).dump(), trainer_state_to_json(s).dump());
  auto bad = trainer_state_from_json(nlohmann::json{{"step", 1}}, "state.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("state.json"), std::string::npos);
}

TEST(CheckpointState, OnlyCompleteCheckpointsAreListed) {
  const std::string dir = make_temp_dir("list");
  auto make = [&](const std::string& name, bool state, bool optim) {
    fs::create_directories(dir + "/" + name);
    if (state) std::ofstream(dir + "/" + name + "/trainer_state.json") << "{}";
    if (optim) std::ofstream(dir + "/" + name + "/optimizer.safetensors") << "x";
  };
  make("checkpoint-10", true, true);
  make("checkpoint-2", true, true);
  make("checkpoint-30.partial-77", true, true);  // a save in progress / killed
  make("checkpoint-40", false, true);             // no trainer state
  make("checkpoint-x", true, true);
  make("other", true, true);
  auto l = checkpoint_list(dir);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].first, 2);   // numeric order, not lexical
  EXPECT_EQ(l[1].first, 10);
  EXPECT_EQ(checkpoint_latest(dir), dir + "/checkpoint-10");
  EXPECT_EQ(checkpoint_latest(dir + "/missing"), "");
  fs::remove_all(dir);
}

TEST(TrainCli, RunStopAndResume) {
  const std::string dir = make_temp_dir("cli");
  const std::string cfg = write_config(dir, tiny_config_toml(tiny_model_dir(), 2));
  const std::string out = dir + "/run";
  CmdResult r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --stop-after 1 --set checkpoint.every=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-1");
  r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --set checkpoint.every=1");
  EXPECT_EQ(r.code, 1) << "a second run into the same directory needs --resume";
  r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --set checkpoint.every=1 --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-2");
  r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --set train.steps=3 --resume " + out + "/checkpoint-1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-3");
  fs::remove_all(dir);
}
