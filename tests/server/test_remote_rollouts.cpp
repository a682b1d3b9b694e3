// rollout.server_url (TRL's server mode): `grpo train` taking its rollouts from a
// separate `grpo serve` over HTTP. On the CPU with batch-invariant kernels the server's
// completions equal the in-process engine's bit for bit, so a run through the server is
// the in-process run (completions, logprobs, rewards, loss); [async] with a server that
// holds one version trains on the same batches as the synchronous loop; an unreachable,
// killed or hung server ends the run with an error naming the URL, within
// rollout.server_timeout_s (rollout.server_on_failure = "error"; "local":
// test_server_failover.cpp); the client re-asks answers from an older policy version while
// a bridge is on, and refuses malformed answers.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <map>
#include <thread>

#include "core/timer.h"
#include "remote_rollouts_util.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

TEST(RemoteRollouts, OneStepThroughTheServerIsTheInProcessRunBitForBit) {
  ServeProcess srv;
  ASSERT_TRUE(srv.ready()) << "grpo serve did not start";
  // Temperature 1 (raw logprobs) and 0.7 with top-k (the loop asks for processed logprobs).
  // Evals (on the in-process engine, whose pool is sized for them) run in both.
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"eval.every=1", "eval.n_prompts=4"},
        std::vector<std::string>{"rollout.temperature=0.7", "rollout.top_k=20", "eval.every=1", "eval.n_prompts=4"}}) {
    const std::string a = temp_dir("local"), b = temp_dir("server");
    std::map<int64_t, Seen> local, remote;
    auto ra = grpo_train(remote_config(a, 1, sets), options(a, &local));
    ASSERT_TRUE(ra.ok()) << ra.status().message();
    std::vector<std::string> sb = sets;
    sb.push_back("rollout.server_url=" + srv.url());
    auto rb = grpo_train(remote_config(b, 1, sb), options(b, &remote));
    ASSERT_TRUE(rb.ok()) << rb.status().message();
    ASSERT_EQ(remote.size(), 1u);
    EXPECT_EQ(remote.at(1).policy_version, 0);
    EXPECT_EQ(local.at(1).completions.size(), 12u);
    expect_same_batches(local, remote);
    auto ma = step_metrics(a), mb = step_metrics(b);
    // Eval records (at steps 0 and 1) apart from the step record.
    auto split_evals = [](std::vector<nlohmann::json>& v) {
      std::vector<nlohmann::json> ev;
      std::erase_if(v, [&](const nlohmann::json& j) {
        if (j.contains("loss")) return false;
        ev.push_back(j);
        return true;
      });
      return ev;
    };
    const auto ea = split_evals(ma), eb = split_evals(mb);
    ASSERT_EQ(ea.size(), 2u);
    ASSERT_EQ(eb.size(), 2u);
    for (size_t i = 0; i < ea.size(); ++i)
      for (const char* k : {"eval/accuracy", "eval/reward", "eval/completion_length", "eval/n"})
        EXPECT_EQ(ea[i][k].get<double>(), eb[i][k].get<double>()) << k;
    EXPECT_EQ(eb[0]["eval/n"].get<double>(), 4.0);
    expect_same_training(ma, mb);
    ASSERT_EQ(mb.size(), 1u);
    EXPECT_EQ(mb[0]["rollout/server_policy_version"].get<double>(), 0.0);
    EXPECT_FALSE(ma[0].contains("rollout/server_policy_version"));
    // The in-process engine only evaluates: its KV pool holds the 4 eval prompts, not the CPU default.
    auto info = [](const std::string& d) {
      std::ifstream f(d + "/run_info.json");
      return nlohmann::json::parse(f);
    };
    EXPECT_EQ(info(a)["engine"]["kv_budget_bytes"].get<int64_t>(), int64_t(256) << 20);
    EXPECT_LE(info(b)["engine"]["kv_budget_bytes"].get<int64_t>(), int64_t(1) << 20);
    EXPECT_EQ(info(b)["engine"]["max_num_seqs"].get<int64_t>(), 4);
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

TEST(RemoteRollouts, AsyncWithAServerOfOneVersionTrainsTheSynchronousBatches) {
  // Without a bridge the server keeps version 0, so generation g is the same batch for both
  // loops; [async] must hand each step the generation the synchronous loop trains on.
  ServeProcess srv;
  ASSERT_TRUE(srv.ready());
  const std::string a = temp_dir("sync"), b = temp_dir("async");
  std::map<int64_t, Seen> sync_seen, async_seen;
  const std::string url = "rollout.server_url=" + srv.url();
  auto ra = grpo_train(remote_config(a, 3, {url}), options(a, &sync_seen));
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  auto rb = grpo_train(remote_config(b, 3, {url, "async.max_staleness=1"}), options(b, &async_seen));
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  expect_same_batches(sync_seen, async_seen);
  const auto ma = step_metrics(a), mb = step_metrics(b);
  expect_same_training(ma, mb);
  for (size_t i = 0; i < mb.size(); ++i) {
    EXPECT_EQ(async_seen.at(int64_t(i) + 1).policy_version, 0);  // tagged from the answers
    EXPECT_EQ(mb[i]["async/policy_version"].get<double>(), 0.0);
    EXPECT_EQ(mb[i]["async/version_lag"].get<double>(), double(i));  // the trainer at step i, the server at 0
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(RemoteRollouts, TwoDataParallelRanksSendTheirOwnPrompts) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found (scripts/setup.sh installs it)";
  ServeProcess srv;
  ASSERT_TRUE(srv.ready());
  const std::string dir = temp_dir("dp");
  {
    std::ofstream f(dir + "/run.toml");
    f << remote_toml(dir + "/unused", 1);
  }
  auto run = [&](const std::string& prefix, const std::string& out) {
    const std::string cmd = prefix + " " GRPO_BINARY_PATH " train " + dir + "/run.toml --out " + out +
                            " --threads 1 --set rollout.prompts_per_step=4 --set rollout.server_url=" + srv.url() +
                            " > " + out + ".log 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  };
  ASSERT_EQ(run("", dir + "/one"), 0);
  ASSERT_EQ(run("mpirun --allow-run-as-root --oversubscribe -np 2", dir + "/two"), 0);
  const auto a = step_metrics(dir + "/one"), b = step_metrics(dir + "/two");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  // Each rank's prompts keep their one-rank seeds: the global batch is the same samples.
  for (const char* k : {"reward/mean", "reward/std", "accuracy", "tokens/generated", "completion/mean_length"})
    EXPECT_EQ(a[0][k].get<double>(), b[0][k].get<double>()) << k;
  EXPECT_NEAR(a[0]["grad_norm"].get<double>(), b[0]["grad_norm"].get<double>(), 1e-6 * a[0]["grad_norm"].get<double>());
  EXPECT_EQ(b[0]["rollout/server_policy_version"].get<double>(), 0.0);
  fs::remove_all(dir);
}

TEST(RemoteRollouts, UnreachableServerIsAnErrorBeforeTheRunStarts) {
  const std::string out = temp_dir("unreachable");
  fs::remove_all(out);
  const int port = free_port();  // nothing listens there
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto r = grpo_train(remote_config(out, 1, {"rollout.server_url=" + url}), options(out, nullptr));
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("rollout.server_url = " + url), std::string::npos) << m;
  EXPECT_NE(m.find("no server answers GET /health"), std::string::npos) << m;
  EXPECT_NE(m.find("grpo serve --model " + arith_dir() + " --port " + std::to_string(port)), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(out)) << "no run directory for a run that cannot sample";

  // A loop without an HTTP client (a program other than `grpo train`) says so.
  TrainLoopOptions o = options(out, nullptr);
  o.make_rollout_server = nullptr;
  auto r2 = grpo_train(remote_config(out, 1, {"rollout.server_url=" + url}), o);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("run it with `grpo train`"), std::string::npos) << r2.status().message();
}

TEST(RemoteRollouts, ServerKilledMidRunEndsTheRunWithTheUrl) {
  ServeProcess srv;
  ASSERT_TRUE(srv.ready());
  const std::string out = temp_dir("killed");
  TrainLoopOptions o = options(out, nullptr);
  o.on_step = [&](int64_t step) {
    if (step == 1) srv.kill_now();
  };
  const double t0 = now_seconds();
  auto r = grpo_train(remote_config(out, 3, {"rollout.server_url=" + srv.url(), "rollout.server_timeout_s=30"}), o);
  const double took = now_seconds() - t0;
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("rollout of generation 1"), std::string::npos) << m;
  EXPECT_NE(m.find("rollout.server_url = " + srv.url() + ": POST /v1/completions"), std::string::npos) << m;
  EXPECT_NE(m.find("is the server still running?"), std::string::npos) << m;
  EXPECT_NE(m.find("set rollout.server_on_failure = \"local\""), std::string::npos) << m;  // the default is "error"
  EXPECT_LT(took, 20.0) << "a refused connection must not wait for the timeout";
  fs::remove_all(out);
}

