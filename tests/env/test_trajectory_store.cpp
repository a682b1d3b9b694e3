// Conformance of the trajectory API's rules without HTTP (env/trajectory_store.h):
// the expected batches, counters and field shapes below are worked out by hand
// from Atropos's server.py / utils.py semantics, not read back from the code.
#include <gtest/gtest.h>

#include "env/trajectory_store.h"

using namespace grpo;
using json = nlohmann::json;

namespace {

json reg(int64_t batch_size, int64_t starting_step = 0) {
  return json{{"wandb_group", "g"},   {"wandb_project", "p"},         {"batch_size", batch_size},
              {"max_token_len", 512}, {"checkpoint_dir", "/tmp/ckpt"}, {"save_checkpoint_interval", 10},
              {"starting_step", starting_step}, {"num_steps", 100}};
}

// A group of n sequences whose first token is `tag` (to recognise it in a batch).
json group(int tag, int n, json env_id = nullptr) {
  json g{{"tokens", json::array()}, {"masks", json::array()}, {"scores", json::array()}};
  for (int i = 0; i < n; ++i) {
    g["tokens"].push_back({tag, 10 + i, 11});
    g["masks"].push_back({-100, 10 + i, 11});
    g["scores"].push_back(double(i));
  }
  if (!env_id.is_null()) g["env_id"] = env_id;
  return g;
}

std::vector<int> tags(const json& batch) {
  std::vector<int> t;
  for (const auto& g : batch) t.push_back(g["tokens"][0][0].get<int>());
  return t;
}

json env_body(const std::string& name, int64_t group_size, double weight = 1.0, int64_t max_len = 100,
              json min_alloc = nullptr) {
  return json{{"max_token_length", max_len}, {"desired_name", name}, {"weight", weight},
              {"group_size", group_size}, {"min_batch_allocation", min_alloc}};
}

}  // namespace

TEST(TrajectoryStore, RegisterInfoWandbAndStatus) {
  TrajectoryStore s;
  EXPECT_EQ(s.info().body, (json{{"batch_size", -1}, {"max_token_len", -1}}));
  EXPECT_EQ(s.wandb_info().body, (json{{"group", nullptr}, {"project", nullptr}, {"zmq_port", nullptr}}));
  ApiReply r = s.register_trainer(reg(8, 5));
  ASSERT_EQ(r.status, 200);
  ASSERT_TRUE(r.body.contains("uuid"));
  EXPECT_TRUE(r.body["uuid"].is_number_unsigned());
  EXPECT_EQ(s.info().body, (json{{"batch_size", 8}, {"max_token_len", 512}}));
  EXPECT_EQ(s.wandb_info().body["group"], "g");
  EXPECT_EQ(s.wandb_info().body["project"], "p");
  EXPECT_EQ(s.status().body, (json{{"current_step", 5}, {"queue_size", 0}}));
  // A second trainer registration keeps the first one's settings (Atropos initialises once).
  EXPECT_EQ(s.register_trainer(reg(16, 0)).status, 200);
  EXPECT_EQ(s.info().body["batch_size"], 8);
  // Missing field / bad type → 400.
  json bad = reg(8);
  bad.erase("num_steps");
  EXPECT_EQ(s.register_trainer(bad).status, 400);
  bad = reg(8);
  bad["batch_size"] = "eight";
  EXPECT_EQ(s.register_trainer(bad).status, 400);
}

TEST(TrajectoryStore, RegisterEnvWaitsForTrainerThenNamesAndNumbers) {
  TrajectoryStore s;
  s.register_trainer(reg(4, 3));
  EXPECT_EQ(s.register_env(env_body("gsm8k", 2)).body, (json{{"status", "wait for trainer to start"}}));
  EXPECT_TRUE(s.batch().body["batch"].is_null());  // the trainer's first poll starts the run
  ApiReply a = s.register_env(env_body("gsm8k", 2));
  ApiReply b = s.register_env(env_body("gsm8k", 2));
  ApiReply c = s.register_env(env_body("math", 2));
  EXPECT_EQ(a.body, (json{{"status", "success"}, {"env_id", 0}, {"wandb_name", "gsm8k_0"}, {"checkpoint_dir", "/tmp/ckpt"},
                          {"starting_step", 3}, {"checkpoint_interval", 10}, {"num_steps", 100}}));
  EXPECT_EQ(b.body["env_id"], 1);
  EXPECT_EQ(b.body["wandb_name"], "gsm8k_1");
  EXPECT_EQ(c.body["wandb_name"], "math_0");
  EXPECT_EQ(s.register_env(json{{"desired_name", "x"}, {"weight", 1.0}, {"group_size", 2}}).status, 400);
  EXPECT_EQ(s.register_env(env_body("x", 2, 1.0, 100, 1.5)).status, 400);
  EXPECT_EQ(s.disconnect_env(json{{"env_id", 1}}).body, (json{{"status", "success"}}));
  EXPECT_EQ(s.disconnect_env(json{{"env_id", 7}}).body["status"], "failure");
  EXPECT_EQ(s.counters().envs_connected, 2);
}

