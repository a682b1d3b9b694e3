// KDE valley curriculum against tests/fixtures/curriculum/kde_cases.json
// (tools/ref/make_kde_fixtures.py, an independent Python implementation of the
// definitions in train/curriculum.h): grid densities, valleys and depths, cuts,
// cluster assignment, means, rollouts per cluster, EMA updates; plus the
// checkpoint state round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "train/advantages.h"
#include "train/curriculum.h"

using namespace grpo;
using json = nlohmann::json;

namespace {

const std::string kFixture = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/curriculum/kde_cases.json";

bool load_fixture(json* out) {
  std::ifstream f(kFixture);
  if (!f) return false;
  *out = json::parse(f);
  return true;
}

std::vector<std::string> ids_of(size_t n) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back("p" + std::to_string(i));
  return ids;
}

}  // namespace

TEST(Curriculum, KdeValleysAndAllocationMatchReference) {
  json fx;
  if (!load_fixture(&fx)) GTEST_SKIP() << kFixture << " missing: run python3 tools/ref/make_kde_fixtures.py [--stdlib]";
  ASSERT_FALSE(fx["cases"].empty());
  for (const auto& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto emas = c["emas"].get<std::vector<double>>();
    const int M = c["grid_points"].get<int>();
    const double h = c["bandwidth"].get<double>();
    const auto d = kde_grid_density(emas, h, M);
    const auto want_d = c["density"].get<std::vector<double>>();
    ASSERT_EQ(d.size(), want_d.size());
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      const double err = std::fabs(d[i] - want_d[i]) / (1e-300 + 1e-12 * std::fabs(want_d[i]) + 1e-15);
      if (err > worst) worst = err, worst_i = i;
    }
    EXPECT_LE(worst, 1.0) << "density at grid " << worst_i << ": " << d[worst_i] << " vs " << want_d[worst_i];

    const auto vs = kde_find_valleys(d, M);
    ASSERT_EQ(vs.size(), c["valleys"].size());
    for (size_t k = 0; k < vs.size(); ++k) {
      EXPECT_EQ(vs[k].index, c["valleys"][k]["index"].get<int>());
      EXPECT_NEAR(vs[k].depth, c["valleys"][k]["depth"].get<double>(), 1e-9);
    }
    const auto cuts = kde_select_cuts(vs, c["n_clusters"].get<int>());
    const auto want_cuts = c["cuts"].get<std::vector<int>>();
    ASSERT_EQ(cuts.size(), want_cuts.size());
    for (size_t k = 0; k < cuts.size(); ++k) EXPECT_EQ(cuts[k].index, want_cuts[k]);

    const auto assign = c["assignment"].get<std::vector<int>>();
    for (size_t j = 0; j < emas.size(); ++j) EXPECT_EQ(kde_cluster_of(emas[j], cuts), assign[j]) << "problem " << j;

    // The whole curriculum on these EMAs: restore them as state, compare clusters.
    CurriculumOptions o;
    o.bandwidth = h;
    o.grid_points = M;
    o.n_clusters = c["n_clusters"].get<int>();
    o.base = c["base"].get<int>();
    o.alpha = c["alpha"].get<double>();
    o.max_generations = c["max_generations"].get<int>();
    auto cur = KdeCurriculum::make(o, ids_of(emas.size()));
    ASSERT_TRUE(cur.ok()) << cur.status().message();
    json st = {{"n_updates", 1}, {"ema", json::array()}};
    for (size_t j = 0; j < emas.size(); ++j) st["ema"].push_back({"p" + std::to_string(j), emas[j]});
    ASSERT_TRUE(cur.value().restore(st, "fixture").ok());
    const auto& cl = cur.value().clusters();
    ASSERT_EQ(cl.size(), c["cluster_sizes"].size());
    for (size_t k = 0; k < cl.size(); ++k) {
      EXPECT_EQ(cl[k].size, c["cluster_sizes"][k].get<int64_t>());
      if (c["cluster_means"][k].is_null()) EXPECT_TRUE(std::isnan(cl[k].mean));
      else EXPECT_NEAR(cl[k].mean, c["cluster_means"][k].get<double>(), 1e-12);
      EXPECT_EQ(cl[k].group_size, c["group_sizes"][k].get<int>()) << "cluster " << k;
    }
    for (size_t j = 0; j < emas.size(); ++j)
      EXPECT_EQ(cur.value().group_size(j), c["group_sizes"][size_t(assign[j])].get<int>());
  }
}