TEST(RemoteRollouts, HungServerTimesOutWithinServerTimeout) {
  ServeProcess srv;
  ASSERT_TRUE(srv.ready());
  const std::string out = temp_dir("hung");
  TrainLoopOptions o = options(out, nullptr);
  double t_stop = 0;
  o.on_step = [&](int64_t step) {
    if (step == 1) {
      kill(srv.pid, SIGSTOP);  // accepts nothing, answers nothing
      t_stop = now_seconds();
    }
  };
  auto r = grpo_train(remote_config(out, 3, {"rollout.server_url=" + srv.url(), "rollout.server_timeout_s=1.5"}), o);
  const double waited = now_seconds() - t_stop;
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("rollout.server_url = " + srv.url()), std::string::npos) << m;
  EXPECT_TRUE(m.find("no answer within rollout.server_timeout_s = 1.5 s") != std::string::npos ||
              m.find("connection timed out") != std::string::npos)
      << m;
  EXPECT_GE(waited, 1.4);
  EXPECT_LT(waited, 10.0) << "the run must end about server_timeout_s after the server stopped answering";
  fs::remove_all(out);
}

TEST(RolloutClient, WaitsForAServerThatStartsLate) {
  // grpo serve --receive listens only after it joined the trainer's bridge: the loop waits.
  const int port = free_port();
  RolloutClientOptions co;
  co.url = "http://127.0.0.1:" + std::to_string(port);
  co.model_path = "M";
  auto cli = rollout_client_make(co);
  ASSERT_TRUE(cli.ok());
  const double t0 = now_seconds();
  Status none = rollout_server_wait(*cli.value(), 0.5, 0.05);
  ASSERT_FALSE(none.ok());
  EXPECT_GE(now_seconds() - t0, 0.5);
  EXPECT_NE(none.message().find("waited 0.5 s (rollout.server_timeout_s)"), std::string::npos) << none.message();
  EXPECT_NE(none.message().find("grpo serve --model M --port " + std::to_string(port)), std::string::npos) << none.message();

  std::unique_ptr<ServeProcess> srv;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    srv = std::make_unique<ServeProcess>(port);
  });
  Status st = rollout_server_wait(*cli.value(), 60, 0.05);
  late.join();
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(RolloutClient, AsksAgainWhileTheServerIsOlderThanTheBridgedVersion) {
  Served s;
  s.svc.set_policy_version(0);
  RolloutClientOptions co;
  co.url = "http://127.0.0.1:" + std::to_string(s.http->port());
  co.timeout_s = 20;
  co.max_concurrency = 2;
  auto cli = rollout_client_make(co);
  ASSERT_TRUE(cli.ok()) << cli.status().message();
  auto h = cli.value()->health();
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h.value(), 0);
  SamplingParams p;
  p.n = 2;
  p.max_tokens = 6;
  p.seed = 11;
  const std::vector<std::vector<int32_t>> prompts = {bytes_of("3+4=\n"), bytes_of("5-2=\n")};
  std::thread bump([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    s.svc.set_policy_version(1);  // what grpo serve --receive does once the weights are in
  });
  auto g = cli.value()->generate(prompts, {p, p}, 1);
  bump.join();
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g.value().policy_version_min, 1);
  EXPECT_GT(g.value().n_resent, 0);
  ASSERT_EQ(g.value().outs.size(), 4u);
  // Same keys as the engine: (seed, j) for sample j of a prompt.
  std::vector<SamplingParams> ps = {p, p};
  auto direct = s.eng.generate(prompts, ps);
  ASSERT_TRUE(direct.ok());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(g.value().outs[i].completion_ids, direct.value()[i].completion_ids) << i;
    EXPECT_TRUE(same_bits(g.value().outs[i].logprobs, direct.value()[i].logprobs)) << i;
    EXPECT_EQ(g.value().outs[i].prompt_ids, prompts[i / 2]);
  }

  // A server that never catches up: an error after the timeout, naming both versions.
  co.timeout_s = 0.5;
  auto slow = rollout_client_make(co);
  auto g2 = slow.value()->generate(prompts, {p, p}, 5);
  ASSERT_FALSE(g2.ok());
  EXPECT_NE(g2.status().message().find("policy version 1, but the trainer sent version 5"), std::string::npos)
      << g2.status().message();
}

