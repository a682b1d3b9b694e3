// The `grpo serve` binary: --port 0 prints the port it picked, and SIGTERM lets a
// request in flight finish (the whole stream, then [DONE]) before the process
// exits with status 0.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>

#include "server_test_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

struct Child {
  pid_t pid = -1;
  FILE* err = nullptr;  // the child's stderr
};

Child spawn(const std::vector<std::string>& args) {
  int fds[2];
  GRPO_CHECK(pipe(fds) == 0);
  Child c;
  c.pid = fork();
  GRPO_CHECK(c.pid >= 0);
  if (c.pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  c.err = fdopen(fds[0], "r");
  return c;
}

}  // namespace

TEST(ServeCli, PortZeroIsPrintedAndSigtermDrainsInFlightRequests) {
  Child c = spawn({GRPO_BINARY_PATH, "serve", "--model", arith_dir(), "--port", "0", "--threads", "1"});
  int port = 0;
  char line[1024];
  std::string seen;
  const std::regex ready("grpo serve: listening on http://127\\.0\\.0\\.1:([0-9]+)");
  while (port == 0 && std::fgets(line, sizeof line, c.err)) {
    seen += line;
    std::cmatch m;
    if (std::regex_search(line, m, ready)) port = std::stoi(m[1].str());
  }
  ASSERT_GT(port, 0) << "no ready line; stderr:\n" << seen;

  const int kTokens = 1500;
  std::atomic<int> n_chunks{0};
  std::atomic<bool> got_done{false};
  std::atomic<int> status{0};
  std::thread client([&] {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(120, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "What is 1 + 1?\n"}, {"max_tokens", kTokens}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        if (buf.compare(0, 7, "data: {") == 0) ++n_chunks;
        if (buf.compare(0, 12, "data: [DONE]") == 0) got_done = true;
        buf.erase(0, pos + 2);
      }
      return true;
    };
    auto r = cli.send(req);
    status = r ? r->status : -1;
  });
  while (n_chunks == 0 && status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(kill(c.pid, SIGTERM), 0);
  client.join();
  int wst = 0;
  ASSERT_EQ(waitpid(c.pid, &wst, 0), c.pid);
  while (std::fgets(line, sizeof line, c.err)) seen += line;
  std::fclose(c.err);
  EXPECT_TRUE(WIFEXITED(wst)) << seen;
  EXPECT_EQ(WEXITSTATUS(wst), 0) << seen;
  EXPECT_EQ(status, 200);
  EXPECT_EQ(n_chunks, kTokens) << "the in-flight stream was cut";
  EXPECT_TRUE(got_done);
  EXPECT_NE(seen.find("draining"), std::string::npos) << seen;
}

// Bad --lora-modules values end the start with a message naming the value (or the
// adapter's directory and what does not match), before anything listens.
TEST(ServeCli, BadLoraModulesFailAtStartWithTheirName) {
  const std::string missing = std::string(::testing::TempDir()) + "/grpo-no-such-adapter";
  // A PEFT config whose tensors are absent: the error names the file it could not read.
  const std::string empty_adapter = std::string(::testing::TempDir()) + "/grpo-empty-adapter";
  std::filesystem::create_directories(empty_adapter);
  {
    std::FILE* f = std::fopen((empty_adapter + "/adapter_config.json").c_str(), "w");
    ASSERT_TRUE(f);
    std::fputs(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})", f);
    std::fclose(f);
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--lora-modules", "noequals"}, "--lora-modules 'noequals': no '='"},
      {{"--lora-modules", "{\"name\": \"x\"}"}, "'path' (a string) is missing"},
      {{"--lora-modules", "a=" + missing}, "No adapter found for " + missing},
      {{"--lora-modules", "a=" + empty_adapter}, "LoRA adapter 'a' (" + empty_adapter + ")"},
      {{"--lora-modules", "arith-tiny=" + empty_adapter}, "base model's served name"},
      {{"--lora-modules", "a=" + missing, "b=" + missing, "--max-loras", "1"}, "--max-loras is 1"},
  };
  for (const auto& [extra, want] : cases) {
    std::vector<std::string> args = {GRPO_BINARY_PATH, "serve", "--model", arith_dir(), "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    Child c = spawn(args);
    std::string seen;
    char line[2048];
    while (std::fgets(line, sizeof line, c.err)) seen += line;
    std::fclose(c.err);
    int wst = 0;
    ASSERT_EQ(waitpid(c.pid, &wst, 0), c.pid);
    EXPECT_TRUE(WIFEXITED(wst) && WEXITSTATUS(wst) != 0) << extra[1] << ": " << seen;
    EXPECT_NE(seen.find(want), std::string::npos) << extra[1] << ": " << seen;
    EXPECT_EQ(seen.find("listening on"), std::string::npos) << seen;
  }
}
