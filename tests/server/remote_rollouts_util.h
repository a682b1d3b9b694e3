// Shared helpers of the rollout.server_url tests (test_remote_rollouts.cpp,
// test_rollout_failover_loop.cpp): a `grpo serve` child process on the tiny byte-level model
// with batch-invariant kernels, a small arithmetic run config around the same model, and
// comparisons of the batches and training metrics of two runs (bit for bit).
#pragma once
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <map>
#include <thread>

#include "../net_test_util.h"
#include "server/rollout_client.h"
#include "server_test_util.h"
#include "train/grpo_loop.h"
#include "train/loop_rollout.h"

extern char** environ;

namespace grpo::test {

// `grpo serve` on the tiny model with batch-invariant kernels, on a free port; killed at the end.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log;
  explicit ServeProcess(int at_port = 0) {
    port = at_port > 0 ? at_port : free_port();
    log = "/tmp/grpo_remote_rollouts_serve_" + std::to_string(getpid()) + "_" + std::to_string(port) + ".log";
    const std::vector<std::string> argv = {GRPO_BINARY_PATH, "serve", "--model", arith_dir(), "--port",
                                           std::to_string(port), "--deterministic", "--threads", "1"};
    pid = spawn_logged(argv, log);
  }
  bool ready() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    for (int i = 0; i < 300 && pid > 0; ++i) {
      if (auto r = c.Get("/health"); r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  void kill_now() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
  }
  ~ServeProcess() {
    kill_now();
    std::remove(log.c_str());
  }
};

inline std::string remote_toml(const std::string& out, int steps) {
  return
      "[run]\noutput_dir = \"" + out + "\"\ndeterministic = true\n"
      "[model]\npath = \"" + arith_dir() + "\"\ndtype = \"f32\"\ndevice = \"cpu\"\n"
      "[data]\nenv = \"arithmetic\"\nseed = 1\nprompt_template = \"{question}\\n\"\n"
      "[data.arithmetic]\ndifficulty = 0\ntrain_size = 200\ntest_size = 10\n"
      "[rollout]\nnum_generations = 4\nprompts_per_step = 3\nmax_new_tokens = 20\nseed = 5\n"
      "[train]\nsteps = " + std::to_string(steps) + "\nlr = 1e-3\nmicro_batch = 6\n"
      "[eval]\nevery = 0\n"
      "[checkpoint]\nsave_final = false\n"
      "[log]\nprogress = \"off\"\nplot = false\nlevel = \"error\"\n"
      "[[reward]]\nname = \"correct\"\nweight = 1.0\n"
      "[[reward]]\nname = \"length_linear\"\nweight = 1.0\ntarget = 8\nscale = 64\nunit = \"chars\"\n";
}

inline RunConfig remote_config(const std::string& out, int steps, const std::vector<std::string>& sets = {}) {
  auto c = run_config_parse(remote_toml(out, steps), "remote.toml", sets);
  GRPO_CHECK_MSG(c.ok(), c.status().message().c_str());
  return c.value();
}

inline std::string temp_dir(const char* tag) {
  std::string t = std::string("/tmp/grpo_remote_rollouts_") + tag + "_XXXXXX";
  GRPO_CHECK(mkdtemp(t.data()) != nullptr);
  return t;
}

struct Seen {
  std::vector<std::vector<int32_t>> prompts, completions;
  std::vector<std::vector<float>> logprobs;
  std::vector<std::string> texts;
  std::vector<float> rewards, advantages;
  std::vector<bool> truncated;
  int64_t policy_version = -2;
};

inline TrainLoopOptions options(const std::string& out, std::map<int64_t, Seen>* seen) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.n_threads = 1;
  o.console = nullptr;
  o.make_rollout_server = [](const RunConfig& c) { return rollout_client_make(rollout_client_options(c)); };
  if (seen)
    o.on_batch = [seen](int64_t step, const RolloutBatch& b) {
      Seen s;
      for (const auto& p : b.prompts) s.prompts.push_back(p.ids);
      for (const auto& c : b.completions) {
        s.completions.push_back(c.out.completion_ids);
        s.logprobs.push_back(c.out.logprobs);
        s.texts.push_back(c.out.text);
        s.rewards.push_back(c.reward);
        s.truncated.push_back(c.truncated);
      }
      s.advantages = b.advantages;
      s.policy_version = b.policy_version;
      (*seen)[step] = std::move(s);
    };
  return o;
}

inline std::vector<nlohmann::json> step_metrics(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::ifstream f(out + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

// Bitwise equality of two float vectors (EXPECT_EQ on floats would accept -0 == 0).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline void expect_same_batches(const std::map<int64_t, Seen>& a, const std::map<int64_t, Seen>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, x] : a) {
    ASSERT_TRUE(b.count(step)) << step;
    const Seen& y = b.at(step);
    EXPECT_EQ(x.prompts, y.prompts) << "step " << step;
    ASSERT_EQ(x.completions.size(), y.completions.size()) << "step " << step;
    for (size_t i = 0; i < x.completions.size(); ++i) {
      EXPECT_EQ(x.completions[i], y.completions[i]) << "step " << step << " completion " << i;
      EXPECT_TRUE(same_bits(x.logprobs[i], y.logprobs[i])) << "step " << step << " completion " << i;
      EXPECT_EQ(x.texts[i], y.texts[i]) << "step " << step << " completion " << i;
      EXPECT_EQ(x.truncated[i], y.truncated[i]) << "step " << step << " completion " << i;
    }
    EXPECT_TRUE(same_bits(x.rewards, y.rewards)) << "step " << step;
    EXPECT_TRUE(same_bits(x.advantages, y.advantages)) << "step " << step;
  }
}

// The metrics that follow from the batch and the weights (not timings, not engine telemetry).
inline void expect_same_training(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"loss", "grad_norm", "entropy", "reward/mean", "reward/std", "accuracy",
                          "completion/mean_length", "completion/truncated_frac", "logprob_mismatch/max", "clip_ratio"}) {
      ASSERT_TRUE(a[i].contains(k) && b[i].contains(k)) << k;
      EXPECT_EQ(a[i][k].get<double>(), b[i][k].get<double>()) << "step " << i + 1 << " " << k;
    }
}

}  // namespace grpo::test