TEST(RolloutClient, RequestCarriesTheSamplingParamsAndMalformedAnswersAreErrors) {
  SamplingParams p;
  p.n = 3;
  p.max_tokens = 9;
  p.min_tokens = 2;
  p.temperature = 0.5f;
  p.top_k = 7;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 0xFFFFFFFFFFFFFFF0ull;
  p.stop = {"</answer>"};
  p.stop_token_ids = {3};
  p.ignore_eos = true;
  p.logprobs_mode = LogprobsMode::processed;
  const nlohmann::json j = rollout_request_body({1, 2, 3}, p);
  EXPECT_EQ(j["prompt"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(j["n"], 3);
  EXPECT_EQ(j["max_tokens"], 9);
  EXPECT_EQ(j["min_tokens"], 2);
  EXPECT_EQ(j["top_k"], 7);
  EXPECT_EQ(j["seed"].get<uint64_t>(), 0xFFFFFFFFFFFFFFF0ull);
  EXPECT_EQ(j["stop"], nlohmann::json({"</answer>"}));
  EXPECT_EQ(j["stop_token_ids"], nlohmann::json({3}));
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["logprobs"], 0);
  EXPECT_EQ(j["logprobs_mode"], "processed");
  EXPECT_EQ(j["return_token_ids"], true);

  // The server accepts the request and honours logprobs_mode; a bad mode is a 400 naming it.
  Served s;
  nlohmann::json body = rollout_request_body(bytes_of("1+1=\n"), SamplingParams{});
  body["n"] = 1;
  body["max_tokens"] = 4;
  body["seed"] = 3;
  auto [st_raw, raw] = s.post("/v1/completions", body);
  ASSERT_EQ(st_raw, 200) << raw.dump();
  body["temperature"] = 0.5;
  body["logprobs_mode"] = "processed";
  auto [st_proc, proc] = s.post("/v1/completions", body);
  ASSERT_EQ(st_proc, 200) << proc.dump();
  body["logprobs_mode"] = "raw";
  auto [st_raw2, raw2] = s.post("/v1/completions", body);
  ASSERT_EQ(st_raw2, 200);
  EXPECT_EQ(proc["choices"][0]["token_ids"], raw2["choices"][0]["token_ids"]);  // same tokens, other distribution
  EXPECT_NE(proc["choices"][0]["logprobs"]["token_logprobs"], raw2["choices"][0]["logprobs"]["token_logprobs"]);
  body["logprobs_mode"] = "final";
  auto [st_bad, bad] = s.post("/v1/completions", body);
  EXPECT_EQ(st_bad, 400);
  EXPECT_EQ(bad["error"]["param"], "logprobs_mode");

  // Answers that cannot become RequestOutputs.
  SamplingParams one;
  one.n = 1;
  const std::vector<int32_t> prompt = {1, 2};
  auto answer = [] {
    return nlohmann::json::parse(R"({"choices": [{"index": 0, "text": "ab", "finish_reason": "stop",
      "token_ids": [97, 98], "prompt_token_ids": [1, 2],
      "logprobs": {"token_logprobs": [-0.5, -0.25]}}], "policy_version": 4})");
  };
  std::vector<RequestOutput> outs;
  int64_t v = -2;
  ASSERT_TRUE(rollout_answer_parse(answer(), prompt, one, &outs, &v).ok());
  EXPECT_EQ(v, 4);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].completion_ids, (std::vector<int32_t>{97, 98}));
  EXPECT_EQ(outs[0].logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(outs[0].finish_reason, FinishReason::stop);
  auto expect_bad = [&](nlohmann::json a, const char* fragment) {
    std::vector<RequestOutput> o;
    int64_t ver = 0;
    Status st = rollout_answer_parse(a, prompt, one, &o, &ver);
    ASSERT_FALSE(st.ok()) << fragment;
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
  };
  nlohmann::json a = answer();
  a["choices"][0].erase("token_ids");
  expect_bad(a, "no 'token_ids'");
  a = answer();
  a["choices"][0]["logprobs"] = nullptr;
  expect_bad(a, "no 'logprobs.token_logprobs'");
  a = answer();
  a["choices"][0]["logprobs"]["token_logprobs"] = {-0.5};
  expect_bad(a, "2 token ids but 1 logprobs");
  a = answer();
  a["choices"][0]["finish_reason"] = "abort";
  expect_bad(a, "finished with 'abort'");
  a = answer();
  a["choices"][0]["prompt_token_ids"] = {9, 1, 2};
  expect_bad(a, "prompt_token_ids differ");
  a = answer();
  a["choices"].push_back(a["choices"][0]);
  expect_bad(a, "2 choices for n = 1");
  expect_bad(nlohmann::json::array(), "not a JSON object");
}
