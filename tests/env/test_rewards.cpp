// Reward functions and composition; expected values hand-derived in comments.
#include <gtest/gtest.h>

#include <cmath>

#include "env/rewards.h"

namespace grpo {
namespace {

Example gold(const char* a) {
  Example ex;
  ex.answer = a;
  return ex;
}

float run(const RewardSpec& s, const std::string& completion, const Example& ex = gold("4"), const Telemetry& t = {}) {
  auto fn = reward_make(s);
  EXPECT_TRUE(fn.ok()) << fn.status().message();
  return (*fn)->compute("prompt", completion, ex, t);
}

TEST(Rewards, Correct) {
  EXPECT_EQ(run({"correct"}, "<answer>4</answer>"), 1.0f);
  EXPECT_EQ(run({"gsm8k_correct"}, "#### 4"), 1.0f);
  EXPECT_EQ(run({"correct"}, "<answer>5</answer>"), 0.0f);
}

TEST(Rewards, FormatStrict) {
  EXPECT_TRUE(format_strict_match("<think>a</think><answer>4</answer>", false));
  EXPECT_TRUE(format_strict_match("\n <think>\nx\n</think>\n<answer> 4 </answer>\n", false));
  EXPECT_TRUE(format_strict_match("<think></think><answer>4</answer>", false));  // empty think allowed
  EXPECT_FALSE(format_strict_match("<think>a</think><answer> </answer>", false));  // blank answer
  EXPECT_FALSE(format_strict_match("x<think>a</think><answer>4</answer>", false));  // text before
  EXPECT_FALSE(format_strict_match("<think>a</think>so<answer>4</answer>", false));  // text between
  EXPECT_FALSE(format_strict_match("<think>a</think><answer>4</answer>.", false));  // text after
  EXPECT_FALSE(format_strict_match("<think>a<think>b</think><answer>4</answer>", false));  // nested tag
  EXPECT_FALSE(format_strict_match("<think>a</think><answer>4</answer><answer>5</answer>", false));
  EXPECT_FALSE(format_strict_match("<answer>4</answer>", false));
  EXPECT_TRUE(format_strict_match("a</think><answer>4</answer>", true));  // prompt opened <think>
  EXPECT_FALSE(format_strict_match("<think>a</think><answer>4</answer>", true));
  RewardSpec s{"format_strict"};
  EXPECT_EQ(run(s, "<think>a</think><answer>4</answer>"), 1.0f);
  EXPECT_EQ(run(s, "<answer>4</answer>"), 0.0f);
}

TEST(Rewards, FormatSoft) {
  EXPECT_EQ(format_soft_score("pre <think>a</think> <answer>4</answer> post", false), 1.0f);
  EXPECT_EQ(format_soft_score("<answer>4</answer>", false), 0.25f);  // two tags once: 2 * 0.125
  EXPECT_EQ(format_soft_score("<think>a</think> no answer", false), 0.25f);
  EXPECT_EQ(format_soft_score("<think>a", false), 0.125f);
  EXPECT_EQ(format_soft_score("nothing", false), 0.0f);
  EXPECT_EQ(format_soft_score("<answer>1</answer><answer>2</answer>", false), 0.0f);  // repeated tags earn nothing
  EXPECT_EQ(format_soft_score("a</think>\n<answer>4</answer>", true), 1.0f);
}

TEST(Rewards, LengthLinear) {
  RewardSpec s{"length_linear", 1.0, {{"target", 10}, {"scale", 20}}};
  Telemetry t;
  t.n_tokens = 10;
  EXPECT_EQ(run(s, "", gold("4"), t), 0.0f);
  t.n_tokens = 15;  // 5 over, scale 20 -> -0.25
  EXPECT_FLOAT_EQ(run(s, "", gold("4"), t), -0.25f);
  t.n_tokens = 100;  // capped at max_penalty 1
  EXPECT_FLOAT_EQ(run(s, "", gold("4"), t), -1.0f);
  RewardSpec c{"length_linear", 1.0, {{"target", 2}, {"scale", 4}, {"unit", "chars"}}};
  EXPECT_FLOAT_EQ(run(c, "abcd"), -0.5f);  // 4 chars, 2 over / 4
}

TEST(Rewards, LengthOverlongDapo) {
  // L_max = 100, L_cache = 20: free up to 80, then linear to -1 at 100.
  RewardSpec s{"length_overlong", 1.0, {{"max_len", 100}, {"cache_len", 20}}};
  auto at = [&](int64_t n) {
    Telemetry t;
    t.n_tokens = n;
    return run(s, "", gold("4"), t);
  };
  EXPECT_EQ(at(0), 0.0f);
  EXPECT_EQ(at(80), 0.0f);
  EXPECT_FLOAT_EQ(at(85), -0.25f);  // (80 - 85) / 20
  EXPECT_FLOAT_EQ(at(90), -0.5f);
  EXPECT_FLOAT_EQ(at(100), -1.0f);
  EXPECT_EQ(at(101), -1.0f);
}

TEST(Rewards, InferenceAwareWallLatency) {
  RewardSpec s{"inference_aware", 1.0,
               {{"alpha_latency", 0.1}, {"beta_tokens", 0.001}, {"gamma_kv_mb", 0.01}, {"delta_accept", 0.5},
                {"epsilon_reuse", 0.2}, {"latency", "wall"}}};
  Telemetry t;
  t.latency_s = 2.0;          // -0.2
  t.engine_steps = 1000;      // ignored under "wall"
  t.n_tokens = 100;           // -0.1
  t.kv_peak_bytes = 3 << 20;  // 3 MiB -> -0.03
  t.spec_proposed = 50;       // 30/50 = 0.6 -> +0.3
  t.spec_accepted = 30;
  t.prefix_hit_tokens = 30;   // 30/60 = 0.5 -> +0.1
  t.prompt_tokens = 60;
  // correct: 1 - 0.2 - 0.1 - 0.03 + 0.3 + 0.1 = 1.07; wrong: 0.07
  EXPECT_NEAR(run(s, "<answer>4</answer>", gold("4"), t), 1.07f, 1e-6);
  EXPECT_NEAR(run(s, "<answer>3</answer>", gold("4"), t), 0.07f, 1e-6);
  t.prompt_tokens = 0;  // reuse term vanishes
  EXPECT_NEAR(run(s, "<answer>4</answer>", gold("4"), t), 0.97f, 1e-6);
}

TEST(Rewards, InferenceAwareModelledLatencyAndAcceptance) {
  RewardSpec s{"inference_aware", 1.0,
               {{"alpha_latency", 0.5}, {"delta_accept", 0.25}, {"latency_step_s", 0.01},
                {"latency_prefill_token_s", 0.002}}};
  Telemetry t;
  t.latency_s = 99.0;       // wall clock: ignored by the default "modelled" latency
  t.engine_steps = 40;      // 40 * 0.01 = 0.4 s
  t.prompt_tokens = 60;     // 60 - 10 cached = 50 prefilled * 0.002 = 0.1 s
  t.prefix_hit_tokens = 10;
  t.spec_accept_rate = 1.0; // the rate is derived from the counts, not taken from this field
  // nothing drafted: accept = 0. 1 - 0.5 * 0.5 = 0.75
  EXPECT_NEAR(run(s, "<answer>4</answer>", gold("4"), t), 0.75f, 1e-6);
  t.spec_proposed = 80;     // 60/80 = 0.75 -> +0.1875
  t.spec_accepted = 60;
  EXPECT_NEAR(run(s, "<answer>4</answer>", gold("4"), t), 0.9375f, 1e-6);

  // Every term is reported, unweighted, in the documented order.
  auto comp = RewardComposer::make({s, {"correct", 2.0}});
  ASSERT_TRUE(comp.ok()) << comp.status().message();
  ASSERT_EQ(comp.value().n_terms(), 6u);
  const char* names[] = {"task", "latency", "tokens", "kv_mb", "accept", "reuse"};
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(comp.value().term_label(k), std::string("inference_aware/") + names[k]);
  t.n_tokens = 7;
  t.kv_peak_bytes = 1 << 19;
  RewardValues rv = comp.value().compute("", "<answer>4</answer>", gold("4"), t);
  ASSERT_EQ(rv.terms.size(), 6u);
  const double want[] = {1.0, 0.5, 7.0, 0.5, 0.75, 10.0 / 60.0};
  for (size_t k = 0; k < 6; ++k) EXPECT_NEAR(rv.terms[k], want[k], 1e-12) << names[k];
  EXPECT_NEAR(rv.total, 0.9375 + 2.0, 1e-6);
  bool logged = false;
  for (const auto& [k, v] : comp.value().summarize({rv}))
    if (k == "rewards/inference_aware/latency") logged = (std::fabs(v - 0.5) < 1e-12);
  EXPECT_TRUE(logged);
}

TEST(Rewards, InferenceAwareBadLatencyModel) {
  auto r = reward_make({"inference_aware", 1.0, {{"latency", "clock"}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("latency = \"clock\": must be one of modelled, wall"), std::string::npos) << r.status().message();
  auto r2 = reward_make({"inference_aware", 1.0, {{"latency_step_s", -1}}});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("latency_step_s"), std::string::npos) << r2.status().message();
}

TEST(Rewards, BadSpecsNameTheProblem) {
  auto msg = [](const RewardSpec& s) {
    auto r = reward_make(s);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(msg({"corect"}).find("unknown reward function 'corect'"), std::string::npos);
  EXPECT_NE(msg({"length_linear", 1, {{"targt", 5}}}).find("unknown parameter 'targt'"), std::string::npos);
  EXPECT_NE(msg({"length_linear", 1, {{"target", "long"}}}).find("target = \"long\": expected a number"), std::string::npos);
  EXPECT_NE(msg({"length_overlong", 1, {{"max_len", 10}, {"cache_len", 20}}}).find("cache_len = 20"), std::string::npos);
  EXPECT_NE(msg({"length_linear", 1, {{"unit", "words"}}}).find("unit"), std::string::npos);
  EXPECT_NE(msg({"format_strict", 1, {{"think_in_prompt", 1}}}).find("expected a boolean"), std::string::npos);
  EXPECT_NE(msg({"correct", NAN}).find("weight"), std::string::npos);
}

TEST(Rewards, ComposerWeightsAndLabels) {
  auto c = RewardComposer::make({{"correct", 1.0}, {"format_strict", 0.5}, {"format_soft", 0.25}, {"correct", 2.0}});
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->size(), 4u);
  EXPECT_EQ(c->label(0), "correct");
  EXPECT_EQ(c->label(3), "correct_2");
  Example ex = gold("4");
  RewardValues a = c->compute("p", "<think>x</think><answer>4</answer>", ex, {});
  // 1*1 + 0.5*1 + 0.25*1 + 2*1 = 3.75
  EXPECT_DOUBLE_EQ(a.total, 3.75);
  ASSERT_EQ(a.values.size(), 4u);
  RewardValues b = c->compute("p", "<answer>5</answer>", ex, {});
  // correct 0, strict 0, soft 0.25 (two tags) -> 0.25*0.25 = 0.0625
  EXPECT_DOUBLE_EQ(b.total, 0.0625);
  auto m = c->summarize({a, b});
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].first, "reward/mean");
  EXPECT_DOUBLE_EQ(m[0].second, (3.75 + 0.0625) / 2);
  EXPECT_EQ(m[1].first, "reward/std");
  EXPECT_DOUBLE_EQ(m[1].second, (3.75 - 0.0625) / 2);  // population std of two values = half the gap
  EXPECT_EQ(m[4].first, "rewards/format_soft/mean");
  EXPECT_DOUBLE_EQ(m[4].second, (1.0 + 0.25) / 2);
  EXPECT_FALSE(RewardComposer::make({}).ok());
}

}  // namespace
}  // namespace grpo
