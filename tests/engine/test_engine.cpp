// Engine end to end on the CPU with the real stories260K model: llama2.c's
// golden greedy output, equality with a full-recompute greedy loop (chunked
// prefill, small blocks), batch-composition independence, preemption,
// prefix-cache hits for n > 1 and after a reset, seeds, finish reasons
// (EOS, min_tokens, stop ids, stop strings across tokens), request errors.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "engine_test_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

EngineOptions small_opts() {
  EngineOptions o;
  o.block_size = 4;
  o.n_kv_blocks = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;  // forces chunked prefill for longer prompts
  return o;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Prompts cut from llama2.c's golden token ids (real text of the model's domain),
// so that only the text tests need the tokenizer.
std::vector<int32_t> golden_ids() {
  static const auto g = read_ids(stories_dir() + "/golden_greedy_t0_200steps.ids.txt");
  return g;
}
std::vector<int32_t> prompt(int k) {
  const auto g = golden_ids();
  std::vector<int32_t> p = {1};
  switch (k) {
    case 0: p.insert(p.end(), g.begin() + 1, g.begin() + 5); break;    // 5 tokens
    case 1: p.insert(p.end(), g.begin() + 30, g.begin() + 50); break;  // 21 tokens
    case 2: p.push_back(g[60]); break;                                 // 2 tokens
    default: p.insert(p.end(), g.begin() + 100, g.begin() + 132); break;  // 33 tokens
  }
  return p;
}
const int kPrompts = 4;

// Batch-invariant kernels (the CPU GEMM computes every row on its own): the
// results of a row are bit-identical whatever else shares the step.
ContextOptions deterministic() {
  ContextOptions o;
  o.deterministic = true;
  return o;
}

#define REQUIRE_TOKENIZER() \
  if (!stories().tok) GTEST_SKIP() << "tokenizer did not load: " << stories().tok_error

}  // namespace

TEST(Engine, GoldenGreedyFromBosMatchesLlama2c) {
  Context ctx;
  Stories& m = stories();
  auto golden = read_ids(stories_dir() + "/golden_greedy_t0_200steps.ids.txt");
  ASSERT_EQ(golden.size(), 201u);
  EngineOptions o;
  o.block_size = 16;
  o.n_kv_blocks = 64;
  Engine eng(ctx, m.w, m.tok.get(), o);
  auto out = eng.generate({{1}}, greedy(200));
  ASSERT_TRUE(out.ok()) << out.status().message();
  const RequestOutput& r = out.value()[0];
  EXPECT_EQ(r.completion_ids, std::vector<int32_t>(golden.begin() + 1, golden.end()));
  if (m.tok) {
    FILE* f = std::fopen((stories_dir() + "/golden_greedy_t0_200steps.txt").c_str(), "rb");
    ASSERT_TRUE(f);
    std::string text(464, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    EXPECT_EQ(r.text, text);
  }
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.telemetry.generated_tokens, 200);
  EXPECT_LE(r.telemetry.ttft_s, r.telemetry.e2e_s);
  EXPECT_EQ(r.telemetry.peak_kv_bytes, size_t(13) * eng.kv_bytes_per_block());  // 201 tokens in blocks of 16
}

TEST(Engine, GreedyEqualsFullRecomputeWithChunkedPrefill) {
  Context ctx;
  Stories& m = stories();
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < kPrompts; ++k) prompts.push_back(prompt(k));
  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  auto out = eng.generate(prompts, greedy(24));
  ASSERT_TRUE(out.ok()) << out.status().message();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<double> lp;
    auto ref = reference_greedy(ctx, m.w, prompts[i], 24, &lp);
    const RequestOutput& r = out.value()[i];
    EXPECT_EQ(r.completion_ids, ref) << "prompt " << i;
    ASSERT_EQ(r.logprobs_raw.size(), lp.size());
    for (size_t j = 0; j < lp.size(); ++j) EXPECT_NEAR(r.logprobs_raw[j], lp[j], 1e-4) << "prompt " << i << " token " << j;
    EXPECT_EQ(r.logprobs, r.logprobs_raw);  // raw is the default mode
  }
}

