// The "command" reward against small Python scripts written into a temp dir:
// scores (answered out of order), one process across batches, a script that
// exits, one that hangs, one that prints garbage, one that dies with a
// traceback on stderr, on_failure = "zero" with and without restart, and the
// process being gone after shutdown. Then `grpo train` end to end with a
// command reward that logs what it scored, checked against metrics.jsonl.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include "core/timer.h"
#include "env/remote_reward.h"
#include "remote_test_util.h"

namespace grpo {
namespace {

using json = nlohmann::json;
using namespace remote_test;

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Scores len(completion) + 10 * (answer == "4"); answers each group of three
// requests in reverse order, to show answers are matched by id. Appends
// "start" to started.txt when it starts.
const char* kReverseScript = R"(import json, os, sys
open(os.path.join(os.path.dirname(sys.argv[0]), "started.txt"), "a").write("start\n")
pending = []
for line in sys.stdin:
    req = json.loads(line)
    pending.append({"id": req["id"], "score": len(req["completion"]) + (10 if req["answer"] == "4" else 0)})
    if len(pending) == 3 or req["metadata"]["row"].get("last"):
        for a in reversed(pending):
            print(json.dumps(a), flush=True)
        pending = []
)";

struct CommandFixture : ::testing::Test {
  TmpDir dir;
  void SetUp() override {
    if (!have_python()) GTEST_SKIP() << "python3 is not in PATH; the command reward tests run Python scripts";
  }
  std::unique_ptr<RewardFunction> make(const std::string& script_name, const std::string& script, json extra = json::object()) {
    const std::string path = dir.write(script_name, script);
    json p = {{"command", {"python3", path}}};
    for (auto it = extra.begin(); it != extra.end(); ++it) p[it.key()] = it.value();
    auto fn = reward_make({"command", 1.0, p});
    EXPECT_TRUE(fn.ok()) << fn.status().message();
    if (!fn.ok()) return nullptr;
    Status st = (*fn)->start();
    EXPECT_TRUE(st.ok()) << st.message();
    return std::move(fn).value();
  }
};

Batch batch_of(const std::vector<std::pair<std::string, std::string>>& items) {
  Batch b;
  for (const auto& [c, a] : items) b.add("prompt", c, a);
  b.examples.back().meta["last"] = true;
  return b;
}

TEST_F(CommandFixture, ScoresOutOfOrderAnswersAcrossBatchesWithOneProcess) {
  auto fn = make("reverse.py", kReverseScript);
  ASSERT_TRUE(fn);
  for (int round = 0; round < 2; ++round) {
    Batch b = batch_of({{"abc", "4"}, {"de", "5"}, {"", "4"}, {"ghij", "1"}, {"k", "4"}});
    std::vector<float> out;
    int64_t failed = 0;
    Status st = fn->compute_batch(b.inputs(), &out, &failed);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(out, (std::vector<float>{13, 2, 10, 4, 11}));
    EXPECT_EQ(failed, 0);
  }
  EXPECT_EQ(slurp(dir.path + "/started.txt"), "start\n") << "the process must be started once";
}

TEST_F(CommandFixture, ExitingProcessIsAnErrorWithItsStatus) {
  auto fn = make("exits.py", R"(import json, sys
line = sys.stdin.readline()
print(json.dumps({"id": json.loads(line)["id"], "score": 1}), flush=True)
sys.exit(3)
)");
  Batch b = batch_of({{"a", "1"}, {"b", "1"}, {"c", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("reward 'command' (python3 "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("exited with status 3 while scoring (1 of 3 answered)"), std::string::npos) << st.message();
}

TEST_F(CommandFixture, HungProcessTimesOutAndIsKilled) {
  auto fn = make("hangs.py", R"(import os, sys, time
open(os.path.join(os.path.dirname(sys.argv[0]), "pid.txt"), "w").write(str(os.getpid()))
sys.stdin.readline()
time.sleep(600)
)", {{"timeout", 2.0}});  // long enough for python to start on a loaded CI machine
  Batch b = batch_of({{"a", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  const double t0 = now_seconds();
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  const double took = now_seconds() - t0;
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no answer within timeout = 2 s (0 of 1 answered); the process was killed"),
            std::string::npos) << st.message();
  EXPECT_LT(took, 8.0);
  const pid_t pid = pid_t(std::stol(slurp(dir.path + "/pid.txt")));
  EXPECT_NE(kill(pid, 0), 0) << "the hung process must be gone";
}

TEST_F(CommandFixture, GarbageOutputIsAMalformedAnswer) {
  auto fn = make("garbage.py", R"(import sys
for line in sys.stdin:
    print("hello world", flush=True)
)");
  Batch b = batch_of({{"a", "1"}, {"b", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("malformed answer line 'hello world': is not a JSON object"), std::string::npos)
      << st.message();
  for (const char* bad : {R"({"score": 1})", R"({"id": 999999, "score": 1})", R"({"id": 0, "score": "high"})"}) {
    auto f2 = make("bad.py", std::string("import sys\nfor line in sys.stdin:\n    print('") + bad + "', flush=True)\n");
    st = f2->compute_batch(b.inputs(), &out, &failed);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("malformed answer line"), std::string::npos) << st.message();
  }
}

TEST_F(CommandFixture, DyingProcessReportsItsStderrTail) {
  auto fn = make("dies.py", R"(import sys
sys.stdin.readline()
for i in range(40):
    print(f"noise {i}", file=sys.stderr)
print("boom: the grader lost its config", file=sys.stderr, flush=True)
raise ValueError("cannot grade")
)");
  Batch b = batch_of({{"a", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  const std::string& m = st.message();
  EXPECT_NE(m.find("exited with status 1"), std::string::npos) << m;
  EXPECT_NE(m.find("last lines of its stderr"), std::string::npos) << m;
  EXPECT_NE(m.find("boom: the grader lost its config"), std::string::npos) << m;
  EXPECT_NE(m.find("ValueError: cannot grade"), std::string::npos) << m;
  EXPECT_EQ(m.find("noise 5\n"), std::string::npos) << "only the tail is kept: " << m;
}

TEST_F(CommandFixture, ReportedErrorsAndOnFailureZero) {
  const char* script = R"(import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if req["completion"] == "crash":
        sys.exit(7)
    if req["completion"].startswith("bad"):
        print(json.dumps({"id": req["id"], "error": "cannot parse " + req["completion"]}), flush=True)
    else:
        print(json.dumps({"id": req["id"], "score": 0.25 * len(req["completion"])}), flush=True)
)";
  {  // on_failure = "error": the script's own error message
    auto fn = make("strict.py", script);
    Batch b = batch_of({{"ok", "1"}, {"bad x", "1"}});
    std::vector<float> out;
    int64_t failed = 0;
    Status st = fn->compute_batch(b.inputs(), &out, &failed);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("reported an error for completion 1: cannot parse bad x"), std::string::npos) << st.message();
  }
  auto fn = make("lenient.py", script, {{"on_failure", "zero"}, {"max_in_flight", 1}});
  Batch b = batch_of({{"four", "1"}, {"bad", "1"}, {"twelve chars", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 0.0f, 3.0f}));
  EXPECT_EQ(failed, 1);
  // A crash fails what is left of the batch (max_in_flight = 1: "later" is never sent) ...
  Batch c = batch_of({{"ab", "1"}, {"crash", "1"}, {"later", "1"}});
  failed = 0;
  ASSERT_TRUE(fn->compute_batch(c.inputs(), &out, &failed).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.0f, 0.0f}));
  EXPECT_EQ(failed, 2);
  // ... and the next batch gets a fresh process (restart = true).
  failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 0.0f, 3.0f}));
  EXPECT_EQ(failed, 1);
}

TEST_F(CommandFixture, NoRestartKeepsFailing) {
  auto fn = make("once.py", R"(import json, sys
req = json.loads(sys.stdin.readline())
print(json.dumps({"id": req["id"], "score": 2}), flush=True)
)", {{"on_failure", "zero"}, {"restart", false}});
  Batch b = batch_of({{"a", "1"}, {"b", "1"}});
  std::vector<float> out;
  int64_t failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  EXPECT_EQ(out, (std::vector<float>{2.0f, 0.0f}));
  EXPECT_EQ(failed, 1);
  failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(failed, 2);
  auto strict = make("once2.py", "import sys\n", {{"restart", false}});
  Status st = strict->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  st = strict->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("earlier and restart = false"), std::string::npos) << st.message();
}

TEST_F(CommandFixture, ProcessIsKilledOnShutdown) {
  {
    auto fn = make("stubborn.py", R"(import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(os.path.dirname(sys.argv[0]), "pid.txt"), "w").write(str(os.getpid()))
while True:
    time.sleep(1)  # ignores stdin EOF
)");
    for (int i = 0; i < 500 && !std::filesystem::exists(dir.path + "/pid.txt"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string pid_text = slurp(dir.path + "/pid.txt");
  ASSERT_FALSE(pid_text.empty());
  EXPECT_NE(kill(pid_t(std::stol(pid_text)), 0), 0) << "the reward process outlived its reward";
}

TEST_F(CommandFixture, StartErrorsAndConfigErrors) {
  auto c = RewardComposer::make({{"command", 1.0, {{"command", {"/nonexistent/grader"}}}}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cannot start '/nonexistent/grader'"), std::string::npos) << c.status().message();
  auto err = [](json p) {
    auto fn = reward_make({"command", 1.0, std::move(p)});
    return fn.ok() ? std::string("ok") : fn.status().message();
  };
  EXPECT_NE(err(json::object()).find("missing command"), std::string::npos);
  EXPECT_NE(err({{"command", "python3 x.py"}}).find("expected an array of strings"), std::string::npos);
  EXPECT_NE(err({{"command", {"x"}}, {"timeout", -1}}).find("timeout = -1"), std::string::npos);
  EXPECT_NE(err({{"command", {"x"}}, {"max_in_flight", 0}}).find("max_in_flight = 0"), std::string::npos);
  EXPECT_EQ(err({{"command", {"python3", "x.py"}}}), "ok");
}

// `grpo train` with a command reward that logs each completion it scores:
// each step's reward/command/mean must be the mean of what it returned for
// that step's B·G completions, in order.
TEST_F(CommandFixture, TrainRecordsCommandRewardsInMetrics) {
  dir.write("log_reward.py", R"(import json, sys
log = open(sys.argv[1], "a")
for line in sys.stdin:
    req = json.loads(line)
    score = len(req["completion"]) / 10.0 + (1.0 if req["answer"] in req["completion"] else 0.0)
    log.write(json.dumps({"completion": req["completion"], "score": score}) + "\n")
    log.flush()
    print(json.dumps({"id": req["id"], "score": score}), flush=True)
)");
  const std::string out = dir.path + "/run", log = dir.path + "/scored.jsonl";
  const std::string cmd = std::string("cd ") + GRPO_SOURCE_DIR + " && " + GRPO_BINARY_PATH +
                          " train examples/remote-reward.toml --out " + out +
                          " --set train.steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4"
                          " --set eval.every=0 --set eval.at_start=false --set log.plot=false --set log.progress=off"
                          " --set checkpoint.save_final=false"
                          " --set 'reward.command.command=[\"python3\", \"" + dir.path + "/log_reward.py\", \"" + log + "\"]'"
                          " > " + dir.path + "/train.log 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << slurp(dir.path + "/train.log");
  std::vector<double> scores;
  std::istringstream ls(slurp(log));
  for (std::string line; std::getline(ls, line);) scores.push_back(json::parse(line)["score"].get<double>());
  ASSERT_EQ(scores.size(), 16u) << "2 steps x 2 prompts x 4 samples";
  std::istringstream ms(slurp(out + "/metrics.jsonl"));
  int step = 0;
  for (std::string line; std::getline(ms, line);) {
    json m = json::parse(line);
    if (!m.contains("reward/command/mean")) continue;
    ASSERT_LT(step, 2);
    double mean = 0;
    for (int i = 0; i < 8; ++i) mean += scores[size_t(step * 8 + i)] / 8.0;
    EXPECT_NEAR(m["reward/command/mean"].get<double>(), mean, 1e-5) << "step " << step + 1;
    EXPECT_EQ(m["reward/command/failed"].get<double>(), 0.0);
    ++step;
  }
  EXPECT_EQ(step, 2);
  const std::string resolved = slurp(out + "/config.toml");
  EXPECT_NE(resolved.find("command = [\"python3\", \"" + dir.path + "/log_reward.py\""), std::string::npos) << resolved;
}

}  // namespace
}  // namespace grpo
