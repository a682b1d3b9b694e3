// Robustness of `grpo train` runs: the stop flag (finish the step, checkpoint,
// resume exactly), the run-directory lock, the config comparison on resume,
// one TensorBoard file per run, and the end of a run whose optimizer steps are
// all skipped. In process on the tiny stories260K model; test_train_signals.cpp
// drives the real binary.
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "loop_test_util.h"
#include "model/safetensors.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"
#include "train/run_dir.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

TrainLoopOptions quiet_options(const std::string& out) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.n_threads = 2;
  o.console = nullptr;
  return o;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Steps of the scalar events in a TensorBoard file, read with a minimal
// independent TFRecord + protobuf walk (Event.step = field 2, varint).
std::vector<int64_t> tb_steps(const std::string& path) {
  const std::string f = slurp(path);
  std::vector<int64_t> out;
  size_t p = 0;
  while (p + 12 <= f.size()) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | uint8_t(f[p + size_t(i)]);
    const std::string m = f.substr(p + 12, len);
    p += 16 + len;
    size_t q = 0;
    int64_t step = 0;
    bool header = false;
    auto varint = [&] {
      uint64_t v = 0;
      for (int sh = 0; q < m.size(); sh += 7) {
        uint8_t b = uint8_t(m[q++]);
        v |= uint64_t(b & 0x7f) << sh;
        if (!(b & 0x80)) break;
      }
      return v;
    };
    while (q < m.size()) {
      uint64_t key = varint();
      if ((key & 7) == 0) {
        uint64_t v = varint();
        if ((key >> 3) == 2) step = int64_t(v);
      } else if ((key & 7) == 1) {
        q += 8;
      } else if ((key & 7) == 2) {
        uint64_t n = varint();
        if ((key >> 3) == 3) header = true;
        q += n;
      } else {
        q += 4;
      }
    }
    if (!header) out.push_back(step);
  }
  EXPECT_EQ(p, f.size()) << path;
  return out;
}

}  // namespace

TEST(GrpoLoopStop, FlagAfterStepNSavesAndResumesExactly) {
  const std::string straight = make_temp_dir("stop_straight"), out = make_temp_dir("stop");
  ASSERT_TRUE(grpo_train(tiny_config(4), quiet_options(straight)).ok());

  std::atomic<int> flag{0};
  TrainLoopOptions o = quiet_options(out);
  o.stop_signal = &flag;
  o.on_step = [&](int64_t step) {
    if (step == 1) flag.store(SIGTERM);  // as the CLI's handler does while step 1 runs
  };
  auto r = grpo_train(tiny_config(4), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stop_signal, SIGTERM);
  EXPECT_EQ(r->steps, 1);
  // Step 1 is not a scheduled checkpoint (checkpoint.every = 2): the stop wrote it.
  EXPECT_EQ(r->last_checkpoint, out + "/checkpoint-1");
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-1");
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  EXPECT_EQ(m.steps.size(), 1u);

  TrainLoopOptions o2 = quiet_options(out);
  o2.resume = true;
  auto r2 = grpo_train(tiny_config(4), o2);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2->steps, 4);
  EXPECT_EQ(r2->stop_signal, 0);
  const MetricsFile a = read_metrics(straight + "/metrics.jsonl"), b = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i)
    for (const char* k : {"step", "loss", "reward/mean", "grad_norm"})
      EXPECT_EQ(a.steps[i][k], b.steps[i][k]) << "step record " << i << " key " << k;

  // One TensorBoard file for the two processes, each step once, in order.
  std::vector<std::string> tb;
  for (const auto& de : fs::directory_iterator(out + "/tb")) tb.push_back(de.path().string());
  ASSERT_EQ(tb.size(), 1u);
  std::vector<int64_t> steps;
  for (int64_t s : tb_steps(tb[0]))
    if (steps.empty() || steps.back() != s) steps.push_back(s);  // a step's eval is a record of its own
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  fs::remove_all(straight);
  fs::remove_all(out);
}

TEST(GrpoLoopStop, FlagSetBeforeTheFirstStepSavesNothing) {
  const std::string out = make_temp_dir("stop_early");
  std::atomic<int> flag{SIGINT};
  TrainLoopOptions o = quiet_options(out);
  o.stop_signal = &flag;
  auto r = grpo_train(tiny_config(4), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stop_signal, SIGINT);
  EXPECT_EQ(r->steps, 0);
  EXPECT_EQ(r->last_checkpoint, "");
  EXPECT_TRUE(checkpoint_list(out).empty());
  fs::remove_all(out);
}

// With mu = 2 a generation batch feeds two steps: a stop after the first saves
// inside the batch, marked so, and the resumed run completes.
TEST(GrpoLoopStop, StopInsideAGenerationBatchSavesMidGeneration) {
  const std::string out = make_temp_dir("stop_mid");
  std::atomic<int> flag{0};
  TrainLoopOptions o = quiet_options(out);
  o.stop_signal = &flag;
  o.on_step = [&](int64_t step) {
    if (step == 1) flag.store(SIGINT);
  };
  auto r = grpo_train(tiny_config(4, {"train.num_iterations=2"}), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->steps, 1);
  ASSERT_EQ(r->last_checkpoint, out + "/checkpoint-1");
  const auto state = nlohmann::json::parse(slurp(out + "/checkpoint-1/trainer_state.json"));
  EXPECT_EQ(state["step"], 1);
  EXPECT_EQ(state["mid_generation"], true);
  TrainLoopOptions o2 = quiet_options(out);
  o2.resume = true;
  auto r2 = grpo_train(tiny_config(4, {"train.num_iterations=2"}), o2);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2->steps, 4);
  EXPECT_EQ(read_metrics(out + "/metrics.jsonl").steps.size(), 4u);
  fs::remove_all(out);
}

