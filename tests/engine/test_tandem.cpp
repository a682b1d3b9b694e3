// Tandem decoding on the CPU: the trained model is stories260K, the partner a
// randomly initialised tiny-llama of another shape with the same vocabulary.
// Checks: p_trained = 1 is the vanilla engine bit for bit; p_trained = 0 is a
// vanilla engine running the partner alone, bit for bit; for mixed sequences
// every emitted token's logprobs under both models equal a fresh full forward
// of that model over the sequence (both caches in sync), also with preemption
// and prefix-cache hits; word switches happen only at word starts, chunk
// switches only at chunk edges; seeds reproduce masks; the KV budget is shared.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/engine.h"
#include "engine/tandem.h"
#include "engine_test_util.h"
#include "model/presets.h"

using namespace grpo;
using namespace grpo::test;

namespace {

ContextOptions deterministic() {
  ContextOptions o;
  o.deterministic = true;
  return o;
}

EngineOptions small_opts() {
  EngineOptions o;
  o.block_size = 4;
  o.n_kv_blocks = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;  // chunked prefill for the longer prompts
  return o;
}

// A partner with the stories vocabulary but another shape (engine_test_util.h).
const ModelWeights& partner() {
  static ModelWeights* p = new ModelWeights(stories_vocab_random_model(77));
  return *p;
}

std::vector<std::vector<int32_t>> prompts() { return stories_prompts(); }

SamplingParams sampled(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.seed = seed;
  return p;
}

TandemOptions topts(TandemStrategy s, double p_trained, uint64_t seed = 3) {
  TandemOptions o;
  o.strategy = s;
  o.p_trained = p_trained;
  o.chunk_size = 4;
  o.seed = seed;
  if (s == TandemStrategy::word) {
    GRPO_CHECK(stories().tok != nullptr);
    o.token_flags = tandem_word_flags(*stories().tok, stories().w.config.vocab_size);
  }
  return o;
}

std::vector<RequestOutput> run(Context& ctx, const ModelWeights& w, const EngineOptions& eo, const EngineTandem* t,
                               const SamplingParams& p) {
  Engine eng(ctx, const_cast<ModelWeights&>(w), stories().tok.get(), eo, t);
  auto out = eng.generate(prompts(), p);
  GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
  return std::move(out).value();
}

// Every completion token's logprobs against fresh full forwards of both models.
void expect_caches_in_sync(Context& ctx, const RequestOutput& o, const char* label) {
  std::vector<int32_t> seq = o.prompt_ids;
  seq.insert(seq.end(), o.completion_ids.begin(), o.completion_ids.end());
  const auto lt = full_logprobs(ctx, stories().w, seq);
  const auto lq = full_logprobs(ctx, partner(), seq);
  ASSERT_EQ(o.model_mask.size(), o.completion_ids.size()) << label;
  ASSERT_EQ(o.logprobs_trained.size(), o.completion_ids.size()) << label;
  const size_t P = o.prompt_ids.size();
  for (size_t i = 0; i < o.completion_ids.size(); ++i) {
    const size_t row = P + i - 1, tok = size_t(o.completion_ids[i]);
    const double owner = o.model_mask[i] ? lt[row][tok] : lq[row][tok];
    EXPECT_NEAR(o.logprobs_raw[i], owner, 2e-4) << label << " token " << i << " owner " << int(o.model_mask[i]);
    EXPECT_NEAR(o.logprobs_trained[i], lt[row][tok], 2e-4) << label << " token " << i;
  }
}

int n_switches(const std::vector<uint8_t>& m) {
  int n = 0;
  for (size_t i = 1; i < m.size(); ++i) n += m[i] != m[i - 1];
  return n;
}

#define REQUIRE_TOKENIZER() \
  if (!stories().tok) GTEST_SKIP() << "tokenizer did not load: " << stories().tok_error

}  // namespace

