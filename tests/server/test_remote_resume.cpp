// A checkpoint of `grpo train` hosting the trajectory API (data.env = "remote")
// holds the queue: groups posted over HTTP, a run "killed" after two steps, and a
// fresh process-like store resumed from the checkpoint serves exactly the groups
// the first store would have served next, knows the registered environment (its
// id answers GET /status-env with a JSON body) and keeps the counters. Also the
// store's snapshot round trip and its refusal of damaged snapshots.
#include <filesystem>

#include "env/trajectory_source.h"
#include "server/trajectory_api.h"
#include "server_test_util.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;

using Json = nlohmann::json;  // the store speaks plain nlohmann::json (grpo::json is ordered)

namespace {

// Group g: two sequences of a 3-token prompt (masked) and a 3-token completion,
// ids tagged by g so that every group is recognisable in a batch.
Json group(int g) {
  Json t = Json::array(), m = Json::array();
  for (int i = 0; i < 2; ++i) {
    t.push_back({49, 43, 49, 60 + g, 70 + i, 256});
    m.push_back({-100, -100, -100, 60 + g, 70 + i, 256});
  }
  return Json{{"tokens", t}, {"masks", m}, {"scores", {0.0, 1.0}}, {"env_id", 0}};
}

int tag_of(const Json& batch) {
  EXPECT_EQ(batch.size(), 1u) << batch.dump();  // batch_size 2 = one group of 2
  return batch[0]["tokens"][0][3].get<int>() - 60;
}

RunConfig remote_config(const std::string& out, int steps) {
  const std::string toml =
      "[run]\noutput_dir = \"" + out + "\"\n"
      "[model]\npath = \"" + arith_dir() + "\"\ndtype = \"f32\"\ndevice = \"cpu\"\n"
      "[data]\nenv = \"remote\"\n"
      "[rollout]\nnum_generations = 2\nprompts_per_step = 1\nmax_new_tokens = 8\n"
      "[train]\nsteps = " + std::to_string(steps) + "\nlr = 1e-3\nmicro_batch = 2\n"
      "[eval]\nevery = 0\n"
      "[checkpoint]\nevery = 1\nsave_final = true\n"
      "[log]\nprogress = \"off\"\nplot = false\nlevel = \"warn\"\n"
      "[remote]\nmax_wait = 20\npoll_interval = 0.02\n";
  auto c = run_config_parse(toml, "remote.toml");
  GRPO_CHECK_MSG(c.ok(), c.status().message().c_str());
  return c.value();
}

// The hosted source of `grpo train`, over a store the test can reach through HTTP;
// records every batch the trainer takes. With `post_on_register`, an environment
// registers and posts groups 1..4 right after the trainer registers.
class RecordingSource : public TrajectorySource {
 public:
  RecordingSource(TrajectoryStore& store, int port, bool post_on_register)
      : reader_(store), port_(port), post_(post_on_register) {}
  Status register_trainer(const Json& reg) override {
    GRPO_TRY(reader_.register_trainer(reg));
    if (!post_) return ok_status();
    httplib::Client c("127.0.0.1", port_);
    auto b = c.Get("/batch");  // the trainer's first pull: environments may register now
    if (!b || b->status != 200) return error_status("GET /batch failed");
    auto e = c.Post("/register-env",
                    Json{{"max_token_length", 64}, {"desired_name", "env"}, {"weight", 1.0}, {"group_size", 2},
                         {"min_batch_allocation", nullptr}}
                        .dump(),
                    "application/json");
    if (!e || e->status != 200 || Json::parse(e->body).value("env_id", -1) != 0)
      return error_status("POST /register-env failed: " + (e ? e->body : std::string("no answer")));
    for (int g = 1; g <= 4; ++g) {
      auto p = c.Post("/scored_data", group(g).dump(), "application/json");
      if (!p || p->status != 200) return error_status("POST /scored_data failed");
    }
    return ok_status();
  }
  Result<std::optional<Json>> next_batch() override {
    auto b = reader_.next_batch();
    if (b.ok() && b.value()) taken.push_back(tag_of(*b.value()));
    return b;
  }
  std::string wait_status() override { return reader_.wait_status(); }
  Json checkpoint_state() override { return reader_.checkpoint_state(); }
  Status restore_checkpoint_state(const Json& s) override { return reader_.restore_checkpoint_state(s); }

  std::vector<int> taken;

 private:
  StoreTrajectorySource reader_;
  int port_;
  bool post_;
};

struct HostedApi {
  TrajectoryStore store;
  TrajectoryApiServer server{store, [] {
                               TrajectoryApiOptions o;
                               o.port = 0;
                               o.n_threads = 4;
                               return o;
                             }()};
  HostedApi() {
    Status st = server.start();
    GRPO_CHECK_MSG(st.ok(), st.message().c_str());
  }
};

Result<TrainLoopResult> train(const RunConfig& cfg, const std::string& out, std::shared_ptr<RecordingSource> src,
                              bool resume, int64_t stop_after) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.n_threads = 1;
  o.console = nullptr;
  o.stop_after_steps = stop_after;
  o.make_trajectory_source = [src](const RunConfig&) -> Result<std::shared_ptr<TrajectorySource>> {
    return std::shared_ptr<TrajectorySource>(src);
  };
  return grpo_train(cfg, o);
}

}  // namespace

