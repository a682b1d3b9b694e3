// rollout.server_on_failure = "local": a `grpo serve` killed mid-run hands the rollouts to the
// trainer's own engine, which samples exactly as a run without a server would (on the CPU with
// batch-invariant kernels: the same completions, logprobs and losses bit for bit), with one
// warning and rollout/server_down = 1; a server started again on the same port is used again
// (rollout/server_down back to 0) after one probe per step; [async] samples the batches of a
// lost server on the trainer's thread, as the synchronous loop does. With the default "error"
// the run stops (test_remote_rollouts.cpp, ServerKilledMidRunEndsTheRunWithTheUrl).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>

#include "remote_rollouts_util.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

// The HTTP client, with every probe's timeout written down.
class ProbeCountingServer : public RolloutServer {
 public:
  ProbeCountingServer(std::unique_ptr<RolloutServer> inner, std::vector<double>* probes)
      : inner_(std::move(inner)), probes_(probes) {}
  const std::string& url() const override { return inner_->url(); }
  Result<int64_t> health() override { return inner_->health(); }
  Result<int64_t> probe(double timeout_s) override {
    probes_->push_back(timeout_s);
    return inner_->probe(timeout_s);
  }
  Result<RemoteGeneration> generate(const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<SamplingParams>& params, int64_t min_version) override {
    return inner_->generate(prompts, params, min_version);
  }

 private:
  std::unique_ptr<RolloutServer> inner_;
  std::vector<double>* probes_;
};

TrainLoopOptions counting_options(const std::string& out, std::map<int64_t, Seen>* seen, std::vector<double>* probes) {
  TrainLoopOptions o = options(out, seen);
  o.make_rollout_server = [probes](const RunConfig& c) -> Result<std::unique_ptr<RolloutServer>> {
    GRPO_ASSIGN_OR_RETURN(std::unique_ptr<RolloutServer> inner, rollout_client_make(rollout_client_options(c)));
    return std::unique_ptr<RolloutServer>(std::make_unique<ProbeCountingServer>(std::move(inner), probes));
  };
  return o;
}

std::vector<std::string> local_sets(const ServeProcess& srv) {
  return {"rollout.server_url=" + srv.url(), "rollout.server_on_failure=local", "rollout.server_timeout_s=30"};
}