TEST(Tandem, PTrainedOneIsTheVanillaEngineBitForBit) {
  REQUIRE_TOKENIZER();
  for (auto s : {TandemStrategy::token, TandemStrategy::chunk, TandemStrategy::word}) {
    Context c1(deterministic()), c2(deterministic());
    const SamplingParams p = sampled(24, 11);
    const auto vanilla = run(c1, stories().w, small_opts(), nullptr, p);
    EngineTandem t{&partner(), topts(s, 1.0)};
    const auto tandem = run(c2, stories().w, small_opts(), &t, p);
    ASSERT_EQ(vanilla.size(), tandem.size());
    for (size_t i = 0; i < vanilla.size(); ++i) {
      EXPECT_EQ(vanilla[i].completion_ids, tandem[i].completion_ids) << tandem_strategy_name(s) << " " << i;
      EXPECT_EQ(vanilla[i].logprobs_raw, tandem[i].logprobs_raw) << tandem_strategy_name(s) << " " << i;
      EXPECT_EQ(vanilla[i].logprobs_processed, tandem[i].logprobs_processed) << tandem_strategy_name(s) << " " << i;
      EXPECT_EQ(vanilla[i].text, tandem[i].text);
      EXPECT_TRUE(vanilla[i].model_mask.empty());
      EXPECT_EQ(tandem[i].model_mask, std::vector<uint8_t>(tandem[i].completion_ids.size(), 1));
      for (size_t j = 0; j < tandem[i].logprobs_trained.size(); ++j)
        EXPECT_NEAR(tandem[i].logprobs_trained[j], tandem[i].logprobs_raw[j], 1e-5);
    }
  }
}

TEST(Tandem, PTrainedZeroIsThePartnersOwnGenerationBitForBit) {
  REQUIRE_TOKENIZER();
  for (auto s : {TandemStrategy::token, TandemStrategy::chunk, TandemStrategy::word}) {
    Context c1(deterministic()), c2(deterministic());
    const SamplingParams p = sampled(24, 12);
    const auto alone = run(c1, partner(), small_opts(), nullptr, p);
    EngineTandem t{&partner(), topts(s, 0.0)};
    const auto tandem = run(c2, stories().w, small_opts(), &t, p);
    for (size_t i = 0; i < alone.size(); ++i) {
      EXPECT_EQ(alone[i].completion_ids, tandem[i].completion_ids) << tandem_strategy_name(s) << " " << i;
      EXPECT_EQ(alone[i].logprobs_raw, tandem[i].logprobs_raw) << tandem_strategy_name(s) << " " << i;
      EXPECT_EQ(alone[i].logprobs_processed, tandem[i].logprobs_processed);
      EXPECT_EQ(tandem[i].model_mask, std::vector<uint8_t>(tandem[i].completion_ids.size(), 0));
    }
  }
}