TEST(RemoteResume, CheckpointHoldsTheQueueAndTheResumedRunServesTheSameGroups) {
  const std::string out = std::filesystem::temp_directory_path() / ("grpo_remote_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  HostedApi first;
  auto src1 = std::make_shared<RecordingSource>(first.store, first.server.port(), true);
  auto r1 = train(remote_config(out, 4), out, src1, false, 2);  // killed after 2 of 4 steps
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  ASSERT_EQ(src1->taken.size(), 2u);
  const std::string ckpt = checkpoint_latest(out);
  ASSERT_EQ(std::filesystem::path(ckpt).filename(), "checkpoint-2");

  // What the first store would have served next, had the trainer lived (over HTTP).
  std::vector<int> expected;
  {
    httplib::Client c("127.0.0.1", first.server.port());
    for (int i = 0; i < 2; ++i) {
      auto b = c.Get("/batch");
      ASSERT_TRUE(b && b->status == 200);
      const Json j = Json::parse(b->body);
      ASSERT_TRUE(j["batch"].is_array()) << b->body;
      expected.push_back(tag_of(j["batch"]));
    }
  }
  // Independently of the order: the four posted groups, each trained once over both runs.
  std::vector<int> all = src1->taken;
  all.insert(all.end(), expected.begin(), expected.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int>{1, 2, 3, 4}));

  // A new process: a fresh store, resumed from the checkpoint; nobody posts.
  HostedApi second;
  auto src2 = std::make_shared<RecordingSource>(second.store, second.server.port(), false);
  auto r2 = train(remote_config(out, 4), out, src2, true, 0);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2.value().steps, 4);
  EXPECT_EQ(src2->taken, expected);

  // The environment's id is still known (as its GET /status-env sends it), and the counters went on.
  httplib::Client c("127.0.0.1", second.server.port());
  httplib::Request req;
  req.method = "GET";
  req.path = "/status-env";
  req.body = Json{{"env_id", 0}}.dump();
  req.set_header("Content-Type", "application/json");
  auto se = c.send(req);
  ASSERT_TRUE(se);
  EXPECT_EQ(se->status, 200) << se->body;
  const TrajectoryCounters k = second.store.counters();
  EXPECT_EQ(k.groups_received, 4);
  EXPECT_EQ(k.envs_registered, 1);
  EXPECT_EQ(k.queued_sequences, 0);
  std::filesystem::remove_all(out);
}

TEST(RemoteResume, SnapshotRoundTripsAndDamagedSnapshotsAreRefused) {
  TrajectoryStore a;
  ASSERT_EQ(a.register_trainer(Json{{"batch_size", 2}, {"max_token_len", 64}, {"num_steps", 10},
                                    {"save_checkpoint_interval", 1}, {"starting_step", 0}, {"checkpoint_dir", "/tmp/c"}})
                .status,
            200);
  a.batch();
  ASSERT_EQ(a.register_env(Json{{"max_token_length", 64}, {"desired_name", "env"}, {"weight", 2.0},
                                {"group_size", 2}, {"min_batch_allocation", 0.5}})
                .status,
            200);
  for (int g = 1; g <= 3; ++g) ASSERT_EQ(a.scored_data(group(g)).status, 200);
  Json odd = group(9);  // a group of 1 where the env posts groups of 2: buffered, not queued
  odd["tokens"].erase(1);
  odd["masks"].erase(1);
  odd["scores"] = {0.5};
  ASSERT_EQ(a.scored_data(odd).status, 200);
  const Json snap = Json::parse(a.snapshot().dump());  // through text, as the checkpoint stores it

  TrajectoryStore b;
  ASSERT_EQ(b.register_trainer(Json{{"batch_size", 2}, {"max_token_len", 64}, {"num_steps", 10},
                                    {"save_checkpoint_interval", 1}, {"starting_step", 0}, {"checkpoint_dir", "/tmp/c"}})
                .status,
            200);
  Status st = b.restore(snap);
  ASSERT_TRUE(st.ok()) << st.message();
  const TrajectoryCounters ca = a.counters(), cb = b.counters();
  EXPECT_EQ(cb.groups_received, ca.groups_received);
  EXPECT_EQ(cb.queued_sequences, 6);
  EXPECT_EQ(cb.buffered_sequences, 1);
  EXPECT_EQ(b.status_env(Json{{"env_id", 0}}).body, a.status_env(Json{{"env_id", 0}}).body);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.batch().body, a.batch().body) << "batch " << i;

  // Damaged snapshots: refused with the part named, and the store left as it was.
  TrajectoryStore c;
  Json bad = snap;
  bad["queue"][0]["masks"][0].erase(0);  // masks shorter than tokens
  Status e1 = c.restore(bad);
  EXPECT_FALSE(e1.ok());
  EXPECT_NE(e1.message().find("queue[0]"), std::string::npos) << e1.message();
  bad = snap;
  bad["version"] = 99;
  EXPECT_NE(c.restore(bad).message().find("version"), std::string::npos);
  bad = snap;
  bad["queue"][1]["env_id"] = 5;
  EXPECT_NE(c.restore(bad).message().find("env_id 5"), std::string::npos);
  EXPECT_EQ(c.counters().envs_registered, 0);
  EXPECT_EQ(c.counters().queued_sequences, 0);
}
