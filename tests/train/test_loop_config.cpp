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
  for (const char* name : {"default.toml", "gsm8k-qwen2.5.toml", "bench-qwen2.5-0.5b.toml", "bench-qwen3-0.6b.toml",
                           "bench-llama-3.2-1b.toml", "inference-aware.toml", "gsm8k-curriculum-qwen2.5.toml",
                           "tandem.toml", "gsm8k-tandem-qwen2.5.toml"}) {
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
  // A changed config is refused on resume, with the differences listed, unless --resume-with-changes.
  r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --set train.steps=3 --resume " + out + "/checkpoint-1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("train.steps: 2 -> 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint.every: 1 -> 2"), std::string::npos) << r.output;
  r = run_grpo("train " + cfg + " --out " + out + " --threads 2 --set train.steps=3 --resume " + out +
               "/checkpoint-1 --resume-with-changes");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.steps: 2 -> 3"), std::string::npos) << r.output;
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-3");
  fs::remove_all(dir);
}

// The engine flags of `grpo generate` (cli/engine_flags.h): the [engine] keys as flags,
// validated with flag names, enum values from the same tables as the config.
TEST(GenerateCli, EngineFlags) {
  const std::string model = std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny";
  const std::string base = "generate --model " + model + " --ids 1,2,3 --max-tokens 3 --temperature 0 ";
  CmdResult ok = run_grpo(base + "--block-size 4 --max-num-seqs 8 --max-num-batched-tokens 64 --kv-cache-mib 1 "
                                 "--no-prefix-caching --no-cuda-graphs");
  ASSERT_EQ(ok.code, 0) << ok.output;
  // arith-tiny: 2 layers × K and V × 4 tokens × 2 kv heads × 32 dims × 4 bytes = 4096 bytes a block.
  EXPECT_NE(ok.output.find("256 KV blocks of 4"), std::string::npos) << ok.output;
  CmdResult bad = run_grpo(base + "--block-size 0");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("--block-size = 0: must be in 1..1024"), std::string::npos) << bad.output;
  CmdResult graphs = run_grpo(base + "--cuda-graphs maybe");
  EXPECT_NE(graphs.code, 0);
  EXPECT_NE(graphs.output.find("'maybe' is not one of auto, on, off"), std::string::npos) << graphs.output;
  CmdResult kv = run_grpo(base + "--kv-cache-dtype int4");
  EXPECT_NE(kv.code, 0);
  EXPECT_NE(kv.output.find("not one of auto, fp8, fp8_e4m3"), std::string::npos) << kv.output;
  CmdResult on_cpu = run_grpo(base + "--cuda-graphs on");
  EXPECT_EQ(on_cpu.code, 1);
  EXPECT_NE(on_cpu.output.find("CUDA graphs need a CUDA device"), std::string::npos) << on_cpu.output;
}

// The speculative flags are engine flags too ([engine.speculative] keys, validated with flag names).
TEST(GenerateCli, SpeculativeFlags) {
  const std::string model = std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny";
  const std::string base = "generate --model " + model + " --ids 1,2,3,1,2,3 --max-tokens 6 --temperature 0 ";
  CmdResult plain = run_grpo(base);
  ASSERT_EQ(plain.code, 0) << plain.output;
  CmdResult ng = run_grpo(base + "--spec ngram --num-speculative-tokens 3 --ngram-min 1 --ngram-max 3 --no-adaptive-spec");
  ASSERT_EQ(ng.code, 0) << ng.output;
  EXPECT_NE(ng.output.find("[generate] speculative ngram:"), std::string::npos) << ng.output;
  // Same completion as plain decoding (the line before "[finish: ...]").
  auto completion = [](const std::string& out) {
    const size_t f = out.find("[finish:");
    if (f == std::string::npos || f == 0) return std::string();
    const size_t b = out.rfind('\n', f - 2);
    return out.substr(b == std::string::npos ? 0 : b + 1, f - (b == std::string::npos ? 0 : b + 1));
  };
  EXPECT_FALSE(completion(plain.output).empty()) << plain.output;
  EXPECT_EQ(completion(plain.output), completion(ng.output));
  CmdResult draft = run_grpo(base + "--spec draft --draft-model " + model + " --k 2");
  ASSERT_EQ(draft.code, 0) << draft.output;
  EXPECT_NE(draft.output.find("[generate] speculative draft:"), std::string::npos) << draft.output;
  EXPECT_EQ(completion(plain.output), completion(draft.output));
  // A draft vocabulary (every id of a 2-id file: drafts only those) keeps the completion; a
  // missing file is an error naming the flag.
  const std::string dv = ::testing::TempDir() + "/draft_vocab_cli.json";
  std::ofstream(dv) << "[0, 1]";
  CmdResult vocab = run_grpo(base + "--spec draft --draft-model " + model + " --k 2 --draft-vocab " + dv);
  ASSERT_EQ(vocab.code, 0) << vocab.output;
  EXPECT_EQ(completion(plain.output), completion(vocab.output));
  CmdResult no_vocab = run_grpo(base + "--spec draft --draft-model " + model + " --draft-vocab " + dv + ".missing");
  EXPECT_EQ(no_vocab.code, 1);
  EXPECT_NE(no_vocab.output.find("--draft-vocab = \""), std::string::npos) << no_vocab.output;
  CmdResult no_draft = run_grpo(base + "--spec draft");
  EXPECT_EQ(no_draft.code, 1);
  EXPECT_NE(no_draft.output.find("--draft-model"), std::string::npos) << no_draft.output;
  CmdResult bad_k = run_grpo(base + "--spec ngram --k 0");
  EXPECT_EQ(bad_k.code, 1);
  EXPECT_NE(bad_k.output.find("--num-speculative-tokens = 0: must be in [1, 16]"), std::string::npos) << bad_k.output;
  CmdResult bad_m = run_grpo(base + "--spec eagle");
  EXPECT_NE(bad_m.code, 0);
  EXPECT_NE(bad_m.output.find("'eagle' is not one of off, draft, ngram"), std::string::npos) << bad_m.output;
}

TEST(TrainCli, ListKeysShowsEngineKeysAndAllowedValues) {
  CmdResult r = run_grpo("train --list-keys");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line : {"engine.block_size\n", "engine.gpu_memory_utilization\n", "engine.kv_cache_mib\n",
                           "engine.cuda_graphs  (auto, on, off)\n", "engine.kv_cache_dtype  (auto, fp8, fp8_e4m3)\n",
                           "rollout.ignore_eos\n", "rollout.min_new_tokens\n", "train.activation_recompute\n",
                           "train.micro_batch_tokens\n", "train.lr_schedule  (constant, linear, cosine)\n",
                           "engine.speculative.method  (off, draft, ngram)\n", "engine.speculative.draft_model\n",
                           "engine.speculative.acceptance  (rejection, match)\n", "engine.speculative.draft_vocab\n",
                           "engine.speculative.draft_vocab_size\n",
                           "tandem.strategy  (token, chunk, word)\n", "rollout.server_url\n",
                           "rollout.server_timeout_s\n", "rollout.server_max_concurrency\n",
                           "rollout.server_on_failure  (error, local)\n"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << r.output;
  EXPECT_EQ(r.output.find("rollout.kv_cache_dtype"), std::string::npos);
}
