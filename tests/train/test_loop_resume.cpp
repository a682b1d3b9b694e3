// End-to-end GRPO loop on the CPU with a tiny real model on the arithmetic
// environment: the smoke run (metrics keys, run files, a loadable HF
// checkpoint) and exact resume (4 steps straight == 2 steps, a "kill", and a
// resume for 2 more, bit for bit), also with a crashed partial checkpoint
// lying around.
#include <filesystem>
#include <fstream>

#include "loop_test_util.h"
#include "model/checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"
#include "train/metrics_jsonl.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

TrainLoopResult run(const RunConfig& cfg, const std::string& out, bool resume = false, int64_t stop_after = 0) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.n_threads = 2;
  o.console = nullptr;
  o.stop_after_steps = stop_after;
  auto r = grpo_train(cfg, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : TrainLoopResult{};
}

// The per-step values that must agree bit for bit between two runs.
void expect_same_steps(const MetricsFile& a, const MetricsFile& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    for (const char* k : {"step", "loss", "reward/mean", "grad_norm", "entropy", "completion/mean_length", "lr",
                          "logprob_mismatch/max"}) {
      ASSERT_TRUE(a.steps[i].contains(k) && b.steps[i].contains(k)) << k;
      EXPECT_EQ(a.steps[i][k], b.steps[i][k]) << "step record " << i << " key " << k;
    }
  }
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (size_t i = 0; i < a.evals.size(); ++i) EXPECT_EQ(a.evals[i]["eval/accuracy"], b.evals[i]["eval/accuracy"]);
}

}  // namespace

TEST(GrpoLoop, SmokeRunWritesMetricsAndLoadableCheckpoint) {
  const std::string out = make_temp_dir("smoke");
  TrainLoopResult r = run(tiny_config(3), out);
  EXPECT_EQ(r.steps, 3);
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 3u);
  for (const char* k : {"step", "reward/mean", "reward/std", "reward/correct/mean", "reward/length_linear/mean",
                        "accuracy", "completion/mean_length", "completion/max_length", "completion/truncated_frac",
                        "loss", "kl", "clip_ratio", "clip_ratio/low", "clip_ratio/high", "entropy", "grad_norm",
                        "logprob_mismatch/max", "logprob_mismatch/mean", "time/rollout", "time/reward", "time/train",
                        "time/sync", "tokens/s", "lr"})
    EXPECT_TRUE(m.steps[0].contains(k)) << "missing " << k;
  // eval at start (step 0), at step 2 and at the last step.
  ASSERT_EQ(m.evals.size(), 3u);
  EXPECT_EQ(m.evals[0]["step"], 0);
  EXPECT_TRUE(m.evals[1].contains("eval/accuracy") && m.evals[1].contains("eval/reward"));
  // One copy of the weights on the CPU in f32: the sampler's and the trainer's logprobs agree closely.
  EXPECT_LT(m.steps[0]["logprob_mismatch/max"].get<double>(), 1e-3);
  // The weights moved: step 2 samples from an updated policy.
  EXPECT_NE(m.steps[0]["grad_norm"].get<double>(), 0.0) << m.steps[0].dump();

  for (const char* f : {"config.toml", "run_info.json", "plot.html"}) EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  EXPECT_FALSE(fs::is_empty(out + "/tb"));
  // The resolved config parses back to the same config.
  auto back = run_config_load(out + "/config.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(run_config_to_toml(back.value()), run_config_to_toml([&] { RunConfig c = tiny_config(3); c.run.output_dir = out; return c; }()));

  // Checkpoints: every 2 steps + the final one, keep_last = 2.
  auto cks = checkpoint_list(out);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].first, 2);
  EXPECT_EQ(cks[1].first, 3);
  EXPECT_EQ(r.last_checkpoint, cks[1].second);
  auto w = model_load(cks[1].second, Device::cpu, DType::f32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto tok = Tokenizer::load(cks[1].second);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // The saved model differs from the starting one (training happened).
  auto w0 = model_load(tiny_model_dir(), Device::cpu, DType::f32);
  ASSERT_TRUE(w0.ok());
  std::vector<float> a = tensor_to_f32(w.value().arena), b = tensor_to_f32(w0.value().arena);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NE(a, b);
  fs::remove_all(out);
}

TEST(GrpoLoop, ResumeIsBitExact) {
  const std::string straight = make_temp_dir("straight"), split = make_temp_dir("split");
  run(tiny_config(4), straight);
  TrainLoopResult first = run(tiny_config(4), split, false, /*stop_after=*/2);
  EXPECT_EQ(first.steps, 2);
  ASSERT_EQ(checkpoint_latest(split), split + "/checkpoint-2");
  TrainLoopResult second = run(tiny_config(4), split, /*resume=*/true);
  EXPECT_EQ(second.steps, 4);
  expect_same_steps(read_metrics(straight + "/metrics.jsonl"), read_metrics(split + "/metrics.jsonl"));
  // Same final weights.
  auto wa = model_load(straight + "/checkpoint-4", Device::cpu, DType::f32);
  auto wb = model_load(split + "/checkpoint-4", Device::cpu, DType::f32);
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_EQ(tensor_to_f32(wa.value().arena), tensor_to_f32(wb.value().arena));
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(GrpoLoop, ResumeIgnoresPartialCheckpointsAndCutsMetrics) {
  const std::string straight = make_temp_dir("straight2"), split = make_temp_dir("crash");
  run(tiny_config(4), straight);
  run(tiny_config(4), split, false, /*stop_after=*/2);
  // A save killed mid-write (step 3), a directory without trainer state, and a
  // metrics line the dead process wrote after its last checkpoint.
  fs::create_directories(split + "/checkpoint-3.partial-4242");
  std::ofstream(split + "/checkpoint-3.partial-4242/trainer_state.json") << "{\"step\": 3";
  fs::create_directories(split + "/checkpoint-9");
  std::ofstream(split + "/checkpoint-9/config.json") << "{}";
  std::ofstream(split + "/metrics.jsonl", std::ios::app) << "{\"step\":3,\"loss\":123.0}\n";
  EXPECT_EQ(checkpoint_latest(split), split + "/checkpoint-2");

  run(tiny_config(4), split, /*resume=*/true);
  expect_same_steps(read_metrics(straight + "/metrics.jsonl"), read_metrics(split + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(split + "/checkpoint-3.partial-4242"));  // cleaned by the next save
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(GrpoLoop, RefusesToOverwriteARunWithoutResume) {
  const std::string out = make_temp_dir("twice");
  run(tiny_config(2), out);
  TrainLoopOptions o;
  o.out_dir = out;
  o.console = nullptr;
  auto r = grpo_train(tiny_config(2), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--resume"), std::string::npos) << r.status().message();
  fs::remove_all(out);
}
