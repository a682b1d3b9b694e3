// Parity with Hugging Face transformers: tiny random models of each
// architecture saved by tools/ref/make_model_fixtures.py, loaded with
// model_load and run through transformer_forward over a paged cache:
//  - logits at every position of fixed prompts (full prompt, and chunked
//    prefill + one-token decode steps), max|a−b| / max|ref| < 1e-4;
//  - greedy 32-token continuations identical to transformers' generate();
//  - the rotary table against the model's own inv_freq buffer.
// Missing fixtures are a failure, not a skip, except for the sliding-window models
// (kSlidingNames, windows shorter than their 40..57-token prompts), added later:
// those skip with the command that writes them.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../kernels/compare.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "tf_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
const char* kNames[] = {"llama3", "llama2", "llama_linear", "qwen2", "qwen3", "mistral"};
const char* kSlidingNames[] = {"mistral_swa", "qwen2_swa", "qwen3_swa"};
const char* kScript = "python3 tools/ref/make_model_fixtures.py --out tests/fixtures/models";

bool is_sliding(const std::string& name) {
  for (const char* n : kSlidingNames)
    if (name == n) return true;
  return false;
}

std::string fixture_dir(const std::string& name) { return std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/models/" + name; }

// Loads reference.json, or fails the test with what to run.
bool load_reference(const std::string& name, nlohmann::json* out) {
  const std::string path = fixture_dir(name) + "/reference.json";
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << "missing fixture " << path << ": run `" << kScript
                  << "` from the repository root on a machine with torch + transformers, and commit the output";
    return false;
  }
  *out = nlohmann::json::parse(f);
  if (out->value("format", "") != "grpo-model-fixture" || out->value("version", 0) != 1) {
    ADD_FAILURE() << path << ": unknown fixture format/version; regenerate with tools/ref/make_model_fixtures.py";
    return false;
  }
  return true;
}

bool load_model(const std::string& name, ModelWeights* w) {
  Result<ModelWeights> r = model_load(fixture_dir(name), Device::cpu, DType::f32);
  if (!r.ok()) {
    ADD_FAILURE() << "model_load(" << fixture_dir(name) << "): " << r.status().message();
    return false;
  }
  *w = std::move(r).value();
  return true;
}

std::vector<int32_t> ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }
}  // namespace

class FixtureParity : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string name = GetParam();
    if (is_sliding(name) && !std::ifstream(fixture_dir(name) + "/reference.json"))
      GTEST_SKIP() << "sliding-window fixture " << fixture_dir(name) << " not generated yet: run `" << kScript
                   << " --only mistral_swa,qwen2_swa,qwen3_swa` on a machine with torch + transformers";
  }
};

TEST_P(FixtureParity, LogitsFullAndChunked) {
  nlohmann::json ref;
  ModelWeights w;
  if (!load_reference(GetParam(), &ref) || !load_model(GetParam(), &w)) return;
  ASSERT_FALSE(ref["logits"].empty());
  for (const auto& case_ : ref["logits"]) {
    const std::vector<int32_t> toks = ints(case_["tokens"]);
    const std::vector<float> want = case_["values"].get<std::vector<float>>();
    const int64_t T = int64_t(toks.size());
    SCOPED_TRACE("prompt of " + std::to_string(T) + " tokens");
    ASSERT_EQ(int64_t(want.size()), T * w.config.vocab_size);
    PagedRunner full(tf_ctx(), w, 1, 64);
    const std::vector<float> got = full.feed(0, toks);
    const double err = max_rel_error(got, want);
    std::printf("  %-13s T=%-3lld full    max|a-b|/max|ref| = %.2e\n", GetParam(), (long long)T, err);
    EXPECT_LT(err, 1e-4);
    // chunked prefill (about half the prompt, then a quarter) + one-token decode steps
    PagedRunner chunked(tf_ctx(), w, 1, 64);
    std::vector<float> parts;
    const int64_t a = T / 2, b = a + T / 4;
    std::vector<std::pair<int64_t, int64_t>> pieces = {{0, a}, {a, b}};
    for (int64_t t = b; t < T; ++t) pieces.push_back({t, t + 1});
    for (auto [s, e] : pieces) {
      std::vector<float> lg = chunked.feed(0, std::vector<int32_t>(toks.begin() + s, toks.begin() + e));
      parts.insert(parts.end(), lg.begin(), lg.end());
    }
    const double err2 = max_rel_error(parts, want);
    std::printf("  %-13s T=%-3lld chunked max|a-b|/max|ref| = %.2e\n", GetParam(), (long long)T, err2);
    EXPECT_LT(err2, 1e-4);
  }
}

