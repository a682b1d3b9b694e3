// The real `grpo` binary on the shipped tiny model (models/arith-tiny with
// examples/default.toml, shrunk by --set): SIGTERM / SIGINT finish the step,
// write a checkpoint and print the resume command, a second signal exits at
// once, a second run on the same --out fails naming the first one's pid, the
// lock dies with its process, and unknown commands are errors.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "loop_test_util.h"
#include "train/checkpoint_state.h"
#include "train/run_dir.h"

extern char** environ;

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = GRPO_SOURCE_DIR;

// A long run that steps quickly: 2 prompts x 4 samples, no evals, no scheduled checkpoints.
std::string train_args(const std::string& out) {
  return "train " + kSrc + "/examples/default.toml --out " + out + " --threads 1 --set model.path=" + kSrc +
         "/models/arith-tiny --set train.steps=100000 --set rollout.prompts_per_step=2 "
         "--set rollout.num_generations=4 --set train.micro_batch=8 --set eval.every=0 --set checkpoint.every=0";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Starts `grpo ARGS` with stdout and stderr in `log`; the pid is grpo's own (sh execs it).
pid_t spawn_grpo(const std::string& args, const std::string& log) {
  std::string cmd = "exec " + std::string(GRPO_BINARY_PATH) + " " + args + " > " + log + " 2>&1";
  char sh[] = "/bin/sh", c[] = "-c";
  char* argv[] = {sh, c, cmd.data(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv, environ), 0);
  return pid;
}

// Waits for the process to end; its raw wait status, or -1 after `seconds`.
int wait_status(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

int64_t count_lines(const std::string& path) {
  std::ifstream f(path);
  int64_t n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

// Waits until metrics.jsonl holds `n` step records (the run is training).
bool wait_for_steps(const std::string& out, int64_t n, double seconds = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (count_lines(out + "/metrics.jsonl") >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct CmdResult {
  int code = -1;
  std::string output;
};
CmdResult run_grpo(const std::string& args, const std::string& log) {
  pid_t pid = spawn_grpo(args, log);
  int st = wait_status(pid, 300);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(log)};
}

}  // namespace

TEST(TrainSignals, SigtermFinishesTheStepSavesAndPrintsTheResumeCommand) {
  const std::string dir = make_temp_dir("sigterm"), out = dir + "/run";
  const pid_t pid = spawn_grpo(train_args(out), dir + "/first.log");
  ASSERT_TRUE(wait_for_steps(out, 2)) << slurp(dir + "/first.log");

  // A second run on the same directory fails at once, naming the first one's pid.
  CmdResult second = run_grpo(train_args(out), dir + "/second.log");
  EXPECT_EQ(second.code, 1) << second.output;
  EXPECT_NE(second.output.find("in use by another grpo train (pid " + std::to_string(pid) + ","), std::string::npos)
      << second.output;

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int st = wait_status(pid, 120);
  const std::string log = slurp(dir + "/first.log");
  ASSERT_TRUE(WIFEXITED(st)) << "status " << st << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGTERM) << log;
  // The step in progress was finished and checkpointed: the last record's step.
  const int64_t n = count_lines(out + "/metrics.jsonl");
  ASSERT_GE(n, 2);
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-" + std::to_string(n)) << log;
  const auto state = nlohmann::json::parse(slurp(out + "/checkpoint-" + std::to_string(n) + "/trainer_state.json"));
  EXPECT_EQ(state["step"], n);
  EXPECT_NE(log.find("stopped by SIGTERM after step " + std::to_string(n)), std::string::npos) << log;
  const std::string resume = "resume with: grpo train " + kSrc + "/examples/default.toml --out " + out + " --resume";
  EXPECT_NE(log.find(resume + " --set model.path=" + kSrc + "/models/arith-tiny"), std::string::npos) << log;
  EXPECT_NE(log.find("--threads 1"), std::string::npos) << log;

  // The printed command resumes (the lock went with the process); a changed
  // config is refused there, and accepted with --resume-with-changes.
  CmdResult changed = run_grpo(train_args(out) + " --resume --set rollout.num_generations=2", dir + "/changed.log");
  EXPECT_EQ(changed.code, 1) << changed.output;
  EXPECT_NE(changed.output.find("rollout.num_generations: 4 -> 2"), std::string::npos) << changed.output;
  CmdResult resumed = run_grpo(train_args(out) + " --resume --set train.steps=" + std::to_string(n + 1) +
                                   " --resume-with-changes",
                               dir + "/resumed.log");
  EXPECT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("train.steps: 100000 -> " + std::to_string(n + 1)), std::string::npos)
      << resumed.output;
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-" + std::to_string(n + 1)) << resumed.output;
  fs::remove_all(dir);
}

// Pending signals of one kind merge, so the second SIGINT goes after the
// handler has answered the first. The default batch (32 prompts x 16 samples)
// keeps the first step busy for seconds meanwhile.
TEST(TrainSignals, SecondSigintExitsAtOnceWithoutSaving) {
  const std::string dir = make_temp_dir("sigint2"), out = dir + "/run", log_path = dir + "/log";
  const pid_t pid = spawn_grpo("train " + kSrc + "/examples/default.toml --out " + out + " --threads 1 --set model.path=" +
                                   kSrc + "/models/arith-tiny --set eval.every=0",
                               log_path);
  auto wait_log = [&](const std::string& text) {
    for (int i = 0; i < 6000 && slurp(log_path).find(text) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return slurp(log_path).find(text) != std::string::npos;
  };
  ASSERT_TRUE(wait_log("env arithmetic")) << slurp(log_path);  // setup done: step 1 is running
  ASSERT_EQ(kill(pid, SIGINT), 0);
  ASSERT_TRUE(wait_log("stop requested")) << slurp(log_path);
  ASSERT_EQ(kill(pid, SIGINT), 0);
  const int st = wait_status(pid, 60);
  const std::string log = slurp(log_path);
  ASSERT_TRUE(WIFEXITED(st)) << "status " << st << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT) << log;
  EXPECT_EQ(count_lines(out + "/metrics.jsonl"), 0) << "the step in progress was abandoned\n" << log;
  EXPECT_TRUE(checkpoint_list(out).empty()) << log;
  EXPECT_EQ(log.find("resume with:"), std::string::npos) << log;
  fs::remove_all(dir);
}

TEST(TrainSignals, LockDiesWithItsProcess) {
  const std::string dir = make_temp_dir("sigkill"), out = dir + "/run";
  const pid_t pid = spawn_grpo(train_args(out), dir + "/log");
  ASSERT_TRUE(wait_for_steps(out, 1)) << slurp(dir + "/log");
  EXPECT_FALSE(RunDirLock::acquire(out).ok());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  wait_status(pid, 60);
  auto lock = RunDirLock::acquire(out);
  EXPECT_TRUE(lock.ok()) << lock.status().message();
  fs::remove_all(dir);
}

TEST(GrpoCli, UnknownCommandIsAnErrorEvenWithHelp) {
  const std::string dir = make_temp_dir("unknown");
  for (const std::string args : {"trian --help", "trian", "frobnicate -h"}) {
    CmdResult r = run_grpo(args, dir + "/log");
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    const std::string cmd = args.substr(0, args.find(' '));
    EXPECT_NE(r.output.find("unknown command '" + cmd + "'"), std::string::npos) << r.output;
    for (const char* known : {"train", "generate", "convert", "sft", "tokenize"})
      EXPECT_NE(r.output.find(known), std::string::npos) << known << " in: " << r.output;
    EXPECT_EQ(r.output.find("Usage:"), std::string::npos) << "no help text for an unknown command: " << r.output;
  }
  EXPECT_NE(run_grpo("trian", dir + "/log").output.find("did you mean 'train'?"), std::string::npos);
  CmdResult help = run_grpo("--help", dir + "/log");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_NE(help.output.find("Usage:"), std::string::npos) << help.output;
  CmdResult sub = run_grpo("train --help", dir + "/log");
  EXPECT_EQ(sub.code, 0) << sub.output;
  EXPECT_NE(sub.output.find("--resume-with-changes"), std::string::npos) << sub.output;
  fs::remove_all(dir);
}