TEST(Tandem, MixedSequencesKeepBothCachesInSyncWithPreemptionAndPrefixHits) {
  REQUIRE_TOKENIZER();
  SamplingParams p = sampled(40, 21);
  p.n = 3;  // siblings take the prompt from the prefix cache
  EngineTandem t{&partner(), topts(TandemStrategy::token, 0.5)};
  Context c1(deterministic()), c2(deterministic()), cr(deterministic());
  Engine roomy(c1, const_cast<ModelWeights&>(stories().w), stories().tok.get(), small_opts(), &t);
  EngineOptions tight_o = small_opts();
  tight_o.n_kv_blocks = 30;
  Engine tight(c2, const_cast<ModelWeights&>(stories().w), stories().tok.get(), tight_o, &t);
  auto a = roomy.generate(prompts(), p);
  auto b = tight.generate(prompts(), p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(roomy.stats().preemptions, 0);
  EXPECT_GT(tight.stats().preemptions, 0);
  EXPECT_GT(roomy.stats().prefix_hit_tokens, 0);
  EXPECT_GT(tight.stats().tandem_trained_tokens, 0);
  EXPECT_GT(tight.stats().tandem_partner_tokens, 0);
  int total_switches = 0;
  for (size_t i = 0; i < a.value().size(); ++i) {
    const RequestOutput& x = a.value()[i];
    const RequestOutput& y = b.value()[i];
    EXPECT_EQ(x.completion_ids, y.completion_ids) << i;
    EXPECT_EQ(x.model_mask, y.model_mask) << i;
    EXPECT_EQ(x.logprobs_raw, y.logprobs_raw) << i;
    EXPECT_EQ(x.logprobs_trained, y.logprobs_trained) << i;
    total_switches += n_switches(y.model_mask);
    expect_caches_in_sync(cr, y, "tight");
    if (i < 3) expect_caches_in_sync(cr, x, "roomy");
  }
  EXPECT_GT(total_switches, 5);
  EXPECT_EQ(tight.n_free_kv_blocks(), 30);
}

TEST(Tandem, WordSwitchesOnlyAtWordStarts) {
  REQUIRE_TOKENIZER();
  const TandemOptions o = topts(TandemStrategy::word, 0.5);
  EngineTandem t{&partner(), o};
  Context ctx(deterministic());
  SamplingParams p = sampled(48, 31);
  p.n = 4;
  const auto out = run(ctx, stories().w, small_opts(), &t, p);
  int switches = 0, word_starts = 0;
  for (const auto& x : out) {
    std::vector<int32_t> seq = x.prompt_ids;
    seq.insert(seq.end(), x.completion_ids.begin(), x.completion_ids.end());
    const size_t P = x.prompt_ids.size();
    for (size_t i = 1; i < x.completion_ids.size(); ++i) {
      const bool ws = tandem_word_start(o.token_flags, seq[P + i - 1], seq[P + i]);
      word_starts += ws;
      if (x.model_mask[i] != x.model_mask[i - 1]) {
        ++switches;
        EXPECT_TRUE(ws) << "switch inside a word at completion token " << i << ": \""
                        << stories().tok->decode({seq[P + i - 1]}) << "\" then \""
                        << stories().tok->decode({seq[P + i]}) << "\"";
      }
    }
  }
  EXPECT_GT(switches, 3) << "the test needs switches to mean anything";
  EXPECT_GT(word_starts, switches);
}

TEST(Tandem, WordFlagsFromTokenText) {
  REQUIRE_TOKENIZER();
  const Tokenizer& tok = *stories().tok;
  const auto f = tandem_word_flags(tok, stories().w.config.vocab_size);
  int n_space = 0;
  for (int id = 0; id < int(f.size()); ++id) {
    const std::string s = tok.token_bytes(id);
    const bool sp = !s.empty() && std::string(" \n\t\r\f\v").find(s[0]) != std::string::npos;
    EXPECT_EQ(bool(f[size_t(id)] & kTokSpaceStart), sp) << id << " \"" << s << "\"";
    n_space += sp;
  }
  EXPECT_GT(n_space, 50);  // SentencePiece '▁' pieces decode with a leading space
  // Rules on hand-made flags: whitespace start, special token, or after a newline.
  const std::vector<uint8_t> h = {0, kTokSpaceStart, kTokNewlineEnd, kTokSpecial};
  EXPECT_FALSE(tandem_word_start(h, 0, 0));
  EXPECT_TRUE(tandem_word_start(h, 0, 1));
  EXPECT_TRUE(tandem_word_start(h, 2, 0));
  EXPECT_TRUE(tandem_word_start(h, 0, 3));
  EXPECT_TRUE(tandem_word_start(h, 3, 0));
}

TEST(Tandem, ChunkOwnersChangeOnlyAtChunkEdgesAndTokenFractionFollowsP) {
  TandemOptions o;
  o.strategy = TandemStrategy::chunk;
  o.p_trained = 0.5;
  o.chunk_size = 5;
  std::set<uint64_t> offsets;
  for (uint64_t k = 0; k < 40; ++k) {
    const uint64_t key = tandem_key(9, k);
    std::set<int> phases;
    int prev = -1;
    for (int i = 0; i < 200; ++i) {
      const int own = tandem_pick(o, key, i, prev, 0, 0, 0);
      if (prev >= 0 && own != prev) phases.insert(i % o.chunk_size);
      prev = own;
    }
    EXPECT_LE(phases.size(), 1u) << "sequence " << k << ": switches at more than one phase of the chunk grid";
    if (!phases.empty()) offsets.insert(uint64_t(*phases.begin()));
  }
  EXPECT_GT(offsets.size(), 1u) << "chunk starts should be random per sequence";
  o.strategy = TandemStrategy::token;
  o.p_trained = 0.3;
  int n = 0, trained = 0;
  for (uint64_t k = 0; k < 20; ++k)
    for (int i = 0; i < 200; ++i, ++n) trained += tandem_pick(o, tandem_key(1, k), i, -1, 0, 0, 0);
  EXPECT_NEAR(double(trained) / n, 0.3, 0.03);
}

TEST(Tandem, SeedsReproduceTheMask) {
  REQUIRE_TOKENIZER();
  Context c1(deterministic()), c2(deterministic()), c3(deterministic());
  const SamplingParams p = sampled(32, 41);
  EngineTandem t1{&partner(), topts(TandemStrategy::token, 0.5, 100)};
  EngineTandem t2{&partner(), topts(TandemStrategy::token, 0.5, 101)};
  const auto a = run(c1, stories().w, small_opts(), &t1, p);
  const auto b = run(c2, stories().w, small_opts(), &t1, p);
  const auto c = run(c3, stories().w, small_opts(), &t2, p);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].model_mask, b[i].model_mask);
    EXPECT_EQ(a[i].completion_ids, b[i].completion_ids);
    differs |= a[i].model_mask != c[i].model_mask;
  }
  EXPECT_TRUE(differs) << "another tandem seed should give other masks";
}

