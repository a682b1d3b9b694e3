// Data-parallel `grpo train` on CPU ranks under mpirun (docs/distributed.md):
// 2 ranks against 1 rank on the same global batch (losses, grad norms, final
// weights), ZeRO-1 against replicated optimizer state, resume with a
// different number of ranks, and a rank killed mid-run. The reference is the
// one-rank run of the same binary, which has its own tests of the step.
//
// Tolerance: ranks sum their gradients after each rank accumulated its own
// micro-batches, so the f32 sums are grouped differently from the one-rank
// run: losses and grad norms agree to 1e-5 relative, weights to 1e-5 + 1e-4·|w|
// after 3 steps. ZeRO-1 vs replicated on the same ranks is bitwise (AdamW is
// element-wise and the reduced gradient is the same).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sys/wait.h>
#include <unistd.h>
#include <string>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace {

const std::string kCommon =
    " --set train.steps=3 --set rollout.prompts_per_step=4 --set rollout.num_generations=4"
    " --set train.micro_batch=4 --set eval.every=3 --set eval.n_prompts=6 --set log.plot=false"
    " --set log.progress=off --set log.level=warn --threads 1";

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

std::string dir_of(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("grpo_mpi_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d.string();
}

int run(const std::string& prefix, const std::string& out, const std::string& extra) {
  const std::string cmd = "cd " GRPO_SOURCE_DIR " && " + prefix + " " GRPO_BINARY_PATH " train examples/default.toml --out " +
                          out + kCommon + " " + extra + " > " + out + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

const char* kMpi = "mpirun --allow-run-as-root --oversubscribe -np 2";

std::map<int64_t, nlohmann::json> steps_of(const std::string& out) {
  std::map<int64_t, nlohmann::json> m;
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) m[j["step"].get<int64_t>()] = j;
    else if (j.contains("eval/accuracy")) m[-1 - j["step"].get<int64_t>()] = j;
  }
  return m;
}

void expect_close(double a, double b, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(a - b), rel * std::max(std::fabs(a), std::fabs(b)) + 1e-12) << what << ": " << a << " vs " << b;
}

void compare_runs(const std::string& a, const std::string& b) {
  auto ma = steps_of(a), mb = steps_of(b);
  ASSERT_EQ(ma.size(), mb.size());
  for (auto& [k, ja] : ma) {
    const auto& jb = mb.at(k);
    if (k >= 0) {
      expect_close(ja["loss"], jb["loss"], 1e-5, "loss at step " + std::to_string(k));
      expect_close(ja["grad_norm"], jb["grad_norm"], 1e-5, "grad_norm at step " + std::to_string(k));
      EXPECT_EQ(ja["reward/mean"], jb["reward/mean"]) << "step " << k << ": rollouts differ";
      EXPECT_EQ(ja["tokens/generated"], jb["tokens/generated"]) << "step " << k;
    } else {
      EXPECT_EQ(ja["eval/accuracy"], jb["eval/accuracy"]);
      EXPECT_EQ(ja["eval/n"], jb["eval/n"]);
    }
  }
  auto fa = grpo::SafetensorsFile::open(a + "/checkpoint-3/model.safetensors");
  auto fb = grpo::SafetensorsFile::open(b + "/checkpoint-3/model.safetensors");
  ASSERT_TRUE(fa.ok() && fb.ok());
  double worst = 0;
  std::string worst_name;
  for (const auto& e : fa.value().entries()) {
    const auto* eb = fb.value().find(e.name);
    ASSERT_NE(eb, nullptr) << e.name;
    ASSERT_EQ(e.dtype, grpo::DType::f32);
    const float* pa = static_cast<const float*>(fa.value().data(e));
    const float* pb = static_cast<const float*>(fb.value().data(*eb));
    const size_t n = size_t(e.numel());
    for (size_t i = 0; i < n; ++i) {
      const double excess = std::fabs(double(pa[i]) - pb[i]) - (1e-5 + 1e-4 * std::fabs(double(pa[i])));
      if (excess > worst) worst = excess, worst_name = e.name + "[" + std::to_string(i) + "]";
    }
  }
  EXPECT_EQ(worst, 0.0) << "first weight beyond the tolerance: " << worst_name;
}

