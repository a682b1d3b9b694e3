// GRPO loop with the KDE valley curriculum on the tiny CPU model: per-prompt
// rollouts follow the clusters, the cluster reports and the plot section are
// written, and a run stopped at step 2 and resumed matches an uninterrupted
// run bit for bit (the curriculum's EMAs travel in trainer_state.json).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loop_test_util.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

// 4 train problems and B = 2: every problem comes back each 2 steps, so its EMA
// (and the cluster it falls in) changes what it is given.
RunConfig curriculum_config(int steps) {
  return tiny_config(steps, {"data.arithmetic.train_size=4", "curriculum.type=kde_valley", "curriculum.alpha=1.0",
                             "curriculum.n_clusters=3", "curriculum.ema_decay=0.5", "curriculum.report_every=2"});
}

TrainLoopResult run(const RunConfig& cfg, const std::string& out, bool resume = false, int64_t stop_after = 0) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.n_threads = 2;
  o.console = nullptr;
  o.stop_after_steps = stop_after;
  auto r = grpo_train(cfg, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : TrainLoopResult{};
}

}  // namespace

TEST(GrpoLoopCurriculum, AllocatesWritesReportsAndResumesBitExactly) {
  const std::string straight = make_temp_dir("cur_straight"), split = make_temp_dir("cur_split");
  run(curriculum_config(6), straight);
  TrainLoopResult first = run(curriculum_config(6), split, false, /*stop_after=*/2);
  EXPECT_EQ(first.steps, 2);
  TrainLoopResult second = run(curriculum_config(6), split, /*resume=*/true);
  EXPECT_EQ(second.steps, 6);

  MetricsFile a = read_metrics(straight + "/metrics.jsonl"), b = read_metrics(split + "/metrics.jsonl");
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(b.steps.size(), 6u);
  // Before any update every problem sits at EMA 0.5 in one cluster: G = round(4 * (1 + 1 * 0.5)) = 6.
  EXPECT_EQ(a.steps[0]["curriculum/group_size_mean"].get<double>(), 6.0);
  // (curriculum/n_clusters is logged after the batch's EMA update, so it already sees the new EMAs.)
  for (size_t i = 0; i < a.steps.size(); ++i)
    for (const char* k : {"loss", "reward/mean", "grad_norm", "completion/mean_length", "curriculum/group_size_mean",
                          "curriculum/ema_mean", "curriculum/n_clusters"}) {
      ASSERT_TRUE(a.steps[i].contains(k) && b.steps[i].contains(k)) << k;
      EXPECT_EQ(a.steps[i][k], b.steps[i][k]) << "step record " << i << " key " << k;
    }

  // Reports at steps 2, 4, 6 (and latest), identical between the runs.
  for (const char* f : {"report-2.json", "report-4.json", "report-6.json", "latest.json"}) {
    ASSERT_TRUE(fs::exists(straight + "/curriculum/" + f)) << f;
    ASSERT_TRUE(fs::exists(split + "/curriculum/" + f)) << f;
    std::ifstream fa(straight + "/curriculum/" + f), fb(split + "/curriculum/" + f);
    std::stringstream sa, sb;
    sa << fa.rdbuf();
    sb << fb.rdbuf();
    EXPECT_EQ(sa.str(), sb.str()) << f;
  }
  auto rep = nlohmann::json::parse(std::ifstream(straight + "/curriculum/latest.json"));
  EXPECT_EQ(rep["density"].size(), 512u);
  EXPECT_EQ(rep["n_problems"], 4);
  int64_t members = 0;
  for (const auto& c : rep["clusters"]) members += c["size"].get<int64_t>();
  EXPECT_EQ(members, 4);

  std::ifstream plot(straight + "/plot.html");
  std::stringstream ps;
  ps << plot.rdbuf();
  EXPECT_NE(ps.str().find("Curriculum (KDE valleys)"), std::string::npos);

  // The checkpoint carries the state.
  std::ifstream ts(split + "/checkpoint-6/trainer_state.json");
  auto st = nlohmann::json::parse(ts);
  ASSERT_TRUE(st.contains("curriculum"));
  EXPECT_EQ(st["curriculum"]["ema"].size(), 4u);
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(GrpoLoopCurriculum, BadConfigNamesTheKey) {
  auto c = run_config_parse(tiny_config_toml(tiny_model_dir(), 2), "t.toml", {"curriculum.type=kde"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("curriculum.type"), std::string::npos) << c.status().message();
  auto d = run_config_parse(tiny_config_toml(tiny_model_dir(), 2), "t.toml", {"curriculum.ema_decay=1.0"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("curriculum.ema_decay"), std::string::npos) << d.status().message();
  // A remote environment picks its own problems and group sizes.
  auto e = run_config_parse(tiny_config_toml(tiny_model_dir(), 2), "t.toml",
                            {"data.env=remote", "eval.every=0", "curriculum.type=kde_valley"});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("curriculum.type"), std::string::npos) << e.status().message();
}
