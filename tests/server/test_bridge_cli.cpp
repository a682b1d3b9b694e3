// The weight bridges through the binaries: `grpo serve --watch` follows the
// checkpoints a real `grpo train` writes (the policy version over HTTP becomes
// the run's last step), the bridge keys of [server] are checked as config errors,
// and a CPU build refuses --attach, --receive and server.bridge = "ipc"/"nccl"
// with errors that say what to use instead.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "server_test_util.h"
#include "train/run_config.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

std::string tmp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("grpo_bridge_cli_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d.string();
}

// Runs the binary; returns its exit status, output in *out.
int run_grpo(const std::string& args, std::string* out) {
  const std::string log = tmp_dir("out.log");
  const int st = std::system(("cd " GRPO_SOURCE_DIR " && " GRPO_BINARY_PATH " " + args + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string config_error(const std::vector<std::string>& sets) {
  auto c = run_config_parse("", "test.toml", sets);
  return c.ok() ? std::string() : c.status().message();
}

}  // namespace

TEST(BridgeCli, ServeWatchFollowsARealTrainingRun) {
  const std::string run = tmp_dir("run");
  fs::create_directories(run);
  const std::string log = tmp_dir("serve.log");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::freopen(log.c_str(), "w", stderr);
    execl(GRPO_BINARY_PATH, GRPO_BINARY_PATH, "serve", "--model", (arith_dir()).c_str(), "--port", "0", "--threads", "1",
          "--watch", run.c_str(), "--watch-interval", "0.05", (char*)nullptr);
    _exit(127);
  }
  int port = 0;
  std::string seen;
  const std::regex ready("listening on http://127\\.0\\.0\\.1:([0-9]+)");
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    seen = ss.str();
    std::smatch m;
    if (std::regex_search(seen, m, ready)) port = std::stoi(m[1].str());
    else ::usleep(50000);
  }
  ASSERT_GT(port, 0) << seen;
  EXPECT_NE(seen.find("no checkpoint in"), std::string::npos) << seen;

  std::string out;
  ASSERT_EQ(run_grpo("train examples/default.toml --out " + run +
                         " --set train.steps=2 --set checkpoint.every=1 --set rollout.prompts_per_step=2"
                         " --set rollout.num_generations=2 --set train.micro_batch=4 --set eval.every=0"
                         " --set log.plot=false --set log.progress=off --set log.level=warn --threads 1",
                     &out),
            0)
      << out;
  httplib::Client cli("127.0.0.1", port);
  int64_t version = -1;
  for (int i = 0; i < 200 && version != 2; ++i) {
    auto r = cli.Get("/health");
    if (r && r->status == 200) version = json::parse(r->body)["policy_version"].get<int64_t>();
    if (version != 2) ::usleep(50000);
  }
  EXPECT_EQ(version, 2);
  auto r = cli.Post("/v1/completions", R"({"prompt": "1+1=", "max_tokens": 2, "temperature": 0})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Policy-Version"), "2");
  ::kill(pid, SIGTERM);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("as policy version 2 in"), std::string::npos) << ss.str();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ss.str();
}

TEST(BridgeCli, ServeFlagErrors) {
  std::string out;
  EXPECT_NE(run_grpo("serve", &out), 0);
  EXPECT_NE(out.find("give --model DIR (or --attach RUN_DIR"), std::string::npos) << out;
  EXPECT_NE(run_grpo("serve --model models/arith-tiny --watch /nonexistent/dir", &out), 0);
  EXPECT_NE(out.find("not a directory"), std::string::npos) << out;
  EXPECT_NE(run_grpo("serve --model models/arith-tiny --receive localhost", &out), 0);
  EXPECT_NE(out.find("expected HOST:PORT"), std::string::npos) << out;
}

TEST(BridgeCli, BridgeKeysAreCheckedAsConfig) {
  std::string e = config_error({"server.bridge=shm"});
  EXPECT_NE(e.find("server.bridge"), std::string::npos) << e;
  EXPECT_NE(e.find("\"ipc\""), std::string::npos) << e;
  e = config_error({"server.bridge=nccl", "server.bridge_addr=nocolon"});
  EXPECT_NE(e.find("server.bridge_addr"), std::string::npos) << e;
  e = config_error({"server.bridge=nccl", "server.bridge_on_failure=retry"});
  EXPECT_NE(e.find("server.bridge_on_failure"), std::string::npos) << e;
  e = config_error({"server.bridge_servers=0"});
  EXPECT_NE(e.find("server.bridge_servers"), std::string::npos) << e;
  EXPECT_EQ(config_error({"server.bridge=ipc"}), "");
  EXPECT_EQ(config_error({"server.bridge=nccl", "server.bridge_addr=10.0.0.2:29650", "server.bridge_servers=2"}), "");
}

#ifndef GRPO_HAVE_CUDA
TEST(BridgeCli, CpuBuildRefusesTheGpuBridges) {
  std::string out;
  EXPECT_NE(run_grpo("serve --attach /tmp --device cuda", &out), 0);
  EXPECT_NE(out.find("--attach: this build has no CUDA backend"), std::string::npos) << out;
  EXPECT_NE(out.find("--watch"), std::string::npos) << out;
  EXPECT_NE(run_grpo("serve --model models/arith-tiny --receive 127.0.0.1:29650", &out), 0);
  EXPECT_NE(out.find("needs a CUDA build"), std::string::npos) << out;
  const std::string run = tmp_dir("cpu_ipc");
  EXPECT_NE(run_grpo("train examples/default.toml --out " + run + " --set server.bridge=ipc --set log.progress=off", &out), 0);
  EXPECT_NE(out.find("server.bridge = \"ipc\": this build has no CUDA backend"), std::string::npos) << out;
  EXPECT_NE(run_grpo("train examples/default.toml --out " + run + "2 --set server.bridge=nccl --set log.progress=off", &out), 0);
  EXPECT_NE(out.find("needs a CUDA build"), std::string::npos) << out;
}
#endif