std::vector<double> series(const std::vector<nlohmann::json>& m, const char* key) {
  std::vector<double> v;
  for (const auto& j : m) v.push_back(j.contains(key) ? j[key].get<double>() : -99.0);
  return v;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

nlohmann::json run_info(const std::string& dir) {
  std::ifstream f(dir + "/run_info.json");
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(ServerFailover, ALostServerHandsTheRolloutsToTheEngineAsARunWithoutAServer) {
  ServeProcess srv;
  ASSERT_TRUE(srv.ready()) << "grpo serve did not start";
  const std::string a = temp_dir("colocated"), b = temp_dir("lost");
  std::map<int64_t, Seen> colocated, lost;
  auto ra = grpo_train(remote_config(a, 4), options(a, &colocated));
  ASSERT_TRUE(ra.ok()) << ra.status().message();

  std::vector<double> probes;
  TrainLoopOptions o = counting_options(b, &lost, &probes);
  o.on_step = [&](int64_t step) {
    if (step == 1) srv.kill_now();  // generation 1 finds nobody
  };
  testing::internal::CaptureStderr();
  auto rb = grpo_train(remote_config(b, 4, local_sets(srv)), o);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(rb.ok()) << rb.status().message() << "\n" << log;
  EXPECT_EQ(rb.value().steps, 4);

  // Step 1 from the server, steps 2..4 from the engine: all of them the run without a server.
  expect_same_batches(colocated, lost);
  const auto ma = step_metrics(a), mb = step_metrics(b);
  expect_same_training(ma, mb);
  EXPECT_EQ(series(mb, "rollout/server_down"), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(series(mb, "rollout/server_policy_version"), (std::vector<double>{0, -1, -1, -1}));
  EXPECT_FALSE(ma[0].contains("rollout/server_down"));
  EXPECT_EQ(lost.at(1).policy_version, 0);
  EXPECT_EQ(lost.at(2).policy_version, -1);

  // One warning, naming the URL and the reason.
  EXPECT_EQ(count(log, "[grpo warning]"), 1u) << log;
  EXPECT_NE(log.find("rollout server " + srv.url() + " lost at generation 1"), std::string::npos) << log;
  EXPECT_NE(log.find("connection refused"), std::string::npos) << log;
  EXPECT_NE(log.find("rollouts now come from the in-process engine"), std::string::npos) << log;
  EXPECT_EQ(log.find("answers again"), std::string::npos) << log;
  // Asked once at each later step (3 and 4), briefly.
  ASSERT_EQ(probes.size(), 2u);
  for (double t : probes) EXPECT_LE(t, 5.0);

  // The engine's KV pool could take the rollouts over: sized as without a server.
  EXPECT_EQ(run_info(b)["engine"]["kv_budget_bytes"], run_info(a)["engine"]["kv_budget_bytes"]);
  EXPECT_EQ(run_info(b)["engine"]["max_num_seqs"], run_info(a)["engine"]["max_num_seqs"]);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(ServerFailover, AServerStartedAgainSamplesAgain) {
  auto srv = std::make_unique<ServeProcess>();
  ASSERT_TRUE(srv->ready());
  const int port = srv->port;
  const std::string url = srv->url();
  const std::string out = temp_dir("back");
  std::map<int64_t, Seen> seen;
  std::vector<double> probes;
  bool restarted = false;
  TrainLoopOptions o = counting_options(out, &seen, &probes);
  o.on_step = [&](int64_t step) {
    if (step == 1) srv->kill_now();
    if (step == 2) {  // no bridge: a new server on the same port, from the initial weights
      srv = std::make_unique<ServeProcess>(port);
      restarted = srv->ready();
    }
  };
  testing::internal::CaptureStderr();
  auto r = grpo_train(remote_config(out, 4, local_sets(*srv)), o);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.status().message() << "\n" << log;
  ASSERT_TRUE(restarted) << "grpo serve did not start again on port " << port;
  const auto m = step_metrics(out);
  EXPECT_EQ(series(m, "rollout/server_down"), (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(series(m, "rollout/server_policy_version"), (std::vector<double>{0, -1, 0, 0}));
  EXPECT_EQ(seen.at(3).policy_version, 0);  // answered by the server (an engine batch has none)
  EXPECT_EQ(probes.size(), 1u);             // at step 3, and it answered
  EXPECT_EQ(count(log, "lost at generation"), 1u) << log;
  EXPECT_EQ(count(log, "answers again"), 1u) << log;
  EXPECT_NE(log.find("rollout server " + url + " answers again (policy version 0): rollouts come from it again "
                     "from step 3"), std::string::npos) << log;

  // The batches after the return are the server's: those of a run that never lost it.
  const std::string ref = temp_dir("server_only");
  std::map<int64_t, Seen> server_only;
  auto rr = grpo_train(remote_config(ref, 4, local_sets(*srv)), options(ref, &server_only));
  ASSERT_TRUE(rr.ok()) << rr.status().message();
  server_only.erase(1);
  server_only.erase(2);
  seen.erase(1);
  seen.erase(2);
  expect_same_batches(server_only, seen);
  fs::remove_all(out);
  fs::remove_all(ref);
}

TEST(ServerFailover, AsyncSamplesTheLostServersBatchesOnTheTrainersThread) {
  // [async] max_staleness = 1 with the server killed after step 1: generation 2, launched at
  // step 2, finds nobody and is sampled after that step from its weights, as the synchronous
  // loop samples it at step 3 when its server is killed after step 2. Before: both take the
  // server's (one version, no bridge) batches.
  ServeProcess s_sync, s_async;
  ASSERT_TRUE(s_sync.ready());
  ASSERT_TRUE(s_async.ready());
  const std::string a = temp_dir("sync_lost"), b = temp_dir("async_lost");
  std::map<int64_t, Seen> sync_seen, async_seen;
  std::vector<double> probes_sync, probes_async;
  TrainLoopOptions oa = counting_options(a, &sync_seen, &probes_sync);
  oa.on_step = [&](int64_t step) {
    if (step == 2) s_sync.kill_now();
  };
  auto ra = grpo_train(remote_config(a, 4, local_sets(s_sync)), oa);
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  TrainLoopOptions ob = counting_options(b, &async_seen, &probes_async);
  ob.on_step = [&](int64_t step) {
    if (step == 1) s_async.kill_now();
  };
  std::vector<std::string> sets = local_sets(s_async);
  sets.push_back("async.max_staleness=1");
  auto rb = grpo_train(remote_config(b, 4, sets), ob);
  ASSERT_TRUE(rb.ok()) << rb.status().message();

  expect_same_batches(sync_seen, async_seen);
  const auto ma = step_metrics(a), mb = step_metrics(b);
  expect_same_training(ma, mb);
  EXPECT_EQ(series(ma, "rollout/server_down"), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(series(mb, "rollout/server_down"), (std::vector<double>{0, 0, 1, 1}));
  // The engine's batches are sampled from the weights they train: no lag.
  EXPECT_EQ(series(mb, "async/version_lag"), (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(async_seen.at(3).policy_version, 2);
  EXPECT_EQ(async_seen.at(4).policy_version, 3);
  EXPECT_EQ(probes_async.size(), 2u);  // steps 3 and 4
  fs::remove_all(a);
  fs::remove_all(b);
}