TEST(Engine, OutputsDoNotDependOnBatchComposition) {
  Stories& m = stories();
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.max_tokens = 30;
  p.ignore_eos = true;
  const auto target = prompt(1);
  Context ctx1(deterministic());
  Engine alone(ctx1, m.w, m.tok.get(), small_opts());
  auto a = alone.generate({target}, p);
  ASSERT_TRUE(a.ok());
  Context ctx2(deterministic());
  Engine crowd(ctx2, m.w, m.tok.get(), small_opts());
  SamplingParams other = p;
  other.seed = 99;
  other.n = 3;
  for (int i : {0, 2, 3}) ASSERT_TRUE(crowd.add_request(prompt(i), other).ok());
  auto b = crowd.generate({prompt(3), target}, p);  // mid-batch, after other work started
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a.value()[0].completion_ids, b.value()[1].completion_ids);
  EXPECT_EQ(a.value()[0].logprobs_raw, b.value()[1].logprobs_raw);
  EXPECT_EQ(a.value()[0].logprobs_processed, b.value()[1].logprobs_processed);
}

TEST(Engine, PreemptionGivesTheSameOutputs) {
  Stories& m = stories();
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 5;
  p.max_tokens = 40;
  p.ignore_eos = true;
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < kPrompts; ++k) prompts.push_back(prompt(k));
  Context c1(deterministic()), c2(deterministic());
  Engine roomy(c1, m.w, m.tok.get(), small_opts());
  EngineOptions tight_o = small_opts();
  tight_o.n_kv_blocks = 24;  // 4 sequences of up to ~58 tokens need ~60 blocks of 4
  Engine tight(c2, m.w, m.tok.get(), tight_o);
  auto a = roomy.generate(prompts, p);
  auto b = tight.generate(prompts, p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(roomy.stats().preemptions, 0);
  EXPECT_GT(tight.stats().preemptions, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a.value()[i].completion_ids, b.value()[i].completion_ids) << "prompt " << i;
    EXPECT_EQ(a.value()[i].logprobs_raw, b.value()[i].logprobs_raw) << "prompt " << i;
  }
  EXPECT_EQ(tight.n_free_kv_blocks(), 24);
}

TEST(Engine, SamplesOfAPromptShareItsPrefillThroughThePrefixCache) {
  Context ctx;
  Stories& m = stories();
  const std::vector<int32_t> pr = prompt(1);  // 21 tokens: 5 full blocks of 4 + 1
  SamplingParams p;
  p.n = 4;
  p.seed = 3;
  p.max_tokens = 8;
  p.ignore_eos = true;
  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  auto out = eng.generate({pr}, p);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.value()[0].telemetry.prefix_hit_tokens, 0);
  for (int j = 1; j < 4; ++j) EXPECT_EQ(out.value()[size_t(j)].telemetry.prefix_hit_tokens, 20) << j;
  bool differ = false;
  for (int j = 1; j < 4; ++j) differ |= out.value()[size_t(j)].completion_ids != out.value()[0].completion_ids;
  EXPECT_TRUE(differ);  // samples j use RNG keys (seed, j)
  // The same prompt again hits for every sample; after a reset, for none but the siblings.
  auto again = eng.generate({pr}, p);
  EXPECT_EQ(again.value()[0].telemetry.prefix_hit_tokens, 20);
  EXPECT_EQ(again.value()[0].completion_ids, out.value()[0].completion_ids);
  eng.reset_prefix_cache();
  auto reset = eng.generate({pr}, p);
  EXPECT_EQ(reset.value()[0].telemetry.prefix_hit_tokens, 0);
  EXPECT_EQ(reset.value()[0].completion_ids, out.value()[0].completion_ids);
}

TEST(Engine, SameSeedSameOutputsAcrossEngines) {
  Stories& m = stories();
  SamplingParams p;
  p.temperature = 1.2f;
  p.top_k = 40;
  p.min_p = 0.02f;
  p.max_tokens = 20;
  p.ignore_eos = true;
  EngineOptions o = small_opts();
  o.seed = 77;  // requests without a seed take keys from (engine seed, request id)
  Context c1, c2;
  Engine e1(c1, m.w, m.tok.get(), o), e2(c2, m.w, m.tok.get(), o);
  auto a = e1.generate({prompt(0), prompt(2)}, p);
  auto b = e2.generate({prompt(0), prompt(2)}, p);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a.value()[i].completion_ids, b.value()[i].completion_ids);
}