TEST(Tandem, SoloModeIsVanillaAndKvBudgetIsShared) {
  REQUIRE_TOKENIZER();
  Context c1(deterministic()), c2(deterministic());
  const SamplingParams p = sampled(16, 51);
  const auto vanilla = run(c1, stories().w, small_opts(), nullptr, p);
  EngineTandem t{&partner(), topts(TandemStrategy::token, 0.5)};
  Engine eng(c2, const_cast<ModelWeights&>(stories().w), stories().tok.get(), small_opts(), &t);
  ASSERT_TRUE(eng.tandem_active());
  ASSERT_TRUE(eng.set_tandem_active(false).ok());
  auto solo = eng.generate(prompts(), p);
  ASSERT_TRUE(solo.ok());
  for (size_t i = 0; i < vanilla.size(); ++i) {
    EXPECT_EQ(vanilla[i].completion_ids, solo.value()[i].completion_ids);
    EXPECT_TRUE(solo.value()[i].model_mask.empty());
  }
  ASSERT_TRUE(eng.set_tandem_active(true).ok());
  ASSERT_TRUE(eng.add_request(prompts()[0], p).ok());
  const Status busy = eng.set_tandem_active(false);
  EXPECT_FALSE(busy.ok());
  EXPECT_NE(busy.message().find("finish the running requests"), std::string::npos) << busy.message();

  EngineOptions eo = small_opts();
  eo.n_kv_blocks = 0;
  eo.kv_cache_bytes = 1 << 20;
  const size_t a = kv_block_bytes(stories().w.config, DType::f32, eo.block_size);
  const size_t b = kv_block_bytes(partner().config, DType::f32, eo.block_size);
  EXPECT_NE(a, b) << "the partner should have another block size for this test to mean anything";
  auto n = tandem_kv_blocks(stories().w.config, DType::f32, partner().config, DType::f32, eo);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(size_t(n.value()), eo.kv_cache_bytes / (a + b));
  Engine sized(c1, const_cast<ModelWeights&>(stories().w), nullptr, eo, &t);
  EXPECT_EQ(sized.n_kv_blocks(), n.value());
  EXPECT_EQ(sized.kv_bytes_per_block(), a + b);
}

TEST(Tandem, ConfigErrorsNameTheProblem) {
  ModelConfig other = partner().config;
  other.vocab_size = 600;
  const Status s = tandem_check_partner(stories().w.config, other, 256);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("vocab_size"), std::string::npos) << s.message();
  TandemOptions o;
  o.p_trained = 1.5;
  EXPECT_NE(o.validate(512).message().find("tandem.p_trained"), std::string::npos);
  o.p_trained = 0.5;
  o.strategy = TandemStrategy::word;
  EXPECT_NE(o.validate(512).message().find("word"), std::string::npos);
  EXPECT_FALSE(tandem_strategy_from_string("sentence").ok());
}
