// End to end on the CPU: `grpo train` with data.env = "remote" hosting the
// trajectory API and serving its live policy ([server]), plus Python
// environment processes (examples/environments/gsm8k_env.py) that sample from
// that server, score and post groups. Checks that every step happens, rewards
// and remote counters are recorded, that killing one environment mid-run does
// not stop training, and that with no environment the trainer says why it waits.
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
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../net_test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using json = nlohmann::json;
using grpo::test::free_port;
using grpo::test::spawn_logged;

namespace {

// Exit status, or -1 if it did not end within `seconds` (then it is killed).
int wait_for(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int st = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<json> metrics(const std::string& dir) {
  std::vector<json> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string python() {
  for (const char* p : {"/usr/bin/python3", "/usr/local/bin/python3"})
    if (fs::exists(p)) return p;
  return "";
}

std::string write_config(const std::string& dir, int steps, int api_port, int server_port, double max_wait,
                         const std::string& url = "") {
  const std::string src = GRPO_SOURCE_DIR;
  std::ofstream f(dir + "/remote.toml");
  f << "[run]\noutput_dir = \"" << dir << "/run\"\n"
    << "[model]\npath = \"" << src << "/models/arith-tiny\"\ndtype = \"f32\"\ndevice = \"cpu\"\n"
    << "[data]\nenv = \"remote\"\n"
    << "[rollout]\nnum_generations = 4\nprompts_per_step = 2\nmax_new_tokens = 22\n"
    << "[train]\nsteps = " << steps << "\nlr = 3e-4\nmicro_batch = 8\nimportance_sampling = \"token_truncate\"\n"
    << "[checkpoint]\nsave_final = true\n"
    << "[log]\nprogress = \"plain\"\nplot = false\n"
    << "[server]\nenabled = true\nport = " << server_port << "\n"
    << "[remote]\nurl = \"" << url << "\"\nport = " << api_port << "\nmax_wait = " << max_wait << "\nwait_log_every = 0.5\npoll_interval = 0.05\n";
  return dir + "/remote.toml";
}

std::string write_questions(const std::string& dir) {
  std::ofstream f(dir + "/questions.jsonl");
  for (int a = 1; a <= 9; ++a)
    for (int b = 1; b <= 9; b += 2)
      f << json{{"question", "Tom has " + std::to_string(a) + " apples, gets " + std::to_string(b) + " more. How many now?"},
                {"answer", "#### " + std::to_string(a + b)}}
               .dump()
        << "\n";
  return dir + "/questions.jsonl";
}

}  // namespace

TEST(RemoteE2E, TrainerHostsTheApiAndPythonEnvironmentsFeedIt) {
  const std::string py = python();
  if (py.empty()) GTEST_SKIP() << "python3 not found: the environment process of this test is a Python script";
  char tmpl[] = "/tmp/grpo_remote_e2e_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const int api = free_port(), srv = free_port();
  const int kSteps = 4;
  const std::string cfg = write_config(dir, kSteps, api, srv, 240);
  const std::string qs = write_questions(dir);
  pid_t train = spawn_logged({GRPO_BINARY_PATH, "train", cfg, "--threads", "2"}, dir + "/train.log");
  ASSERT_GT(train, 0);
  auto env_argv = [&](const std::string& name, int seed) {
    return std::vector<std::string>{py, std::string(GRPO_SOURCE_DIR) + "/examples/environments/gsm8k_env.py",
                                    "--api", "http://127.0.0.1:" + std::to_string(api),
                                    "--server", "http://127.0.0.1:" + std::to_string(srv),
                                    "--data", qs, "--prompt-template", "{question}\n", "--group-size", "4",
                                    "--max-tokens", "22", "--name", name, "--seed", std::to_string(seed),
                                    "--off-policy-tolerance", "1", "--gzip"};
  };
  pid_t env_a = spawn_logged(env_argv("doomed", 1), dir + "/env_a.log");
  pid_t env_b = spawn_logged(env_argv("steady", 2), dir + "/env_b.log");
  ASSERT_GT(env_a, 0);
  ASSERT_GT(env_b, 0);
  // Once the first step is recorded, one environment dies without disconnecting.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (metrics(dir + "/run").empty() && std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (waitpid(train, &st, WNOHANG) == train) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(env_a, SIGKILL);
  const int rc = wait_for(train, 240);
  kill(env_b, SIGTERM);
  wait_for(env_b, 30);
  wait_for(env_a, 5);
  ASSERT_EQ(rc, 0) << slurp(dir + "/train.log") << "\n--- env a ---\n" << slurp(dir + "/env_a.log") << "\n--- env b ---\n"
                   << slurp(dir + "/env_b.log");
  const auto m = metrics(dir + "/run");
  ASSERT_EQ(m.size(), size_t(kSteps)) << slurp(dir + "/train.log");
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(m[size_t(i)]["step"], i + 1);
    EXPECT_GE(m[size_t(i)]["remote/groups"].get<double>(), 1.0);
    EXPECT_GE(m[size_t(i)]["remote/sequences"].get<double>(), 1.0);
    const double r = m[size_t(i)]["reward/mean"].get<double>();
    EXPECT_GE(r, 0.0);
    EXPECT_LE(r, 1.0);
    EXPECT_TRUE(m[size_t(i)].contains("loss"));
    EXPECT_EQ(m[size_t(i)]["remote/untagged_groups"], 0.0);  // every group carries the server's policy_version
    EXPECT_EQ(m[size_t(i)]["remote/sequences_without_inference_logprobs"], 0.0);
  }
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoint-" + std::to_string(kSteps)));
  EXPECT_NE(slurp(dir + "/env_b.log").find("posted group"), std::string::npos);
  fs::remove_all(dir);
}

TEST(RemoteE2E, WithNoEnvironmentTheTrainerSaysWhyItWaits) {
  char tmpl[] = "/tmp/grpo_remote_wait_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string cfg = write_config(dir, 2, free_port(), free_port(), 2.0);
  pid_t train = spawn_logged({GRPO_BINARY_PATH, "train", cfg, "--threads", "1"}, dir + "/train.log");
  ASSERT_GT(train, 0);
  const int rc = wait_for(train, 120);
  const std::string log = slurp(dir + "/train.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("waiting"), std::string::npos) << log;
  EXPECT_NE(log.find("no environment connected"), std::string::npos) << log;
  EXPECT_NE(log.find("remote.max_wait"), std::string::npos) << log;
  fs::remove_all(dir);
}

TEST(RemoteE2E, TrainerPullsFromAnExternalApiServer) {
  const std::string py = python();
  if (py.empty()) GTEST_SKIP() << "python3 not found: the environment process of this test is a Python script";
  char tmpl[] = "/tmp/grpo_remote_client_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const int api = free_port(), srv = free_port();
  pid_t apid = spawn_logged({GRPO_BINARY_PATH, "api", "--port", std::to_string(api)}, dir + "/api.log");
  ASSERT_GT(apid, 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(api);
  const std::string cfg = write_config(dir, 2, free_port(), srv, 240, url);
  pid_t train = spawn_logged({GRPO_BINARY_PATH, "train", cfg, "--threads", "2"}, dir + "/train.log");
  pid_t env = spawn_logged({py, std::string(GRPO_SOURCE_DIR) + "/examples/environments/gsm8k_env.py", "--api", url, "--server",
                     "http://127.0.0.1:" + std::to_string(srv), "--data", write_questions(dir), "--prompt-template",
                     "{question}\n", "--group-size", "4", "--max-tokens", "22"},
                    dir + "/env.log");
  ASSERT_GT(train, 0);
  ASSERT_GT(env, 0);
  const int rc = wait_for(train, 240);
  kill(env, SIGTERM);
  wait_for(env, 30);
  kill(apid, SIGTERM);
  const int arc = wait_for(apid, 30);
  ASSERT_EQ(rc, 0) << slurp(dir + "/train.log") << "\n--- env ---\n" << slurp(dir + "/env.log");
  EXPECT_EQ(arc, 0) << slurp(dir + "/api.log");
  EXPECT_EQ(metrics(dir + "/run").size(), 2u);
  EXPECT_NE(slurp(dir + "/train.log").find("pulling batches from the Atropos API at " + url), std::string::npos);
  EXPECT_NE(slurp(dir + "/api.log").find("batches formed"), std::string::npos);
  fs::remove_all(dir);
}