TEST(Engine, EosMinTokensAndStopIds) {
  Context ctx;
  Stories& m = stories();
  const auto pr = prompt(0);
  auto g = reference_greedy(ctx, m.w, pr, 30);
  size_t k = 2;  // first position whose token did not occur before
  while (std::find(g.begin(), g.begin() + long(k), g[k]) != g.begin() + long(k)) ++k;
  EngineOptions o = small_opts();
  o.eos_token_ids = {g[k]};
  Engine eng(ctx, m.w, m.tok.get(), o);
  SamplingParams p = greedy(30);
  p.ignore_eos = false;
  auto r = eng.generate({pr}, p).value()[0];
  EXPECT_EQ(r.finish_reason, FinishReason::eos);
  EXPECT_EQ(r.completion_ids, std::vector<int32_t>(g.begin(), g.begin() + long(k) + 1));  // EOS included
  p.min_tokens = int(k) + 3;
  r = eng.generate({pr}, p).value()[0];
  for (int j = 0; j < p.min_tokens; ++j) EXPECT_NE(r.completion_ids[size_t(j)], g[k]) << j;
  EXPECT_GE(r.completion_ids.size(), size_t(p.min_tokens));
  p.min_tokens = 0;
  p.ignore_eos = true;
  p.stop_token_ids = {g[k]};
  r = eng.generate({pr}, p).value()[0];
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(r.completion_ids.size(), k + 1);
}

TEST(Engine, StopStringSpanningTokensCutsTheText) {
  Context ctx;
  Stories& m = stories();
  REQUIRE_TOKENIZER();
  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  SamplingParams p = greedy(60);
  p.stop = {"le gi", "never appears"};  // "litt|le| gi|rl" in the golden text
  auto r = eng.generate({{1}}, p).value()[0];
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(r.text, "Once upon a time, there was a litt");
  std::vector<int> ids(r.completion_ids.begin(), r.completion_ids.end());
  EXPECT_NE(m.tok->decode(ids, true).find("le gi"), std::string::npos);
  ids.pop_back();  // the last token completed the match
  EXPECT_EQ(m.tok->decode(ids, true).find("le gi"), std::string::npos);
  // Before min_tokens a match is ignored for good (the golden text has one "le gi").
  p.min_tokens = 20;
  r = eng.generate({{1}}, p).value()[0];
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.completion_ids.size(), 60u);
  EXPECT_NE(r.text.find("little girl"), std::string::npos);
}

TEST(Engine, LogprobModesAndTopLogprobs) {
  Context ctx;
  Stories& m = stories();
  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  SamplingParams p;
  p.seed = 11;
  p.max_tokens = 10;
  p.top_k = 5;
  p.top_logprobs = 3;
  p.logprobs_mode = LogprobsMode::processed;
  auto r = eng.generate({prompt(0)}, p).value()[0];
  ASSERT_EQ(r.top_logprobs.size(), r.completion_ids.size());
  for (size_t j = 0; j < r.completion_ids.size(); ++j) {
    EXPECT_EQ(r.logprobs[j], r.logprobs_processed[j]);
    EXPECT_GE(r.logprobs_processed[j], r.logprobs_raw[j]);  // renormalised over 5 ids
    ASSERT_EQ(r.top_logprobs[j].size(), 3u);
    EXPECT_GE(r.top_logprobs[j][0].second, r.top_logprobs[j][1].second);
  }
}

