// The loss family (grpo, bnpo, dr_grpo, dapo, cispo; token- and sequence-level
// ratios; every vLLM importance-sampling mode) against an independent
// reimplementation of TRL's `_compute_loss` with dual-number gradients:
// tests/fixtures/grpo/loss_formulas.json, written by
// tools/ref/make_loss_formula_fixtures.py (Python stdlib only, committed).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "train/grpo_loss.h"

using namespace grpo;
using nlohmann::json;

namespace {

const char* kFixture = "/tests/fixtures/grpo/loss_formulas.json";

std::vector<float> floats(const json& j, const char* key) {
  std::vector<float> v;
  if (!j.contains(key)) return v;
  for (auto& x : j.at(key)) v.push_back(x.get<float>());
  return v;
}

json load_cases() {
  std::ifstream f(std::string(GRPO_SOURCE_DIR) + kFixture);
  if (!f) return json();
  return json::parse(f).at("cases");
}

}  // namespace

TEST(LossFormulas, MatchTrlReference) {
  const json cases = load_cases();
  if (cases.is_null())
    GTEST_SKIP() << kFixture << " is missing: run python3 tools/ref/make_loss_formula_fixtures.py";
  ASSERT_EQ(cases.size(), 50u);
  std::set<std::string> seen;
  int n_seq_clipped = 0, n_cispo_capped = 0, n_is_capped = 0;
  for (const json& c : cases) {
    const std::string name = c.at("name");
    seen.insert(name);
    const json& k = c.at("config");
    GrpoLossConfig cfg;
    auto lt = loss_type_from_string(k.at("loss_type"));
    auto lv = is_level_from_string(k.at("is_level"));
    auto im = is_mode_from_string(k.at("is_mode"));
    ASSERT_TRUE(lt.ok() && lv.ok() && im.ok()) << name;
    cfg.loss_type = lt.value();
    cfg.is_level = lv.value();
    cfg.is_mode = im.value();
    cfg.beta = k.at("beta").get<float>();
    cfg.epsilon = k.at("eps").get<float>();
    cfg.epsilon_high = k.at("eps_high").get<float>();
    cfg.is_cap = k.at("is_cap").get<float>();
    cfg.mask_truncated_completions = k.at("mask_truncated").get<bool>();
    cfg.max_completion_length = k.at("max_completion_length").get<int>();

    std::vector<int32_t> off = {0};
    for (auto& n : c.at("lens")) off.push_back(off.back() + n.get<int32_t>());
    const auto logp = floats(c, "logp"), adv = floats(c, "advantages"), old = floats(c, "old_logp"),
               roll = floats(c, "rollout_logp"), ref = floats(c, "ref_logp"), mask = floats(c, "mask"),
               w = floats(c, "weights");
    std::vector<uint8_t> trunc;
    for (auto& x : c.at("truncated")) trunc.push_back(x.get<bool>());
    GrpoLossInput in;
    in.seq_offsets = off;
    in.logp = logp;
    in.advantages = adv;
    in.old_logp = old;
    in.rollout_logp = roll;
    in.ref_logp = ref;
    in.mask = mask;
    in.weights = w;
    in.truncated = trunc;
    Status st = grpo_loss_check(cfg, in);
    ASSERT_TRUE(st.ok()) << name << ": " << st.message();
    GrpoLossNorm norm;
    norm.dapo_num_items = c.at("num_items_in_batch").get<double>();
    const GrpoLossOutput o = grpo_loss(cfg, in, norm);

    const double want = c.at("loss").get<double>();
    EXPECT_NEAR(o.loss, want, 1e-6 + 1e-5 * std::fabs(want)) << name;
    const json& g = c.at("dlogp");
    ASSERT_EQ(g.size(), o.dlogp.size()) << name;
    double max_diff = 0;
    int first_bad = -1;
    for (size_t t = 0; t < g.size(); ++t) {
      const double r = g[t].get<double>(), d = std::fabs(double(o.dlogp[t]) - r);
      max_diff = std::max(max_diff, d);
      if (first_bad < 0 && d > 1e-6 + 1e-5 * std::fabs(r)) first_bad = int(t);
    }
    EXPECT_LT(first_bad, 0) << name << ": dlogp[" << first_bad << "] = " << o.dlogp[size_t(std::max(0, first_bad))]
                            << ", reference " << g[size_t(std::max(0, first_bad))] << " (max |diff| " << max_diff
                            << ")";
    if (cfg.is_level == IsLevel::sequence && cfg.loss_type != LossType::cispo) n_seq_clipped += o.metrics.clip_region > 0;
    if (cfg.loss_type == LossType::cispo) n_cispo_capped += o.metrics.clip_high > 0;
    n_is_capped += o.metrics.is_capped > 0;
  }
  EXPECT_EQ(seen.size(), cases.size()) << "case names repeat";
  // The cases reach the branches that matter (clipped GSPO ratios, capped CISPO weights, capped IS).
  EXPECT_GT(n_seq_clipped, 0);
  EXPECT_GT(n_cispo_capped, 0);
  EXPECT_GT(n_is_capped, 0);
}

TEST(LossFormulas, NamesAndConfigErrors) {
  EXPECT_EQ(std::string(loss_type_name(loss_type_from_string("cispo").value())), "cispo");
  EXPECT_EQ(std::string(is_level_name(is_level_from_string("sequence").value())), "sequence");
  auto bad = is_level_from_string("seq");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("must be one of token, sequence"), std::string::npos) << bad.status().message();
  GrpoLossConfig c;
  c.loss_type = LossType::cispo;
  c.epsilon_high = 0.f;
  EXPECT_FALSE(c.validate().ok());
}