TEST(TrajectoryStore, BatchesAreWholeGroupsOfExactlyBatchSize) {
  TrajectoryStore s;
  s.register_trainer(reg(8));
  // Sizes 4, 2, 4, 2: groups of the largest size stand alone, the two 2s form one pack.
  for (auto [tag, n] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {3, 4}, {4, 2}})
    ASSERT_EQ(s.scored_data(group(tag, n)).body, (json{{"status", "received"}}));
  EXPECT_EQ(s.status().body["queue_size"], 4);
  ApiReply b = s.batch();
  ASSERT_TRUE(b.body["batch"].is_array());
  EXPECT_EQ(tags(b.body["batch"]), (std::vector<int>{1, 3}));
  EXPECT_EQ(s.status().body, (json{{"current_step", 1}, {"queue_size", 2}}));
  EXPECT_TRUE(s.batch().body["batch"].is_null());  // 4 sequences left < 8
  // A lone 3-sequence group can never fill a pack of 4: it waits.
  s.scored_data(group(5, 3));
  s.scored_data(group(6, 4));
  b = s.batch();
  EXPECT_EQ(tags(b.body["batch"]), (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(s.status().body["current_step"], 2);
  // Enough for two batches at once: both are formed (the step counts both), handed out last-first.
  for (int t = 10; t < 14; ++t) s.scored_data(group(t, 4));
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{12, 13}));
  EXPECT_EQ(s.status().body["current_step"], 4);
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{10, 11}));
  EXPECT_EQ(s.status().body["current_step"], 4);
}

TEST(TrajectoryStore, MinimumAllocationsComeFirst) {
  TrajectoryStore s;
  s.register_trainer(reg(4));
  s.batch();
  ASSERT_EQ(s.register_env(env_body("a", 2, 1.0, 100, 0.5)).body["env_id"], 0);
  ASSERT_EQ(s.register_env(env_body("b", 2)).body["env_id"], 1);
  s.scored_data(group(1, 2, 1));
  s.scored_data(group(2, 2, 1));
  // Env 0 must get at least half of the batch and has nothing queued: no batch.
  EXPECT_TRUE(s.batch().body["batch"].is_null());
  s.scored_data(group(3, 2, 0));
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{3, 1}));
  // Disconnected, its minimum no longer applies.
  s.disconnect_env(json{{"env_id", 0}});
  s.scored_data(group(4, 2, 1));
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{2, 4}));
}

TEST(TrajectoryStore, StatusEnvWeightsAndQueueCounts) {
  TrajectoryStore s;
  s.register_trainer(reg(8));
  s.batch();
  s.register_env(env_body("a", 2, 1.0, 100));
  s.register_env(env_body("b", 2, 1.0, 300, 0.25));
  s.scored_data(group(1, 2, 0));
  s.scored_data(group(2, 2, 0));
  s.scored_data(group(3, 2, 1));
  ApiReply r = s.status_env(json{{"env_id", 0}});
  ASSERT_EQ(r.status, 200);
  // weight 100·1 / (100 + 300); own 4 sequences + env 1's 2 (packed to 2) minus its minimum floor(8·0.25) = 2.
  EXPECT_DOUBLE_EQ(r.body["env_weight"].get<double>(), 0.25);
  EXPECT_EQ(r.body["queue_size"], 2);  // (4 + 2 − 2) / 2
  EXPECT_EQ(r.body["self_queue_size"], 2);
  EXPECT_EQ(r.body["max_group_size"], 2);
  EXPECT_DOUBLE_EQ(r.body["unallocated_fraction"].get<double>(), 0.75);
  EXPECT_EQ(r.body["current_step"], 0);
  ApiReply r1 = s.status_env(json{{"env_id", 1}});
  EXPECT_DOUBLE_EQ(r1.body["env_weight"].get<double>(), 0.75);
  EXPECT_EQ(r1.body["queue_size"], 3);  // own 2 + env 0's 4 (no minimum to hold back) = 6 → 6 / 2
  EXPECT_EQ(s.status_env(json{{"env_id", 9}}).status, 400);
  EXPECT_EQ(s.status_env(json::object()).status, 400);
}

TEST(TrajectoryStore, MixedSizeGroupsAreBufferedUntilTheyAddUp) {
  TrajectoryStore s;
  s.register_trainer(reg(4));
  s.batch();
  s.register_env(env_body("a", 4));
  EXPECT_EQ(s.scored_data(group(1, 2, 0)).body, (json{{"status", "buffered"}, {"buffer_size", 2}}));
  EXPECT_EQ(s.counters().queued_groups, 0);
  EXPECT_EQ(s.scored_data(group(2, 2, 0)).body, (json{{"status", "buffered"}, {"buffer_size", 0}}));
  EXPECT_EQ(s.counters().queued_groups, 2);
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{1, 2}));
  EXPECT_EQ(groups_summing_to({3, 2, 2, 1}, 4), (std::vector<size_t>{0, 3}));  // FIFO prefix: 3 + 1
  EXPECT_EQ(groups_summing_to({3, 2, 2}, 4), (std::vector<size_t>{1, 2}));     // needs the subset search
  EXPECT_TRUE(groups_summing_to({3, 3}, 4).empty());
}

