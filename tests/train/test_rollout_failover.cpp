// RolloutFailover (rollout.server_on_failure = "local") against a scripted server: one
// warning per loss naming the URL and the reason, no probe while the NCCL bridge is down, at
// most one probe per step with a short timeout, and one line when the server is back. The
// loop with a real `grpo serve`: tests/server/test_server_failover.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/rollout_failover.h"
#include "train/rollout_server.h"

namespace grpo {
namespace {

class ScriptedServer : public RolloutServer {
 public:
  const std::string& url() const override { return url_; }
  Result<int64_t> health() override { return probe(30); }
  Result<int64_t> probe(double timeout_s) override {
    timeouts.push_back(timeout_s);
    if (!up) return error_status("rollout.server_url = " + url_ + ": no server answers GET /health (refused)");
    return int64_t(7);
  }
  Result<RemoteGeneration> generate(const std::vector<std::vector<int32_t>>&, const std::vector<SamplingParams>&,
                                    int64_t) override {
    return error_status("not used");
  }
  bool up = false;
  std::vector<double> timeouts;  // of every probe

 private:
  std::string url_ = "http://127.0.0.1:9";
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(RolloutFailover, OneWarningPerLossAndOneProbePerStep) {
  ScriptedServer srv;
  RolloutFailover f(srv);
  EXPECT_FALSE(f.down());
  EXPECT_TRUE(f.try_return(true, 1));  // up: nothing to ask
  EXPECT_TRUE(srv.timeouts.empty());

  testing::internal::CaptureStderr();
  f.lost(error_status("POST /v1/completions: the answer is not JSON: <html>"), 3);
  f.lost(error_status("a second failure of the same loss"), 3);  // the async producer and the loop: one warning
  const std::string warned = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(f.down());
  EXPECT_EQ(f.n_lost(), 1);
  EXPECT_EQ(count(warned, "[grpo warning]"), 1u) << warned;
  EXPECT_NE(warned.find("rollout server http://127.0.0.1:9 lost at generation 3"), std::string::npos) << warned;
  EXPECT_NE(warned.find("the answer is not JSON: <html>"), std::string::npos) << warned;
  EXPECT_NE(warned.find("rollouts now come from the in-process engine"), std::string::npos) << warned;
  EXPECT_EQ(warned.find("a second failure"), std::string::npos) << warned;

  // The NCCL bridge has not rejoined: the server would not hold the trainer's weights.
  EXPECT_FALSE(f.try_return(false, 4));
  EXPECT_TRUE(srv.timeouts.empty());
  // Once per step, however often the loop asks.
  EXPECT_FALSE(f.try_return(true, 4));
  EXPECT_FALSE(f.try_return(true, 4));
  EXPECT_EQ(srv.timeouts.size(), 1u);
  EXPECT_EQ(f.n_probes(), 1);
  EXPECT_TRUE(f.down());
  srv.up = true;
  EXPECT_FALSE(f.try_return(true, 4));  // back, but this step has asked already
  testing::internal::CaptureStderr();
  EXPECT_TRUE(f.try_return(true, 5));
  EXPECT_TRUE(f.try_return(true, 6));
  const std::string back = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(f.down());
  EXPECT_EQ(srv.timeouts.size(), 2u);
  EXPECT_EQ(count(back, "[grpo info]"), 1u) << back;
  EXPECT_NE(back.find("rollout server http://127.0.0.1:9 answers again (policy version 7)"), std::string::npos) << back;
  EXPECT_NE(back.find("from step 5"), std::string::npos) << back;
  for (double t : srv.timeouts) {
    EXPECT_GT(t, 0.0);
    EXPECT_LE(t, 5.0) << "a probe must not hold a step for long";
  }

  // A second loss warns again.
  testing::internal::CaptureStderr();
  f.lost(error_status("HTTP 500"), 6);
  const std::string again = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(again, "[grpo warning]"), 1u) << again;
  EXPECT_EQ(f.n_lost(), 2);
}

}  // namespace
}  // namespace grpo