std::string read_all(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(MpiTrain, TwoRanksMatchOneRankAndZero1) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string one = dir_of("one"), two = dir_of("two"), z1 = dir_of("z1");
  fs::create_directories(fs::path(one).parent_path());
  ASSERT_EQ(run("", one, ""), 0) << read_all(one + ".log");
  ASSERT_EQ(run(kMpi, two, ""), 0) << read_all(two + ".log");
  ASSERT_EQ(run(kMpi, z1, "--set dist.zero_stage=1"), 0) << read_all(z1 + ".log");
  compare_runs(one, two);
  compare_runs(one, z1);
  // The gathered ZeRO-1 optimizer state is the replicated one, bit for bit.
  EXPECT_EQ(read_all(two + "/checkpoint-3/optimizer.safetensors"), read_all(z1 + "/checkpoint-3/optimizer.safetensors"));
  EXPECT_EQ(read_all(two + "/checkpoint-3/model.safetensors"), read_all(z1 + "/checkpoint-3/model.safetensors"));
}

TEST(MpiTrain, ResumeWithADifferentNumberOfRanks) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string one = dir_of("ref1"), rs = dir_of("resume");
  fs::create_directories(fs::path(one).parent_path());
  const std::string ck = "--set checkpoint.every=2 --set dist.zero_stage=1";
  ASSERT_EQ(run("", one, ck), 0) << read_all(one + ".log");
  ASSERT_EQ(run(kMpi, rs, ck + " --stop-after 2"), 0) << read_all(rs + ".log");  // 2 ranks: steps 1-2
  ASSERT_TRUE(fs::exists(rs + "/checkpoint-2/trainer_state.json"));
  ASSERT_EQ(run("", rs, ck + " --resume"), 0) << read_all(rs + ".log");  // 1 rank: step 3
  compare_runs(one, rs);
}

// 1-rank run stopped at step 2, resumed on 2 ranks with ZeRO-1: each rank reads
// only its shard of the full optimizer state in the checkpoint.
TEST(MpiTrain, ResumeOneRankOnTwoRanksZero1) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string one = dir_of("ref1b"), rs = dir_of("resume12");
  fs::create_directories(fs::path(one).parent_path());
  const std::string ck = "--set checkpoint.every=2 --set dist.zero_stage=1";
  ASSERT_EQ(run("", one, ck), 0) << read_all(one + ".log");
  ASSERT_EQ(run("", rs, ck + " --stop-after 2"), 0) << read_all(rs + ".log");  // 1 rank: steps 1-2
  ASSERT_TRUE(fs::exists(rs + "/checkpoint-2/trainer_state.json"));
  ASSERT_EQ(run(kMpi, rs, ck + " --resume"), 0) << read_all(rs + ".log");  // 2 ranks: step 3
  compare_runs(one, rs);
}

