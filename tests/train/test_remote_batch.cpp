// Samples from posted groups (train/remote_batch.h) against hand-computed
// values: the prompt/completion split of tokens + masks, the aligned logprob
// slices, TRL-style group advantages (unbiased std + 1e-4), posted advantages,
// overrides, staleness, and the reasons groups are dropped.
#include <gtest/gtest.h>

#include <cmath>

#include "train/remote_batch.h"

using namespace grpo;
using json = nlohmann::json;

namespace {

double metric(const MetricList& m, const std::string& k) {
  for (const auto& [n, v] : m)
    if (n == k) return v;
  ADD_FAILURE() << "no metric " << k;
  return NAN;
}

json group4(std::vector<double> scores) {
  json g{{"tokens", json::array()}, {"masks", json::array()}, {"scores", scores}};
  for (size_t i = 0; i < scores.size(); ++i) {
    g["tokens"].push_back({1, 2, int(10 + i), 3});
    g["masks"].push_back({-100, -100, int(10 + i), 3});
  }
  return g;
}

}  // namespace

TEST(RemoteBatch, SplitsTokensAtTheFirstTrainedPositionAndSlicesLogprobs) {
  json g{{"tokens", {{5, 6, 7, 8, 9}, {5, 6, 4, 4, 4}}},
         {"masks", {{-100, -100, 7, -100, 9}, {-100, -100, 4, 4, 4}}},
         {"scores", {1.0, 0.0}},
         {"inference_logprobs", {{1.0, 1.0, -0.5, -0.7, -0.9}, {1.0, 1.0, -0.1, -0.2, -0.3}}},
         {"ref_logprobs", {{0.0, 0.0, -0.6, -0.8, -1.0}, {0.0, 0.0, -0.2, -0.3, -0.4}}}};
  auto r = remote_batch_build(json::array({g}), RemoteBatchOptions{});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& s = r.value().samples;
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].prompt, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(s[0].completion, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(s[0].mask, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(s[0].rollout_logp, (std::vector<float>{-0.5f, -0.7f, -0.9f}));
  EXPECT_EQ(s[0].ref_logp, (std::vector<float>{-0.6f, -0.8f, -1.0f}));
  EXPECT_TRUE(s[0].weights.empty());
  EXPECT_TRUE(r.value().has_rollout_logp[0]);
  // Two scores 1, 0: mean 0.5, unbiased std sqrt(0.5).
  const double a = 0.5 / (std::sqrt(0.5) + 1e-4);
  EXPECT_NEAR(s[0].advantage, a, 1e-6);
  EXPECT_NEAR(s[1].advantage, -a, 1e-6);
  EXPECT_DOUBLE_EQ(metric(r.value().metrics, "reward/mean"), 0.5);
}

TEST(RemoteBatch, GroupBatchAndNoScaling) {
  json batch = json::array({group4({0, 1, 1, 0}), group4({2, 2, 2, 2})});
  RemoteBatchOptions o;
  auto g = remote_batch_build(batch, o);
  ASSERT_TRUE(g.ok());
  const double sd = std::sqrt(1.0 / 3.0);  // scores 0,1,1,0: squared deviations 4·0.25 over n−1 = 3
  EXPECT_NEAR(g.value().samples[1].advantage, 0.5 / (sd + 1e-4), 1e-6);
  EXPECT_NEAR(g.value().samples[0].advantage, -0.5 / (sd + 1e-4), 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(g.value().samples[size_t(i)].advantage, 0.f);  // zero-variance group
  EXPECT_DOUBLE_EQ(metric(g.value().metrics, "frac_reward_zero_std"), 0.5);
  o.scale = ScaleRewards::none;
  auto n = remote_batch_build(batch, o);
  EXPECT_NEAR(n.value().samples[1].advantage, 0.5, 1e-6);
  o.scale = ScaleRewards::batch;
  auto b = remote_batch_build(batch, o);
  // Batch std over 0,1,1,0,2,2,2,2: mean 1.25, squared deviations 2·1.5625 + 2·0.0625 + 4·0.5625 = 5.5, /7.
  const double bsd = std::sqrt(5.5 / 7.0);
  EXPECT_NEAR(b.value().samples[1].advantage, 0.5 / (bsd + 1e-4), 1e-6);
}

TEST(RemoteBatch, PostedAdvantagesAndOverrides) {
  json g = group4({0, 1, 0, 1});
  g["advantages"] = {{9, 9, 0.25, 0.25}, {0, 0, -1, -1}, {0, 0, 2, 2}, {0, 0, 3, 3}};
  g["overrides"] = {json::object(), json::object(), json{{"set_advantage_to_zero", true}}, json::object()};
  auto r = remote_batch_build(json::array({g}), RemoteBatchOptions{});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().samples.size(), 4u);
  EXPECT_FLOAT_EQ(r.value().samples[0].advantage, 0.25f);  // prompt positions do not count
  EXPECT_FLOAT_EQ(r.value().samples[1].advantage, -1.f);
  EXPECT_FLOAT_EQ(r.value().samples[2].advantage, 0.f);
  EXPECT_FLOAT_EQ(r.value().samples[3].advantage, 3.f);
  g["advantages"][3] = {0, 0, 3, 4};  // varies across trained tokens: the group cannot be trained exactly
  auto d = remote_batch_build(json::array({g, group4({0, 1, 0, 1})}), RemoteBatchOptions{});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value().samples.size(), 4u);
  EXPECT_EQ(metric(d.value().metrics, "remote/dropped_groups"), 1.0);
  ASSERT_EQ(d.value().warnings.size(), 1u);
  EXPECT_NE(d.value().warnings[0].find("advantages[3]"), std::string::npos);
}

