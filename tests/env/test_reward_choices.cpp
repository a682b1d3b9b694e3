// [[reward]] parameters that take one of a few names (unit, latency, mode,
// on_failure): a bad name is an error naming the function, the parameter and
// the allowed names, in TOML and in --set; every name prints back as written.
// Here rather than in tests/metrics because the http reward links only here.
// The allowed lists are written out, not taken from the code's tables.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "env/rewards.h"
#include "train/run_config.h"

namespace grpo {
namespace {

using Values = std::vector<std::string>;

std::string join(const Values& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// [[reward]] parameters that take one of a few names.
struct RewardChoice {
  const char* function;
  const char* param;
  Values values;
  nlohmann::json required;  // other params the function needs
};

std::vector<RewardChoice> reward_choices() {
  return {{"length_linear", "unit", {"tokens", "chars"}, nlohmann::json::object()},
          {"length_overlong", "unit", {"tokens", "chars"}, nlohmann::json::object()},
          {"inference_aware", "latency", {"modelled", "wall"}, nlohmann::json::object()},
          {"http", "mode", {"batch", "single"}, {{"url", "http://127.0.0.1:9/score"}}},
          {"http", "on_failure", {"error", "zero"}, {{"url", "http://127.0.0.1:9/score"}}},
          {"command", "on_failure", {"error", "zero"}, {{"command", {"python3", "score.py"}}}}};
}

TEST(RewardChoices, RewardChoiceParamsNameTheAllowedValues) {
  for (const auto& rc : reward_choices()) {
    nlohmann::json p = rc.required;
    p[rc.param] = "bogus";
    auto r = reward_make({rc.function, 1.0, p});
    ASSERT_FALSE(r.ok()) << rc.function << "." << rc.param;
    const std::string want = std::string("reward '") + rc.function + "': " + rc.param + " = \"bogus\": must be one of " +
                             join(rc.values);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    auto o = run_config_parse("", "cfg.toml", {std::string("reward.") + rc.function + "." + rc.param + "=bogus"});
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.status().message().find(want), std::string::npos) << o.status().message();
  }
}

TEST(RewardChoices, RewardChoiceParamsRoundTrip) {
  for (const auto& rc : reward_choices()) {
    for (const auto& v : rc.values) {
      std::string toml = std::string("[[reward]]\nname = \"") + rc.function + "\"\n" + rc.param + " = \"" + v + "\"\n";
      for (auto it = rc.required.begin(); it != rc.required.end(); ++it) toml += it.key() + " = " + it.value().dump() + "\n";
      auto c = run_config_parse(toml, "cfg.toml", {"model.device=cpu", "model.dtype=f32"});
      ASSERT_TRUE(c.ok()) << toml << c.status().message();
      auto back = run_config_parse(run_config_to_toml(c.value()), "config.toml");
      ASSERT_TRUE(back.ok()) << back.status().message();
      ASSERT_EQ(back.value().reward.size(), 1u);
      EXPECT_EQ(back.value().reward[0].params.at(rc.param), v) << rc.function << "." << rc.param;
    }
  }
}

}  // namespace
}  // namespace grpo