TEST_P(FixtureParity, GreedyGenerationMatchesTransformers) {
  nlohmann::json ref;
  ModelWeights w;
  if (!load_reference(GetParam(), &ref) || !load_model(GetParam(), &w)) return;
  ASSERT_FALSE(ref["generate"].empty());
  for (const auto& g : ref["generate"]) {
    const std::vector<int32_t> prompt = ints(g["prompt"]), want = ints(g["new_tokens"]);
    const std::vector<int32_t> got = greedy(tf_ctx(), w, prompt, int(want.size()));
    size_t first = 0;
    while (first < want.size() && got[first] == want[first]) ++first;
    EXPECT_EQ(first, want.size()) << GetParam() << ": prompt of " << prompt.size() << " tokens: first differing "
                                  << "new token " << first << " (got " << (first < got.size() ? got[first] : -1)
                                  << ", transformers " << (first < want.size() ? want[first] : -1)
                                  << "); smallest top-1/top-2 logit gap in the reference: "
                                  << g.value("min_margin", 0.0);
  }
}

TEST_P(FixtureParity, RopeTableMatchesInvFreq) {
  nlohmann::json ref;
  ModelWeights w;
  if (!load_reference(GetParam(), &ref) || !load_model(GetParam(), &w)) return;
  const std::vector<double> inv = ref["rope_inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(int(inv.size()), w.config.head_dim / 2) << "fixture has no rotary inv_freq";
  const int P = 64;
  RopeTable t = rope_table_build(w.config, Device::cpu, P);
  std::vector<double> rc, rs;
  for (int p = 0; p < P; ++p)
    for (double f : inv) {
      const double a = double(float(p) * float(f));  // transformers: f32 product of position and inv_freq
      rc.push_back(std::cos(a));
      rs.push_back(std::sin(a));
    }
  EXPECT_TRUE(all_close("cos", tensor_to_f32(t.cos), rc, 1e-6, 0));
  EXPECT_TRUE(all_close("sin", tensor_to_f32(t.sin), rs, 1e-6, 0));
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureParity, ::testing::ValuesIn(kNames),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });
INSTANTIATE_TEST_SUITE_P(SlidingWindow, FixtureParity, ::testing::ValuesIn(kSlidingNames),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// The sliding-window fixtures really exercise the window: their config.json gives
// windows shorter than the prompts on the layers transformers windows.
TEST(FixtureParitySlidingWindow, ConfigsWindowTheExpectedLayers) {
  struct Want { const char* name; int window; std::vector<int> layers; };
  const Want wants[] = {{"mistral_swa", 24, {24, 24}}, {"qwen2_swa", 24, {0, 24}}, {"qwen3_swa", 16, {16, 0}}};
  int found = 0;
  for (const Want& w : wants) {
    if (!std::ifstream(fixture_dir(w.name) + "/config.json")) continue;
    ++found;
    Result<ModelConfig> c = model_config_load(fixture_dir(w.name) + "/config.json");
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c.value().sliding_window, w.window) << w.name;
    EXPECT_EQ(c.value().layer_window, w.layers) << w.name;
  }
  if (found == 0) GTEST_SKIP() << "no sliding-window fixtures yet: run `" << kScript << " --only mistral_swa,qwen2_swa,qwen3_swa`";
}
