// Enum-like config values: every one is parsed to its type when the config
// loads, a bad value is an error naming the key, the value and the allowed
// list (in TOML and in --set), and every allowed value prints back as the
// user wrote it ([[reward]] choices: tests/env/test_reward_choices.cpp).
// The allowed lists are written out here, not taken from the code's tables,
// so that a changed table fails this test.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "train/run_config.h"

namespace grpo {
namespace {

using Values = std::vector<std::string>;

// Every enum-like key of a run config and its allowed values, in the order of the messages.
const std::map<std::string, Values>& expected_keys() {
  static const std::map<std::string, Values> m = {
      {"model.dtype", {"bf16", "f16", "f32"}},
      {"data.env", {"gsm8k", "arithmetic", "jsonl", "remote"}},
      {"data.eval_split", {"test", "train"}},
      {"data.on_bad_line", {"fail", "skip"}},
      {"data.arithmetic.style", {"compact", "verbose", "expression"}},
      {"engine.cuda_graphs", {"auto", "on", "off"}},
      {"engine.kv_cache_dtype", {"auto", "fp8", "fp8_e4m3"}},
      {"engine.speculative.method", {"off", "draft", "ngram"}},
      {"engine.speculative.acceptance", {"rejection", "match"}},
      {"train.on_policy", {"default", "bitwise"}},
      {"train.lr_schedule", {"constant", "linear", "cosine"}},
      {"train.loss_type", {"grpo", "bnpo", "dr_grpo", "dapo", "cispo"}},
      {"train.importance_sampling_level", {"token", "sequence"}},
      {"train.scale_rewards", {"group", "batch", "none"}},
      {"train.importance_sampling", {"none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}},
      {"eval.early_stopping_metric", {"eval/accuracy", "eval/reward"}},
      {"tandem.strategy", {"token", "chunk", "word"}},
      {"log.progress", {"auto", "bar", "plain", "off"}},
      {"log.level", {"debug", "info", "warn", "error", "quiet"}},
      {"curriculum.type", {"none", "kde_valley"}},
      {"remote.stale", {"drop", "down_weight"}},
      {"rollout.server_on_failure", {"error", "local"}},
  };
  return m;
}

std::string join(const Values& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "a.b.c" -> "[a.b]\nc = <value>\n"
std::string toml_of(const std::string& key, const std::string& value) {
  const size_t dot = key.rfind('.');
  return "[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = " + value + "\n";
}

// The value at a dotted key of run_config_to_json.
nlohmann::ordered_json json_at(const RunConfig& c, const std::string& key) {
  nlohmann::ordered_json j = run_config_to_json(c);
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) j = j.at(key.substr(start, dot - start));
  return j.at(key.substr(start));
}

// Overrides under which a value validates: the base runs every value on the CPU in f32
// with a jsonl train file named (parse checks no files); a few values need more.
std::vector<std::string> companions(const std::string& key, const std::string& value) {
  std::vector<std::string> o = {"model.device=cpu", "model.dtype=f32", "data.train_path=train.jsonl"};
  if (key == "model.dtype" && value == "bf16") o[0] = "model.device=cuda";
  if (key == "engine.cuda_graphs") o[0] = "model.device=cuda";
  if (key == "engine.speculative.method" && value == "draft") o.push_back("engine.speculative.draft_model=draft");
  if (key == "train.loss_type" && value == "cispo") o.push_back("train.epsilon_high=5");
  if (key == "rollout.server_on_failure" && value == "local") o.push_back("rollout.server_url=http://127.0.0.1:8001");
  if (key == "eval.early_stopping_metric") {
    o.push_back("eval.every=1");
    o.push_back("data.eval_path=test.jsonl");
  }
  return o;
}

TEST(ConfigEnums, EveryEnumKeyHasItsListedValues) {
  std::vector<std::string> found;
  for (const auto& k : run_config_keys())
    if (!run_config_key_values(k).empty()) found.push_back(k);
  std::vector<std::string> want;
  for (const auto& [k, v] : expected_keys()) want.push_back(k);
  want.push_back("model.device");
  std::sort(found.begin(), found.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(found, want);
  for (const auto& [k, v] : expected_keys()) EXPECT_EQ(run_config_key_values(k), join(v)) << k;
  EXPECT_EQ(run_config_key_values("model.device"), "cpu, cuda, cuda:N");
}

TEST(ConfigEnums, BadValueNamesKeyValueAndAllowedList) {
  auto keys = expected_keys();
  keys["model.device"] = {"cpu", "cuda", "cuda:N"};
  for (const auto& [k, v] : keys) {
    const std::string want = k + " = \"bogus\": must be one of " + join(v);
    auto a = run_config_parse(toml_of(k, "\"bogus\""), "cfg.toml");
    ASSERT_FALSE(a.ok()) << k;
    EXPECT_NE(a.status().message().find(want), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find("cfg.toml:2:"), std::string::npos) << a.status().message();
    for (const std::string& set : {k + "=bogus", k + "=\"bogus\""}) {
      auto b = run_config_parse("", "cfg.toml", {set});
      ASSERT_FALSE(b.ok()) << set;
      EXPECT_NE(b.status().message().find(want), std::string::npos) << b.status().message();
    }
    // Not a string at all: the type error still lists the names.
    auto c = run_config_parse(toml_of(k, "3"), "cfg.toml");
    ASSERT_FALSE(c.ok()) << k;
    EXPECT_NE(c.status().message().find("expected a string (one of " + join(v) + ")"), std::string::npos)
        << c.status().message();
  }
}

TEST(ConfigEnums, ValuesAreCaseSensitiveAndUntrimmedInsideQuotes) {
  for (const char* bad : {"\"F32\"", "\"f32 \"", "\"\""}) {
    auto r = run_config_parse(toml_of("model.dtype", bad), "cfg.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("must be one of bf16, f16, f32"), std::string::npos) << r.status().message();
  }
}

TEST(ConfigEnums, EveryValueRoundTripsWithTheUsersSpelling) {
  auto keys = expected_keys();
  keys["model.device"] = {"cpu", "cuda", "cuda:0", "cuda:12"};
  for (const auto& [k, values] : keys) {
    for (const auto& v : values) {
      // The aliases print as their value's first name: fp8_e4m3 is fp8.
      const std::string printed = (k == "engine.kv_cache_dtype" && v == "fp8_e4m3") ? "fp8" : v;
      for (const std::string& set : {k + "=" + v, k + "=\"" + v + "\""}) {
        RunConfig c;
        ASSERT_TRUE(run_config_set(&c, set).ok()) << set;
        EXPECT_EQ(json_at(c, k), printed) << set;
      }
      std::vector<std::string> sets = companions(k, v);
      sets.push_back(k + "=" + v);
      auto first = run_config_parse("", "cfg.toml", sets);
      if (k == "model.dtype" && v == "f16") {  // neither backend runs f16: a config error naming the key
        ASSERT_FALSE(first.ok());
        EXPECT_NE(first.status().message().find("model.dtype = \"f16\""), std::string::npos) << first.status().message();
        continue;
      }
      ASSERT_TRUE(first.ok()) << k << "=" << v << ": " << first.status().message();
      const std::string toml = run_config_to_toml(first.value());
      auto back = run_config_parse(toml, "config.toml");
      ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << toml;
      EXPECT_EQ(json_at(back.value(), k), printed) << k;
      EXPECT_EQ(run_config_to_json(back.value()), run_config_to_json(first.value())) << k << "=" << v;
      EXPECT_EQ(run_config_to_toml(back.value()), toml) << k << "=" << v;
    }
  }
}

TEST(ConfigEnums, ValuesReachTheCodeAsTheirTypes) {
  auto c = run_config_parse("", "cfg.toml",
                            {"model.device=cuda:3", "model.dtype=f32", "data.env=remote", "data.eval_split=train",
                             "train.loss_type=bnpo", "train.importance_sampling=sequence_mask",
                             "train.importance_sampling_level=sequence", "remote.stale=down_weight",
                             "eval.early_stopping_metric=eval/reward"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const RunConfig& r = c.value();
  EXPECT_EQ(r.model.device.kind, Device::cuda);
  EXPECT_EQ(r.model.device.index, 3);
  EXPECT_EQ(r.model.dtype, DType::f32);
  EXPECT_EQ(r.data.env, EnvKind::remote);
  EXPECT_EQ(r.data.eval_split, Split::train);
  EXPECT_EQ(r.train.loss_type, LossType::bnpo);
  EXPECT_EQ(r.train.importance_sampling, IsMode::sequence_mask);
  EXPECT_EQ(r.train.importance_sampling_level, IsLevel::sequence);
  EXPECT_EQ(r.remote.stale, StalePolicy::down_weight);
  EXPECT_EQ(r.eval.early_stopping_metric, EarlyStoppingMetric::reward);
  RunConfig d;  // defaults
  EXPECT_EQ(d.model.device.kind, Device::cuda);
  EXPECT_EQ(d.model.device.index, -1);
  EXPECT_EQ(json_at(d, "model.device"), "cuda");
}

TEST(ConfigEnums, DeviceNamesOutsideTheFamilyAreRefused) {
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:01", "cuda:-1", "cuda:+1", "cuda:99999", "CPU", "cuda:1 "}) {
    auto r = run_config_parse("", "cfg.toml", {std::string("model.device=\"") + bad + "\""});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("model.device = \"" + std::string(bad) + "\": must be one of cpu, cuda, cuda:N"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(ConfigEnums, LoraTargetModulesAreCheckedWithLoraOff) {
  auto r = run_config_parse("[lora]\ntarget_modules = [\"q_proj\", \"qkv\"]\n", "cfg.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lora.target_modules"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'qkv'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("q (q_proj)"), std::string::npos) << r.status().message();
  auto ok = run_config_parse("[lora]\ntarget_modules = [\"q\", \"down_proj\"]\n", "cfg.toml",
                             {"model.device=cpu", "model.dtype=f32"});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(json_at(ok.value(), "lora.target_modules"), nlohmann::ordered_json({"q", "down_proj"}));
}

}  // namespace
}  // namespace grpo