TEST(Curriculum, EmaUpdatesMatchReference) {
  json fx;
  if (!load_fixture(&fx)) GTEST_SKIP() << kFixture << " missing: run python3 tools/ref/make_kde_fixtures.py [--stdlib]";
  for (const auto& c : fx["ema_cases"]) {
    CurriculumOptions o;
    o.ema_init = c["init"].get<double>();
    o.ema_decay = c["decay"].get<double>();
    auto cur = KdeCurriculum::make(o, ids_of(c["n"].get<size_t>()));
    ASSERT_TRUE(cur.ok());
    for (const auto& s : c["steps"])
      cur.value().update(s["indices"].get<std::vector<size_t>>(), s["rewards"].get<std::vector<double>>());
    const auto want = c["ema"].get<std::vector<double>>();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(cur.value().ema(i), want[i]) << "problem " << i;
  }
}

TEST(Curriculum, StateRoundTripIsExact) {
  CurriculumOptions o;
  o.n_clusters = 3;
  auto a = KdeCurriculum::make(o, ids_of(50));
  ASSERT_TRUE(a.ok());
  for (int g = 0; g < 6; ++g) {
    std::vector<size_t> idx;
    std::vector<double> r;
    for (size_t i = size_t(g) * 7; i < size_t(g) * 7 + 9 && i < 50; ++i) {
      idx.push_back(i);
      r.push_back(std::sin(double(i) * 1.7) * 0.6 + 0.4);
    }
    a.value().update(idx, r);
  }
  auto b = KdeCurriculum::make(o, ids_of(50));
  ASSERT_TRUE(b.ok());
  // Through text, as in a checkpoint file.
  ASSERT_TRUE(b.value().restore(json::parse(a.value().to_json().dump()), "test").ok());
  EXPECT_EQ(b.value().n_updates(), a.value().n_updates());
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(b.value().ema(i), a.value().ema(i));
    EXPECT_EQ(b.value().group_size(i), a.value().group_size(i));
  }
  EXPECT_EQ(b.value().report(3).dump(), a.value().report(3).dump());
}

TEST(Curriculum, BadInputsNameTheProblem) {
  CurriculumOptions o;
  auto dup = KdeCurriculum::make(o, {"a", "b", "a"});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("share the id 'a'"), std::string::npos) << dup.status().message();
  auto c = KdeCurriculum::make(o, {"a", "b"});
  ASSERT_TRUE(c.ok());
  auto s = c.value().restore({{"n_updates", 1}, {"ema", json::array({json::array({"zz", 0.5})})}}, "ckpt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'zz'"), std::string::npos) << s.message();
  auto s2 = c.value().restore({{"n_updates", 1}, {"ema", json::array({json::array({"a", 1.5})})}}, "ckpt");
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.message().find("outside [0, 1]"), std::string::npos) << s2.message();
}

TEST(Curriculum, UnequalGroupAdvantagesUseEachGroupsOwnStats) {
  // Groups of 3 and 1: group 0 rewards {1, 2, 3} (mean 2, unbiased std 1); group 1 a single reward (std 0).
  auto a = compute_advantages_grouped({1, 2, 3, 5}, {3, 1}, ScaleRewards::group);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_NEAR(a.value()[0], -1.0 / (1.0 + 1e-4), 1e-6);
  EXPECT_NEAR(a.value()[1], 0.0, 1e-7);
  EXPECT_NEAR(a.value()[2], 1.0 / (1.0 + 1e-4), 1e-6);
  EXPECT_EQ(a.value()[3], 0.0f);
  // Uniform sizes reproduce compute_advantages exactly.
  std::vector<float> r = {0.5f, 1.5f, -2.0f, 0.25f, 3.0f, 3.0f};
  auto u = compute_advantages(r, 3, ScaleRewards::batch);
  auto g = compute_advantages_grouped(r, {3, 3}, ScaleRewards::batch);
  ASSERT_TRUE(u.ok() && g.ok());
  EXPECT_EQ(u.value(), g.value());
  auto bad = compute_advantages_grouped({1, 2}, {3}, ScaleRewards::group);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("add up to 3"), std::string::npos) << bad.status().message();
}
