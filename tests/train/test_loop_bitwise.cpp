// train.on_policy = "bitwise" through the whole GRPO loop on the CPU (docs/bitwise.md):
// over several steps (weights change, the prefix cache is reset, eval runs in between)
// the logprob_mismatch metrics the trainer records against the rollout's logprobs are
// exactly 0, at temperature 1 (raw logprobs) and 0.8 (processed); the default mode on the
// same run records a non-zero mismatch, and the run files name the mode.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "loop_test_util.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

Result<TrainLoopResult> run(const RunConfig& cfg, const std::string& out) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.n_threads = 2;
  o.console = nullptr;
  return grpo_train(cfg, o);
}

// (max, mean) of logprob_mismatch over the run's steps.
std::pair<double, double> mismatch(const std::string& out, size_t want_steps) {
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  EXPECT_EQ(m.steps.size(), want_steps);
  double mx = 0, mean = 0;
  for (const auto& s : m.steps) {
    EXPECT_TRUE(s.contains("logprob_mismatch/max") && s.contains("logprob_mismatch/mean"));
    mx = std::max(mx, s.value("logprob_mismatch/max", -1.0));
    mean = std::max(mean, s.value("logprob_mismatch/mean", -1.0));
  }
  return {mx, mean};
}

}  // namespace

TEST(GrpoLoopBitwise, MismatchIsExactlyZeroOverSteps) {
  for (const char* temperature : {"1.0", "0.8"}) {
    SCOPED_TRACE(std::string("temperature ") + temperature);
    const std::string out = make_temp_dir("bitwise");
    // A small token budget and small blocks: chunked prefill and prefix hits between siblings.
    RunConfig cfg = tiny_config(3, {"train.on_policy=bitwise", std::string("rollout.temperature=") + temperature,
                                    "engine.block_size=4", "engine.max_num_batched_tokens=16",
                                    "checkpoint.save_final=false"});
    auto r = run(cfg, out);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const auto [mx, mean] = mismatch(out, 3);
    EXPECT_EQ(mx, 0.0);
    EXPECT_EQ(mean, 0.0);
    std::ifstream f(out + "/run_info.json");
    EXPECT_EQ(nlohmann::json::parse(f)["loss"]["on_policy"], "bitwise");
    fs::remove_all(out);
  }
}

TEST(GrpoLoopBitwise, DefaultModeRecordsAMismatch) {
  const std::string out = make_temp_dir("notbitwise");
  RunConfig cfg = tiny_config(2, {"engine.block_size=4", "engine.max_num_batched_tokens=16", "eval.every=0",
                                  "checkpoint.save_final=false"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto [mx, mean] = mismatch(out, 2);
  EXPECT_GT(mx, 0.0);
  EXPECT_LT(mx, 1e-3);
  EXPECT_GT(mean, 0.0);
  fs::remove_all(out);
}