TEST(RunDirLock, SecondHolderFailsNamingThePid) {
  const std::string dir = make_temp_dir("lock") + "/run";  // created by acquire
  auto a = RunDirLock::acquire(dir);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(slurp(dir + "/.lock"), std::to_string(getpid()) + "\n");
  auto b = RunDirLock::acquire(dir);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("in use by another grpo train (pid " + std::to_string(getpid()) + ","),
            std::string::npos) << b.status().message();

  // grpo_train fails at once, before writing anything.
  auto r = grpo_train(tiny_config(2), quiet_options(dir));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pid " + std::to_string(getpid())), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir + "/config.toml"));

  { RunDirLock released = std::move(a).value(); }
  EXPECT_TRUE(RunDirLock::acquire(dir).ok()) << "closing the descriptor releases the lock";
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(RunConfigDiff, ListsChangedKeysAndRewards) {
  RunConfig a = tiny_config(4), b = a;
  EXPECT_TRUE(run_config_diff(a, b).empty());
  b.rollout.num_generations = 2;
  b.model.path = "/elsewhere";
  b.train.loss_type = LossType::grpo;
  b.log.level = LogLevel::debug;         // does not change what is trained
  b.run.output_dir = "/other/dir";  // the directory being resumed
  b.reward[1].params["target"] = 9;
  b.reward.push_back({"format_strict", 0.5});
  const auto d = run_config_diff(a, b);
  const std::vector<std::string> want = {
      "model.path: \"" + tiny_model_dir() + "\" -> \"/elsewhere\"",
      "reward.format_strict.weight: (absent) -> 0.5",
      "reward.length_linear.target: 8 -> 9",
      "rollout.num_generations: 4 -> 2",
      "train.loss_type: \"dapo\" -> \"grpo\"",
  };
  EXPECT_EQ(d, want);
}

TEST(GrpoLoopResume, ChangedConfigIsRefusedUnlessAllowed) {
  const std::string out = make_temp_dir("resume_diff");
  ASSERT_TRUE(grpo_train(tiny_config(4), [&] { auto o = quiet_options(out); o.stop_after_steps = 2; return o; }()).ok());
  const std::string before = slurp(out + "/config.toml");
  TrainLoopOptions o = quiet_options(out);
  o.resume = true;
  auto r = grpo_train(tiny_config(4, {"rollout.num_generations=2", "train.loss_type=grpo"}), o);
  ASSERT_FALSE(r.ok()) << "a changed config must not resume silently";
  for (const char* f : {"rollout.num_generations: 4 -> 2", "train.loss_type: \"dapo\" -> \"grpo\"",
                        "--resume-with-changes", "config.toml"})
    EXPECT_NE(r.status().message().find(f), std::string::npos) << f << " in: " << r.status().message();
  EXPECT_EQ(slurp(out + "/config.toml"), before) << "the refused run must leave config.toml alone";

  o.resume_with_changes = true;
  auto r2 = grpo_train(tiny_config(4, {"rollout.num_generations=2", "train.loss_type=grpo"}), o);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2->steps, 4);
  EXPECT_NE(slurp(out + "/config.toml").find("num_generations = 2"), std::string::npos);
  fs::remove_all(out);
}

// A model whose final norm holds a NaN: every loss and gradient is NaN, so the
// optimizer skips every step and the run must end with an error.
TEST(GrpoLoopSkips, ConsecutiveSkippedStepsEndTheRun) {
  const std::string model = make_temp_dir("nan_model");
  for (const auto& de : fs::directory_iterator(tiny_model_dir()))
    fs::copy(de.path(), model + "/" + de.path().filename().string());
  {
    const std::string st = model + "/model.safetensors";
    size_t begin = 0;
    {
      auto f = SafetensorsFile::open(st);
      ASSERT_TRUE(f.ok()) << f.status().message();
      const SafetensorsEntry* e = f->find("model.norm.weight");
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(e->dtype, DType::f32);
      begin = e->begin;
    }
    std::string bytes = slurp(st);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | uint8_t(bytes[size_t(i)]);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(&bytes[8 + hlen + begin], &nan, sizeof nan);
    std::ofstream(st, std::ios::binary | std::ios::trunc) << bytes;
  }
  const std::string out = make_temp_dir("skips");
  RunConfig cfg = tiny_config(20, {"model.path=" + model, "train.max_consecutive_skipped_steps=3", "eval.every=0"});
  auto r = grpo_train(cfg, quiet_options(out));
  ASSERT_FALSE(r.ok()) << "a run whose every step is skipped must not end as a success";
  for (const char* f : {"step 3", "last 3 optimizer steps were all skipped", "train.max_consecutive_skipped_steps"})
    EXPECT_NE(r.status().message().find(f), std::string::npos) << f << " in: " << r.status().message();
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 3u);
  for (const auto& s : m.steps) EXPECT_EQ(s["optimizer/skipped"], 1.0);

  // 0 turns the check off: the run goes to its end.
  const std::string out2 = make_temp_dir("skips_off");
  auto r2 = grpo_train(tiny_config(4, {"model.path=" + model, "train.max_consecutive_skipped_steps=0", "eval.every=0"}),
                       quiet_options(out2));
  EXPECT_TRUE(r2.ok()) << r2.status().message();
  fs::remove_all(model);
  fs::remove_all(out);
  fs::remove_all(out2);
}