// The all-reduce overlapped with the backward (small buckets, so that most are
// launched from the layer hooks while lower layers still run) gives bitwise the
// result of the all-reduce after the backward: the MPI sum of each element is in
// rank order whatever the bucket. Both also match the one-rank run (compare_runs).
TEST(MpiTrain, OverlappedAllReduceIsBitwiseTheSequentialOne) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string one = dir_of("ov1"), seq = dir_of("ovseq"), ov = dir_of("ovon"), ovz = dir_of("ovz1");
  fs::create_directories(fs::path(one).parent_path());
  const std::string small = "--set dist.bucket_mb=0.01";
  ASSERT_EQ(run("", one, ""), 0) << read_all(one + ".log");
  ASSERT_EQ(run(kMpi, seq, small + " --set dist.overlap_backward=false"), 0) << read_all(seq + ".log");
  ASSERT_EQ(run(kMpi, ov, small + " --set dist.overlap_backward=true"), 0) << read_all(ov + ".log");
  ASSERT_EQ(run(kMpi, ovz, small + " --set dist.overlap_backward=true --set dist.zero_stage=1"), 0)
      << read_all(ovz + ".log");
  for (const char* f : {"/checkpoint-3/model.safetensors", "/checkpoint-3/optimizer.safetensors"}) {
    EXPECT_EQ(read_all(seq + f), read_all(ov + f)) << f;
    EXPECT_EQ(read_all(seq + f), read_all(ovz + f)) << f;
  }
  auto ms = steps_of(seq), mo = steps_of(ov);
  for (int64_t k = 1; k <= 3; ++k) {
    ASSERT_TRUE(ms.count(k) && mo.count(k)) << "step " << k;
    EXPECT_EQ(ms[k]["loss"], mo[k]["loss"]) << "step " << k;
    EXPECT_EQ(ms[k]["grad_norm"], mo[k]["grad_norm"]) << "step " << k;
    for (const char* key : {"time/allreduce", "time/allreduce_exposed"}) {
      ASSERT_TRUE(mo[k].contains(key)) << key;
      EXPECT_GE(mo[k][key].get<double>(), 0.0) << key;
    }
  }
  compare_runs(one, ov);
}

// [curriculum] kde_valley over 2 ranks: every rank sizes the global batch from the
// same state and updates it from the gathered rewards, so rollouts, group sizes,
// losses and the final curriculum state are those of the one-rank run.
TEST(MpiTrain, CurriculumTwoRanksMatchOneRank) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string one = dir_of("cur1"), two = dir_of("cur2");
  fs::create_directories(fs::path(one).parent_path());
  const std::string cu =
      "--set curriculum.type=kde_valley --set curriculum.alpha=2.0 --set curriculum.bandwidth=0.02 --set curriculum.ema_decay=0"
      " --set data.arithmetic.train_size=8";
  ASSERT_EQ(run("", one, cu), 0) << read_all(one + ".log");
  ASSERT_EQ(run(kMpi, two, cu), 0) << read_all(two + ".log");
  compare_runs(one, two);
  auto ma = steps_of(one), mb = steps_of(two);
  for (int64_t k = 1; k <= 3; ++k) {
    ASSERT_TRUE(ma.count(k) && mb.count(k)) << "step " << k;
    EXPECT_EQ(ma[k]["curriculum/group_size_mean"], mb[k]["curriculum/group_size_mean"]) << "step " << k;
    EXPECT_EQ(ma[k]["curriculum/ema_mean"], mb[k]["curriculum/ema_mean"]) << "step " << k;
  }
  auto sa = nlohmann::json::parse(read_all(one + "/checkpoint-3/trainer_state.json"));
  auto sb = nlohmann::json::parse(read_all(two + "/checkpoint-3/trainer_state.json"));
  EXPECT_EQ(sa["curriculum"], sb["curriculum"]);
  EXPECT_EQ(read_all(one + "/curriculum/latest.json"), read_all(two + "/curriculum/latest.json"));
}

TEST(MpiTrain, AKilledRankStopsTheJobAndKeepsTheLastCheckpoint) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found: install openmpi-bin (scripts/setup.sh does)";
  const std::string k = dir_of("kill");
  fs::create_directories(fs::path(k).parent_path());
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run(kMpi, k, "--set train.steps=6 --set checkpoint.every=2 --debug-kill-rank 1 --debug-kill-step 3");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(rc, 0);
  EXPECT_LT(secs, 30.0) << "the surviving rank did not stop promptly";
  const std::string log = read_all(k + ".log");
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("signal 9"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(k + "/checkpoint-2/trainer_state.json"));
  EXPECT_TRUE(grpo::SafetensorsFile::open(k + "/checkpoint-2/model.safetensors").ok());
  EXPECT_FALSE(fs::exists(k + "/checkpoint-6"));
}

}  // namespace