TEST(TrajectoryStore, MalformedPostsAre400AndEnqueueNothing) {
  TrajectoryStore s;
  s.register_trainer(reg(4));
  auto expect_400 = [&](const json& body, const std::string& needle) {
    ApiReply r = s.scored_data(body);
    EXPECT_EQ(r.status, 400) << body.dump();
    EXPECT_NE(r.body.value("message", "").find(needle), std::string::npos) << r.body.dump();
  };
  json g = group(1, 2);
  json b = g;
  b["masks"][1] = json::array({-100, 3});
  expect_400(b, "masks[1]");
  b = g;
  b["scores"][0] = "high";
  expect_400(b, "scores[0]");
  b = g;
  b.erase("scores");
  expect_400(b, "scores");
  b = g;
  b.erase("tokens");
  expect_400(b, "tokens");
  b = g;
  b["scores"] = json::array({1.0});
  expect_400(b, "scores");
  b = g;
  b["tokens"][0][1] = 2.5;
  expect_400(b, "tokens[0]");
  b = g;
  b["inference_logprobs"] = json::array({json::array({1.0, -0.5, -0.1}), json::array({1.0})});
  expect_400(b, "inference_logprobs[1]");
  b = g;
  b["messages"] = json::array({json::array({json{{"role", "user"}}})});
  expect_400(b, "role");
  b = g;
  b["env_id"] = "zero";
  expect_400(b, "env_id");
  expect_400(json::array(), "object");
  // A list with one bad item: nothing of it is enqueued.
  json bad = group(2, 2);
  bad["masks"].erase(1);
  ApiReply r = s.scored_data_list(json::array({group(3, 2), bad}));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["message"].get<std::string>().find("item 1"), std::string::npos);
  EXPECT_EQ(s.counters().queued_groups, 0);
  EXPECT_EQ(s.counters().groups_received, 0);
  EXPECT_EQ(s.status().body["queue_size"], 0);
  EXPECT_GE(s.counters().posts_rejected, 11);
  // The well-formed list goes in whole.
  r = s.scored_data_list(json::array({group(3, 2), group(4, 2)}));
  EXPECT_EQ(r.body, (json{{"status", "received"}, {"groups_processed", 2}}));
  EXPECT_EQ(s.status().body["queue_size"], 2);
}

TEST(TrajectoryStore, LatestExampleKeepsEveryField) {
  TrajectoryStore s;
  s.register_trainer(reg(4));
  json empty = s.latest_example().body;
  EXPECT_EQ(empty["tokens"], json::array());
  EXPECT_EQ(empty["images"], json::array());
  json g = group(7, 2);
  g["generation_params"] = {{"temperature", 0.7}, {"policy_version", 3}};
  g["overrides"] = json::array({json::object(), json{{"set_advantage_to_zero", true}}});
  s.scored_data(g);
  json l = s.latest_example().body;
  for (const char* k : {"tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
                        "inference_logprobs", "overrides", "group_overrides", "images", "env_id"})
    EXPECT_TRUE(l.contains(k)) << k;
  EXPECT_EQ(l["tokens"], g["tokens"]);
  EXPECT_EQ(l["generation_params"]["policy_version"], 3);
  EXPECT_TRUE(l["advantages"].is_null());
}

TEST(TrajectoryStore, BoundedQueueRefusesWith503AndRetryAfter) {
  TrajectoryStoreOptions o;
  o.max_queued_sequences = 4;
  TrajectoryStore s(o);
  s.register_trainer(reg(4));
  EXPECT_EQ(s.scored_data(group(1, 4)).status, 200);
  ApiReply r = s.scored_data(group(2, 2));
  EXPECT_EQ(r.status, 503);
  EXPECT_GE(r.retry_after_s, 1);
  EXPECT_EQ(s.status().body["queue_size"], 1);
  EXPECT_EQ(s.scored_data_list(json::array({group(3, 1)})).status, 503);
  EXPECT_EQ(s.counters().posts_refused_full, 2);
  EXPECT_EQ(tags(s.batch().body["batch"]), (std::vector<int>{1}));
  EXPECT_EQ(s.scored_data(group(2, 2)).status, 200);  // room again once the trainer took a batch
}

TEST(TrajectoryStore, ResetClearsEverything) {
  TrajectoryStore s;
  s.register_trainer(reg(4, 2));
  s.scored_data(group(1, 2));
  ApiReply r = s.reset_data();
  EXPECT_EQ(r.text, "Reset successful");
  EXPECT_EQ(s.status().body, (json{{"current_step", 0}, {"queue_size", 0}}));
  EXPECT_EQ(s.info().body["batch_size"], -1);
  EXPECT_FALSE(s.trainer_registered());
  EXPECT_EQ(s.batch().body["status"], "error");
}