TEST(RemoteBatch, StalenessDropsOrDownWeights) {
  json old = group4({0, 1, 0, 1});
  old["generation_params"] = {{"policy_version", 7}};
  json fresh = group4({1, 0, 1, 0});
  fresh["group_overrides"] = {{"policy_version", 9}};
  json per_seq = group4({1, 0, 0, 0});
  per_seq["generation_params"] = {{"policy_version", 10}};
  per_seq["overrides"] = {json{{"policy_version", 6}}, json::object(), json::object(), json::object()};
  json untagged = group4({0, 0, 1, 1});
  RemoteBatchOptions o;
  o.current_version = 10;
  o.max_staleness = 2;
  auto r = remote_batch_build(json::array({old, fresh, per_seq, untagged}), o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().samples.size(), 8u);  // old (lag 3) and per_seq (oldest sequence lag 4) dropped
  EXPECT_EQ(metric(r.value().metrics, "remote/stale_dropped_groups"), 2.0);
  EXPECT_EQ(metric(r.value().metrics, "remote/untagged_groups"), 1.0);
  EXPECT_EQ(metric(r.value().metrics, "remote/staleness_max"), 1.0);
  o.stale_drop = false;
  o.stale_weight = 0.5;
  auto w = remote_batch_build(json::array({old, per_seq}), o);
  ASSERT_EQ(w.value().samples.size(), 8u);
  EXPECT_EQ(w.value().samples[0].weights, (std::vector<float>{0.5f, 0.5f}));   // lag 3: 0.5^1
  EXPECT_EQ(w.value().samples[4].weights, (std::vector<float>{0.25f, 0.25f})); // lag 4: 0.5^2
  EXPECT_EQ(metric(w.value().metrics, "remote/stale_downweighted_groups"), 2.0);
}

TEST(RemoteBatch, BadGroupsAreDroppedWithTheReason) {
  json big = group4({0, 1, 0, 1});
  big["tokens"][2][2] = 300;
  json bad_shape = group4({0, 1});
  bad_shape["masks"][0] = {-100};
  json untrained = group4({0, 1, 0, 1});
  untrained["masks"][1] = {-100, -100, -100, -100};
  RemoteBatchOptions o;
  o.vocab_size = 257;
  auto r = remote_batch_build(json::array({big, bad_shape, untrained}), o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().samples.size(), 3u);
  EXPECT_EQ(metric(r.value().metrics, "remote/dropped_groups"), 2.0);
  EXPECT_EQ(metric(r.value().metrics, "remote/untrained_sequences"), 1.0);
  ASSERT_EQ(r.value().warnings.size(), 2u);
  EXPECT_NE(r.value().warnings[0].find("id 300"), std::string::npos);
  EXPECT_NE(r.value().warnings[1].find("masks[0]"), std::string::npos);
  EXPECT_FALSE(remote_batch_build(json::object(), o).ok());
}

#include "train/run_config.h"

TEST(RemoteConfig, KeysAndTheirChecks) {
  const std::string base = "[model]\npath = \"m\"\n[data]\nenv = \"remote\"\n";
  auto ok = run_config_parse(base + "[remote]\nport = 0\nmax_staleness = 3\nstale = \"down_weight\"\n", "t.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok.value().remote.max_staleness, 3);
  EXPECT_EQ(ok.value().remote.stale, StalePolicy::down_weight);
  auto msg = [&](const std::string& extra) {
    auto c = run_config_parse(base + extra, "t.toml");
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_NE(msg("[train]\nnum_iterations = 2\n").find("train.num_iterations"), std::string::npos);
  EXPECT_NE(msg("[eval]\nevery = 5\n").find("eval.every"), std::string::npos);
  EXPECT_NE(msg("[remote]\nstale = \"sometimes\"\n").find("remote.stale"), std::string::npos);
  EXPECT_NE(msg("[remote]\nurl = \"ftp://x\"\n").find("remote.url"), std::string::npos);
  EXPECT_NE(msg("[remote]\nstale_weight = 0.0\n").find("remote.stale_weight"), std::string::npos);
  EXPECT_NE(msg("[remote]\nno_such_key = 1\n").find("no_such_key"), std::string::npos);
}