TEST(Engine, RequestErrorsNameTheProblem) {
  Context ctx;
  Stories& m = stories();
  EngineOptions o = small_opts();
  o.max_model_len = 32;
  Engine eng(ctx, m.w, nullptr, o);
  std::vector<int32_t> long_prompt(40, 5);
  auto e1 = eng.add_request(long_prompt, greedy(4));
  ASSERT_FALSE(e1.ok());
  EXPECT_NE(e1.status().message().find("max_model_len"), std::string::npos);
  auto e2 = eng.add_request({1, 600}, greedy(4));
  EXPECT_NE(e2.status().message().find("outside the vocabulary"), std::string::npos);
  SamplingParams p = greedy(4);
  p.stop = {"x"};
  EXPECT_NE(eng.add_request({1}, p).status().message().find("tokenizer"), std::string::npos);
  p = greedy(4);
  p.top_p = 0.f;
  EXPECT_NE(eng.add_request({1}, p).status().message().find("top_p"), std::string::npos);
  EXPECT_FALSE(eng.add_request({}, greedy(4)).ok());
  EXPECT_FALSE(eng.has_unfinished());
  EngineOptions bad = small_opts();
  bad.kv_cache_bytes = 10;
  bad.n_kv_blocks = 0;
  EXPECT_NE(engine_kv_blocks(m.w.config, DType::f32, bad).status().message().find("kv_cache_bytes"), std::string::npos);
}

TEST(Engine, AbortRequestFreesItsBlocksAndOthersFinishUnchanged) {
  Context ctx(deterministic());
  Stories& m = stories();
  Engine alone(ctx, m.w, m.tok.get(), small_opts());
  const auto ref = alone.generate({prompt(3)}, greedy(12)).value()[0].completion_ids;

  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  const int free0 = eng.n_free_kv_blocks();
  SamplingParams p = greedy(40);
  p.n = 3;
  const int64_t victim = eng.add_request(prompt(1), p).value();
  const int64_t keep = eng.add_request(prompt(3), greedy(12)).value();
  for (int i = 0; i < 4; ++i) eng.step();  // the victim holds blocks now
  EXPECT_LT(eng.n_free_kv_blocks(), free0);
  EXPECT_FALSE(eng.abort_request(12345));
  EXPECT_TRUE(eng.abort_request(victim));
  EXPECT_FALSE(eng.abort_request(victim));
  std::vector<RequestOutput> outs;
  while (eng.has_unfinished())
    for (auto& o : eng.step()) outs.push_back(std::move(o));
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].request_id, keep);
  EXPECT_EQ(outs[0].completion_ids, ref);
  EXPECT_EQ(eng.n_free_kv_blocks(), free0);
}

TEST(Engine, TokenEventsRebuildTheOutputsAndHoldBackPossibleStopText) {
  Context ctx;
  Stories& m = stories();
  REQUIRE_TOKENIZER();
  Engine eng(ctx, m.w, m.tok.get(), small_opts());
  SamplingParams p = greedy(60);
  p.stop = {"le gi"};
  p.top_logprobs = 2;
  SamplingParams q;
  q.seed = 5;
  q.n = 2;
  q.max_tokens = 15;
  q.ignore_eos = true;
  eng.add_request({1}, p).value();
  eng.add_request(prompt(0), q).value();
  std::map<std::pair<int64_t, int>, std::vector<TokenEvent>> evs;
  std::vector<RequestOutput> outs;
  while (eng.has_unfinished()) {
    std::vector<TokenEvent> step_evs;
    for (auto& o : eng.step(&step_evs)) outs.push_back(std::move(o));
    for (auto& e : step_evs) evs[{e.request_id, e.sample_index}].push_back(std::move(e));
  }
  ASSERT_EQ(outs.size(), 3u);
  for (const auto& o : outs) {
    const auto& es = evs[{o.request_id, o.sample_index}];
    ASSERT_EQ(es.size(), o.completion_ids.size());
    std::string text;
    for (size_t k = 0; k < es.size(); ++k) {
      EXPECT_EQ(es[k].token, o.completion_ids[k]);
      EXPECT_EQ(es[k].logprob, o.logprobs[k]);
      EXPECT_EQ(es[k].finish_reason, k + 1 == es.size() ? o.finish_reason : FinishReason::none);
      // Emitted text never runs past what the final text keeps.
      text += es[k].text_delta;
      EXPECT_EQ(o.text.compare(0, text.size(), text), 0) << k;
    }
    EXPECT_EQ(text, o.text);
    if (o.request_id == 0) {
      EXPECT_EQ(o.text, "Once upon a time, there was a litt");
      EXPECT_EQ(es[0].top_logprobs.size(), 2u);
    }
  }
}
