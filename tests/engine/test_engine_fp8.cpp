// Engine with an FP8 E4M3 KV cache (EngineOptions::kv_cache_dtype = "fp8") on the
// CPU: option validation, the block budget and telemetry counting one byte per
// element, equality with a full-recompute greedy loop over an fp8 cache (chunked
// prefill, small blocks, prefix-cache hits), and agreement with the f32-cache
// engine on the trained demo model (models/arith-tiny), reported as a rate.
// Models: arith-tiny (Llama, head_dim 32, trained: its greedy answers are
// meaningful), the qwen3 GRPO fixture (random weights, head_dim 16, q/k-norm: the
// qk_norm_rope_cache_write path) and stories260K (head_dim 8: fp8 is refused).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "env/arithmetic.h"

using namespace grpo;
using namespace grpo::test;

namespace {

struct Loaded {
  ModelWeights w;
  std::unique_ptr<Tokenizer> tok;  // null where the model has no tokenizer
};

// Loads an HF model directory once per process (f32 on the CPU); aborts with the
// loader's message when the files are missing.
Loaded& load_once(const std::string& dir, bool with_tokenizer) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[dir];
  if (!slot) {
    slot = std::make_unique<Loaded>();
    auto w = model_load(dir, Device::cpu, DType::f32);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    slot->w = std::move(w).value();
    if (with_tokenizer) {
      auto t = Tokenizer::load(dir);
      GRPO_CHECK_MSG(t.ok(), t.status().message().c_str());
      slot->tok = std::make_unique<Tokenizer>(std::move(t).value());
    }
  }
  return *slot;
}
Loaded& arith_tiny() { return load_once(std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny", true); }
Loaded& qwen3_fixture() { return load_once(std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/grpo/qwen3", false); }

// Held-out problems of the demo's environment, in its prompt format "{question}\n".
std::vector<std::vector<int32_t>> arith_prompts(const Tokenizer& tok, size_t n) {
  ArithmeticConfig ac;
  ac.seed = 1;
  ac.difficulty = 0;
  ac.style = ArithmeticStyle::compact;
  ac.test_size = n;
  ArithmeticEnv env(ac);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int> ids = tok.encode(env.example(Split::test, i).question + "\n", true);
    out.emplace_back(ids.begin(), ids.end());
  }
  return out;
}

SamplingParams greedy(int max_tokens, bool ignore_eos) {
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

KvCacheDtype kv_dtype_of(const std::string& name) {
  auto v = enum_parse(kv_cache_dtype_names(), name);
  GRPO_CHECK_MSG(v.has_value(), name.c_str());
  return *v;
}

EngineOptions fp8_opts(const std::string& kv) {
  EngineOptions o;
  o.block_size = 4;
  o.n_kv_blocks = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;  // forces chunked prefill for the longer prompts
  o.kv_cache_dtype = kv_dtype_of(kv);
  return o;
}

ContextOptions deterministic() {
  ContextOptions o;
  o.deterministic = true;
  return o;
}

}  // namespace

TEST(EngineFp8, OptionValuesAreValidated) {
  const ModelWeights& at = arith_tiny().w;
  // One name table: vLLM's names and nothing else, listed in that order for error messages.
  for (const char* bad : {"fp16", "FP8", "e4m3", "bf16", ""})
    EXPECT_FALSE(enum_parse(kv_cache_dtype_names(), bad).has_value()) << bad;
  EXPECT_EQ(enum_allowed(kv_cache_dtype_names()), "auto, fp8, fp8_e4m3");
  EXPECT_STREQ(enum_name(kv_cache_dtype_names(), KvCacheDtype::fp8_e4m3), "fp8");
  EngineOptions o;
  EXPECT_EQ(o.kv_cache_dtype, KvCacheDtype::automatic);
  EXPECT_EQ(engine_kv_cache_dtype(at.config, DType::f32, o).value(), DType::f32);
  EXPECT_EQ(engine_kv_cache_dtype(at.config, DType::bf16, o).value(), DType::bf16);
  for (const char* fp8 : {"fp8", "fp8_e4m3"}) {
    o.kv_cache_dtype = kv_dtype_of(fp8);
    auto d = engine_kv_cache_dtype(at.config, DType::f32, o);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d.value(), DType::f8e4m3);
  }
  // stories260K has head_dim 8: fp8 needs a multiple of 16, and the error says what to do.
  o.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  const ModelConfig& st_cfg = stories().w.config;
  ASSERT_EQ(st_cfg.head_dim % 16, 8);
  auto e = engine_kv_blocks(st_cfg, DType::f32, o);
  ASSERT_FALSE(e.ok());
  for (const char* word : {"kv_cache_dtype", "head_dim % 16", "head_dim is 8", "auto"})
    EXPECT_NE(e.status().message().find(word), std::string::npos) << e.status().message();
}

TEST(EngineFp8, BlockBudgetAndTelemetryCountOneBytePerElement) {
  Context ctx;
  Loaded& m = arith_tiny();
  const ModelConfig& cfg = m.w.config;
  EngineOptions o;
  o.kv_cache_bytes = size_t(1) << 20;  // sized from the budget, not n_kv_blocks
  Engine e32(ctx, m.w, m.tok.get(), o);
  o.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  Engine e8(ctx, m.w, m.tok.get(), o);
  EXPECT_EQ(e32.kv_cache_dtype(), DType::f32);
  EXPECT_EQ(e8.kv_cache_dtype(), DType::f8e4m3);
  const size_t elems = size_t(2) * cfg.n_layers * o.block_size * cfg.n_kv_heads * cfg.head_dim;
  EXPECT_EQ(e32.kv_bytes_per_block(), 4 * elems);
  EXPECT_EQ(e8.kv_bytes_per_block(), elems);
  EXPECT_EQ(e8.kv_bytes_per_block() * 4, e32.kv_bytes_per_block());
  EXPECT_EQ(size_t(e8.n_kv_blocks()), o.kv_cache_bytes / elems);
  EXPECT_EQ(e8.n_kv_blocks(), 4 * e32.n_kv_blocks());
  std::printf("[fp8] arith-tiny: %zu KV bytes per block (f32 %zu); %d blocks in 1 MiB (f32 %d)\n",
              e8.kv_bytes_per_block(), e32.kv_bytes_per_block(), e8.n_kv_blocks(), e32.n_kv_blocks());
  auto out = e8.generate({{'1', '+', '2', '?', '\n'}}, greedy(40, true));
  ASSERT_TRUE(out.ok()) << out.status().message();
  const RequestOutput& r = out.value()[0];
  EXPECT_EQ(r.completion_ids.size(), 40u);
  EXPECT_EQ(r.telemetry.peak_kv_bytes, size_t(3) * elems);  // 45 tokens in blocks of 16
}

TEST(EngineFp8, GreedyEqualsFullRecomputeOverAnFp8Cache) {
  Context ctx(deterministic());
  struct Case {
    const char* name;
    Loaded* m;
    std::vector<std::vector<int32_t>> prompts;
  };
  std::vector<Case> cases;
  cases.push_back({"arith-tiny", &arith_tiny(), arith_prompts(*arith_tiny().tok, 6)});
  std::vector<std::vector<int32_t>> rnd;
  for (int k = 0; k < 4; ++k) {
    std::vector<int32_t> p;
    for (int i = 0; i < 5 + 11 * k; ++i) p.push_back(int32_t((i * 37 + k * 101 + 3) % 320));
    rnd.push_back(p);
  }
  cases.push_back({"qwen3 fixture (q/k-norm)", &qwen3_fixture(), rnd});
  for (Case& c : cases) {
    // Each prompt twice: the second copy hits the first's blocks in the prefix cache.
    std::vector<std::vector<int32_t>> prompts = c.prompts;
    prompts.insert(prompts.end(), c.prompts.begin(), c.prompts.end());
    Engine eng(ctx, c.m->w, nullptr, fp8_opts("fp8"));
    auto out = eng.generate(prompts, greedy(20, true));
    ASSERT_TRUE(out.ok()) << c.name << ": " << out.status().message();
    EXPECT_GT(eng.stats().prefix_hit_tokens, 0) << c.name;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<double> lp;
      auto ref = reference_greedy(ctx, c.m->w, prompts[i], 20, &lp, DType::f8e4m3);
      const RequestOutput& r = out.value()[i];
      EXPECT_EQ(r.completion_ids, ref) << c.name << ", prompt " << i;
      ASSERT_EQ(r.logprobs_raw.size(), lp.size());
      for (size_t j = 0; j < lp.size(); ++j)
        EXPECT_NEAR(r.logprobs_raw[j], lp[j], 1e-4) << c.name << ", prompt " << i << " token " << j;
    }
  }
}

TEST(EngineFp8, GreedyAgreesWithTheF32CacheOnArithTiny) {
  Context ctx;
  Loaded& m = arith_tiny();
  const auto prompts = arith_prompts(*m.tok, 64);
  auto run = [&](const std::string& kv) {
    EngineOptions o;
    o.n_kv_blocks = 2048;
    o.kv_cache_dtype = kv_dtype_of(kv);
    Engine eng(ctx, m.w, m.tok.get(), o);
    auto out = eng.generate(prompts, greedy(24, false));
    GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
    return std::move(out).value();
  };
  const std::vector<RequestOutput> a = run("auto"), b = run("fp8");
  ASSERT_EQ(a.size(), b.size());
  // Per completion: tokens before the first divergence, as a share of the f32 completion.
  size_t identical = 0, same_text = 0, prefix_tokens = 0, ref_tokens = 0, n_lp = 0;
  double lp_abs_sum = 0, lp_abs_max = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto &x = a[i].completion_ids, &y = b[i].completion_ids;
    size_t d = 0;
    while (d < x.size() && d < y.size() && x[d] == y[d]) ++d;
    identical += x == y;
    same_text += a[i].text == b[i].text;
    prefix_tokens += d;
    ref_tokens += x.size();
    for (size_t j = 0; j < d; ++j) {
      const double diff = std::fabs(double(a[i].logprobs_raw[j]) - double(b[i].logprobs_raw[j]));
      lp_abs_sum += diff;
      lp_abs_max = std::max(lp_abs_max, diff);
      ++n_lp;
    }
  }
  const double prefix_rate = double(prefix_tokens) / double(std::max<size_t>(ref_tokens, 1));
  const double lp_mean = n_lp ? lp_abs_sum / double(n_lp) : 0.0;
  std::printf("[fp8] arith-tiny greedy, %zu prompts: %zu/%zu completions identical to the f32-cache engine, "
              "%zu/%zu tokens before the first divergence (%.1f%%), %zu/%zu same text; |logprob fp8 - f32| on the "
              "shared prefix: mean %.3g, max %.3g\n",
              a.size(), identical, a.size(), prefix_tokens, ref_tokens, 100.0 * prefix_rate, same_text, a.size(),
              lp_mean, lp_abs_max);
  // Loose floors: FP8 K/V change the logits by a few percent of a nat at most on this
  // model, so most greedy choices survive; exact rates depend on the model and data.
  EXPECT_GE(prefix_rate, 0.5);
  EXPECT_GE(identical * 2, a.size());
  EXPECT_LT(lp_mean, 0.1);
}
