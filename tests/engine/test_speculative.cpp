// Speculative decoding on the CPU (engine/speculative.h): the target is stories260K;
// drafts are the target itself (acceptance bound), a randomly initialised tiny-llama
// with the same vocabulary (a genuinely different model) and prompt lookup (n-gram).
// The reference is the plain engine (no drafting) with the same options, whose sampler
// and greedy path are checked against independent references in test_engine.cpp: every
// speculative run must reproduce its tokens and raw/processed logprobs exactly, greedy
// and sampled (top-k / top-p / min-p), with preemption and prefix-cache hits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include "engine/engine.h"
#include "engine/engine_config.h"
#include "engine/ngram_index.h"
#include "engine/speculative.h"
#include "engine_test_util.h"
#include "model/presets.h"

using namespace grpo;
using namespace grpo::test;

namespace {

EngineOptions opts() {
  EngineOptions o;
  o.block_size = 4;
  o.n_kv_blocks = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 96;
  return o;
}

const ModelWeights& random_draft() {
  static ModelWeights* p = new ModelWeights(stories_vocab_random_model(91));
  return *p;
}

std::vector<std::vector<int32_t>> prompts() { return stories_prompts(); }

SamplingParams params(float temperature, int max_tokens, uint64_t seed, int n = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.seed = seed;
  p.n = n;
  return p;
}

struct SpecRun {
  std::vector<RequestOutput> out;
  EngineStats stats;
};

SpecRun run(const EngineOptions& eo, const SamplingParams& p, const ModelWeights* draft = nullptr) {
  ContextOptions co;
  co.deterministic = true;
  Context ctx(co);
  Engine eng(ctx, stories().w, stories().tok.get(), eo, nullptr, draft);
  auto out = eng.generate(prompts(), p);
  GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
  return {std::move(out).value(), eng.stats()};
}

// acceptance = match (the default here): outputs equal plain decoding's token for token at
// every temperature, which is what most tests below check. Speculative sampling (rejection)
// is checked statistically in test_spec_sampling.cpp.
EngineOptions spec(EngineOptions eo, SpecMethod m, int k, bool adaptive = false,
                   SpecAcceptance acc = SpecAcceptance::match) {
  eo.speculative.method = m;
  eo.speculative.num_speculative_tokens = k;
  eo.speculative.adaptive = adaptive;
  eo.speculative.acceptance = acc;
  return eo;
}

void expect_same(const SpecRun& plain, const SpecRun& sp, const char* label) {
  ASSERT_EQ(plain.out.size(), sp.out.size()) << label;
  for (size_t i = 0; i < plain.out.size(); ++i) {
    const RequestOutput &a = plain.out[i], &b = sp.out[i];
    EXPECT_EQ(a.completion_ids, b.completion_ids) << label << " output " << i;
    EXPECT_EQ(a.finish_reason, b.finish_reason) << label << " output " << i;
    EXPECT_EQ(a.text, b.text) << label << " output " << i;
    ASSERT_EQ(a.logprobs_raw.size(), b.logprobs_raw.size()) << label;
    for (size_t t = 0; t < a.logprobs_raw.size(); ++t) {
      // Verify rows come out of a multi-token chunk; fp32 CPU kernels are batch-invariant
      // in deterministic mode, so logits (and so logprobs) should match to rounding.
      EXPECT_NEAR(a.logprobs_raw[t], b.logprobs_raw[t], 1e-5) << label << " output " << i << " token " << t;
      EXPECT_NEAR(a.logprobs_processed[t], b.logprobs_processed[t], 1e-5) << label << " output " << i << " token " << t;
    }
  }
}

}  // namespace

TEST(Speculative, NgramProposesWhatFollowedTheMostRecentLongestMatch) {
  // suffix "7 8" last occurred at 4..5 (followed by 1 2), earlier at 0..1 (followed by 9).
  const std::vector<int32_t> t = {7, 8, 9, 5, 7, 8, 1, 2, 3, 7, 8};
  EXPECT_EQ(spec_ngram_propose(t, 1, 3, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(spec_ngram_propose(t, 1, 3, 1), (std::vector<int32_t>{1}));
  // Only a 1-gram matches: "4" never occurred before; "x 4" neither.
  EXPECT_TRUE(spec_ngram_propose({1, 2, 3, 4}, 1, 3, 2).empty());
  EXPECT_EQ(spec_ngram_propose({5, 6, 5}, 1, 2, 4), (std::vector<int32_t>{6, 5}));
  // ngram_min above every matching length: nothing.
  EXPECT_TRUE(spec_ngram_propose({5, 6, 5}, 2, 3, 4).empty());
}

// The incremental index against the scan (spec_ngram_propose, checked above): same proposal
// after every appended token, over a small vocabulary so that matches of every length occur.
TEST(Speculative, NgramIndexProposesWhatTheScanProposes) {
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return int32_t((x >> 33) % 5);
  };
  for (int n_min : {1, 2}) {
    NgramIndex idx;
    std::vector<int32_t> t;
    for (int i = 0; i < 400; ++i) {
      t.push_back(next());
      const int k = 1 + i % 4;
      ASSERT_EQ(idx.propose(t, n_min, 4, k), spec_ngram_propose(t, n_min, 4, k)) << "n_min " << n_min << " length " << t.size();
    }
  }
  // Lookups far apart (each indexes dozens of new tokens, the table grows several times in
  // between) over a larger vocabulary.
  NgramIndex idx;
  std::vector<int32_t> t;
  for (int i = 0; i < 3000; ++i) {
    t.push_back(next() * 7 + int32_t(i % 3));
    if (i % 37 == 36) ASSERT_EQ(idx.propose(t, 1, 4, 4), spec_ngram_propose(t, 1, 4, 4)) << "length " << t.size();
  }
}

TEST(Speculative, GreedyEqualsPlainForEveryProposer) {
  const SamplingParams p = params(0.f, 40, 1);
  const SpecRun plain = run(opts(), p);
  // Speculative sampling keeps greedy rows on the argmax test: bit-identical too.
  const auto rej = SpecAcceptance::rejection;
  expect_same(plain, run(spec(opts(), SpecMethod::draft, 3, false, rej), p, &random_draft()), "random draft, rejection");
  expect_same(plain, run(spec(opts(), SpecMethod::ngram, 5, false, rej), p), "ngram, rejection");
  const SpecRun copy = run(spec(opts(), SpecMethod::draft, 4), p, &stories().w);
  expect_same(plain, copy, "draft = target");
  const SpecRun rnd = run(spec(opts(), SpecMethod::draft, 3), p, &random_draft());
  expect_same(plain, rnd, "random draft");
  const SpecRun ng = run(spec(opts(), SpecMethod::ngram, 5), p);
  expect_same(plain, ng, "ngram");
  EXPECT_GT(copy.stats.spec_proposed, 0);
  EXPECT_GT(ng.stats.spec_proposed, 0);
  EXPECT_GT(rnd.stats.spec_proposed, 0);
}

TEST(Speculative, SampledOutputsEqualPlainDecodingWithFilters) {
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p = params(variant == 0 ? 1.f : 0.8f, 32, 11 + uint64_t(variant), 2);
    if (variant == 1) p.top_k = 20;
    if (variant == 2) {
      p.top_p = 0.9f;
      p.min_p = 0.05f;
    }
    const SpecRun plain = run(opts(), p);
    expect_same(plain, run(spec(opts(), SpecMethod::draft, 4), p, &stories().w), "draft = target");
    expect_same(plain, run(spec(opts(), SpecMethod::draft, 2), p, &random_draft()), "random draft");
    expect_same(plain, run(spec(opts(), SpecMethod::ngram, 3), p), "ngram");
    expect_same(plain, run(spec(opts(), SpecMethod::ngram, 3, /*adaptive=*/true), p), "ngram adaptive");
  }
}

TEST(Speculative, IdenticalDraftIsAlwaysAcceptedAndTelemetryCounts) {
  for (int mode = 0; mode < 3; ++mode) {
    const float temp = mode == 0 ? 0.f : 1.f;
    // q = p: speculative sampling accepts with probability min(1, p/q) = 1 as well.
    const SpecAcceptance acc = mode == 2 ? SpecAcceptance::rejection : SpecAcceptance::match;
    const SpecRun r = run(spec(opts(), SpecMethod::draft, 4, false, acc), params(temp, 40, 5), &stories().w);
    for (const RequestOutput& o : r.out) {
      const RequestTelemetry& tm = o.telemetry;
      EXPECT_GT(tm.spec_proposed, 0);
      EXPECT_EQ(tm.spec_accepted, tm.spec_proposed) << "T = " << temp;
      EXPECT_DOUBLE_EQ(tm.spec_acceptance_rate, 1.0);
      ASSERT_EQ(tm.spec_accepted_by_pos.size(), 4u);
      EXPECT_EQ(tm.spec_accepted_by_pos, tm.spec_proposed_by_pos);
      int64_t sum = 0;
      for (int64_t v : tm.spec_accepted_by_pos) sum += v;
      EXPECT_EQ(sum, tm.spec_accepted);
      // The prefill step emits one token; every later step k + 1 = 5, except where the
      // length limit cut the drafts.
      EXPECT_EQ(tm.engine_steps, 1 + (39 + 4) / 5) << "T = " << temp;
      EXPECT_EQ(tm.generated_tokens, 40);
    }
  }
  const SpecRun plain = run(opts(), params(1.f, 40, 5));
  for (const RequestOutput& o : plain.out) {
    EXPECT_EQ(o.telemetry.engine_steps, 40);
    EXPECT_EQ(o.telemetry.spec_proposed, 0);
  }
}

TEST(Speculative, RandomDraftAcceptanceIsCountedPerPosition) {
  const SpecRun r = run(spec(opts(), SpecMethod::draft, 3), params(1.f, 40, 9), &random_draft());
  for (const RequestOutput& o : r.out) {
    const RequestTelemetry& tm = o.telemetry;
    ASSERT_EQ(tm.spec_proposed_by_pos.size(), 3u);
    int64_t acc = 0;
    for (size_t j = 0; j < 3; ++j) {
      acc += tm.spec_accepted_by_pos[j];
      EXPECT_LE(tm.spec_accepted_by_pos[j], tm.spec_proposed_by_pos[j]);
      if (j > 0) EXPECT_LE(tm.spec_accepted_by_pos[j], tm.spec_accepted_by_pos[j - 1]);  // a run stops at a miss
    }
    EXPECT_EQ(acc, tm.spec_accepted);
    EXPECT_LT(tm.spec_acceptance_rate, 1.0);
    EXPECT_EQ(tm.engine_steps + tm.spec_accepted, tm.generated_tokens);
  }
}

TEST(Speculative, RollbackWithPreemptionAndPrefixCacheMatchesPlain) {
  EngineOptions eo = opts();
  eo.n_kv_blocks = 40;  // 3 prompts x 4 samples cannot all hold 60 tokens: preemption
  eo.max_num_batched_tokens = 32;
  const SamplingParams p = params(1.f, 48, 21, 4);
  const SpecRun plain = run(eo, p);
  ASSERT_GT(plain.stats.preemptions, 0) << "the pool should force preemption";
  const SpecRun d = run(spec(eo, SpecMethod::draft, 4), p, &stories().w);
  expect_same(plain, d, "draft = target, preempting");
  EXPECT_GT(d.stats.preemptions, 0);
  EXPECT_GT(d.stats.prefix_hit_tokens, 0);
  expect_same(plain, run(spec(eo, SpecMethod::draft, 3), p, &random_draft()), "random draft, preempting");
  expect_same(plain, run(spec(eo, SpecMethod::ngram, 4), p), "ngram, preempting");
}

TEST(Speculative, StopIdsInsideAnAcceptedRunEndTheSampleExactly) {
  const SamplingParams base = params(0.f, 40, 1);
  const SpecRun plain = run(opts(), base);
  // Stop on the 7th completion token of the first prompt: an identical draft proposes it
  // in the middle of a run of accepted tokens.
  SamplingParams p = base;
  p.stop_token_ids = {plain.out[0].completion_ids[6]};
  const SpecRun a = run(opts(), p);
  const SpecRun b = run(spec(opts(), SpecMethod::draft, 4), p, &stories().w);
  expect_same(a, b, "stop id");
  EXPECT_EQ(b.out[0].finish_reason, FinishReason::stop);
  if (stories().tok) {
    SamplingParams q = base;
    q.stop = {stories().tok->decode({plain.out[1].completion_ids[9]})};
    const SpecRun c = run(opts(), q), d2 = run(spec(opts(), SpecMethod::ngram, 4), q);
    expect_same(c, d2, "stop string");
  }
}

// With a draft that never matches, adaptive k must fall back to the plain engine's step:
// after the warm-up (two plain steps, two drafting steps) only probes draft, and each lost
// probe doubles the wait for the next one.
TEST(Speculative, AdaptiveKeepsOutputsAndTurnsOffForARandomDraft) {
  // Greedy: the random draft's argmax never equals the target's on these prompts, so no plan
  // can win whatever the measured times are (at T = 1 the match rule accepts some drafts and
  // the outcome would depend on this machine's timings).
  const SamplingParams p = params(0.f, 120, 3);
  const SpecRun plain = run(opts(), p);
  EngineOptions eo = spec(opts(), SpecMethod::draft, 4, /*adaptive=*/true);
  eo.speculative.probe_every = 8;
  const SpecRun r = run(eo, p, &random_draft());
  expect_same(plain, r, "adaptive random draft");
  ASSERT_EQ(r.stats.spec_accepted, 0) << "the premise: the random draft never matches the target";
  ASSERT_GT(r.stats.spec_proposed, 0);
  EXPECT_EQ(r.stats.spec_steps + r.stats.spec_plain_steps, r.stats.steps);
  // ~120 decode steps: 2 warm-up drafting steps, probes after 8, 16, 32 and 64 plain steps.
  EXPECT_LE(r.stats.spec_steps, 7) << "steps " << r.stats.steps;
  EXPECT_GE(r.stats.spec_plain_steps, r.stats.steps - 7);
  const SpecRun n = run(spec(opts(), SpecMethod::ngram, 4, /*adaptive=*/true), p);
  expect_same(plain, n, "adaptive ngram");
  EXPECT_EQ(n.stats.spec_steps + n.stats.spec_plain_steps, n.stats.steps);
}

// SpecAdaptive::plan from measured step times: never accepted drafts never win; always
// accepted ones win when a verify forward costs what a plain step does.
TEST(Speculative, AdaptivePlanFollowsMeasuredStepTimes) {
  SpecAdaptive a(4, 32);
  for (int i = 0; i < 4; ++i) {  // every forward costs 1 ms at any size; a draft round 0.5 ms
    a.plain.add(8, 1e-3);
    a.verify.add(8 + 8 * 4, 1e-3);
    a.verify.add(8, 1e-3);
    a.draft.add(8, 0.5e-3);
  }
  for (int i = 0; i < 3; ++i) a.plan(std::vector<double>(8, -1.0), true);  // warm-up probes
  for (int i = 0; i < 200; ++i) a.observe(4, 0);                          // never accepted
  for (int v : a.plan(std::vector<double>(8, -1.0), true)) EXPECT_EQ(v, 0);
  for (int i = 0; i < 400; ++i) a.observe(4, 4);  // always accepted: 5 tokens per 1 ms forward
  for (int v : a.plan(std::vector<double>(8, -1.0), false)) EXPECT_EQ(v, 4);
  // The rest of a drafting step (host bookkeeping outside the forwards) counts too: at 5 ms
  // a drafting step emits 5 tokens per 6 ms against 1 per 1 ms plain.
  for (int i = 0; i < 50; ++i) a.add_overhead(5e-3);
  EXPECT_NEAR(a.overhead(), 5e-3, 1e-9);
  for (int v : a.plan(std::vector<double>(8, -1.0), false)) EXPECT_EQ(v, 0);
}

// One k for the whole batch (SpecAdaptive::plan), no model: every sequence drafts or none does
// (a rollout ends with its slowest sequence); sequences that keep accepting make it pay for
// all; when verify forwards cost per token what plain steps do (a large, compute-bound batch),
// nobody drafts, even at high acceptance.
TEST(Speculative, AdaptivePlansOneKForTheWholeBatch) {
  auto measured = [](double plain16, double verify_a, double verify_b, double draft_a, double draft_b) {
    auto a = std::make_unique<SpecAdaptive>(4, 1000);
    for (int r = 0; r < 3; ++r) {
      a->plain.add(16, plain16);
      for (int t = 16; t <= 96; t += 4) a->verify.add(t, verify_a + verify_b * t);
      for (int t = 1; t <= 16; ++t) a->draft.add(t, draft_a + draft_b * t);
    }
    for (int i = 0; i < 2; ++i) a->plan(std::vector<double>(16, -1.0), true);  // warm-up probes
    return a;
  };
  // Plain: 1.16 ms (1 ms + 10 µs per token, as verify); a draft round 0.1 ms + 1 µs per sequence.
  auto a = measured(1.16e-3, 1e-3, 1e-5, 1e-4, 1e-6);
  std::vector<double> alpha(16, 0.05);
  for (size_t s = 0; s < 8; ++s) alpha[s] = 0.95;
  for (int v : a->plan(alpha, true)) EXPECT_EQ(v, 4);
  // Reference for the choice above: 8 sequences at α = 0.95 and k = 4 emit 8 · (0.95 + ... +
  // 0.95^4) = 28.2 extra tokens, the 8 at α = 0.05 0.4: 44.6 tokens for an 80-token verify
  // (1.8 ms) and 4 draft rounds of 16 (0.46 ms): 19.7 tokens / ms beats 16 / 1.16 ms = 13.8.
  for (int v : a->plan(std::vector<double>(16, 0.05), true)) EXPECT_EQ(v, 0) << "nobody accepts: plain";
  std::vector<int> cap(16, 4);
  cap[3] = 0;  // a sequence that cannot draft (its length limit) sits out; the others draft
  const std::vector<int> kc = a->plan(alpha, true, cap);
  for (size_t s = 0; s < 16; ++s) EXPECT_EQ(kc[s], s == 3 ? 0 : 4) << s;
  // Round 1 runs what the draft has not seen: one token each (steady state) drafts as above; a
  // lag of 160 tokens each (a quarter of it charged: 16 + 636 round-1 tokens, about 4.7 ms at
  // the measured 0.116 ms per 16) makes the step a loss.
  EXPECT_EQ(a->plan(alpha, true, {}, std::vector<int>(16, 1))[0], 4);
  for (int v : a->plan(alpha, true, {}, std::vector<int>(16, 160))) EXPECT_EQ(v, 0) << "the draft's catch-up";
  auto b = measured(16e-3, 0, 1e-3, 1e-6, 0);  // compute-bound: 1 ms per token
  for (int v : b->plan(std::vector<double>(16, 0.9), true)) EXPECT_EQ(v, 0);
  // A sequence's EMA starts from the engine-wide α: a first miss lowers it, never to 0.
  EXPECT_NEAR(SpecAdaptive::observe_seq(-1, 3, 3, 0.8), 0.8976, 1e-12);  // 0.8 → 0.84 → 0.872 → 0.8976
  EXPECT_NEAR(SpecAdaptive::observe_seq(-1, 3, 0, 0.8), 0.64, 1e-12);    // a miss at position 1 only
  EXPECT_NEAR(SpecAdaptive::observe_seq(1.0, 3, 0, 0.5), 0.8, 1e-12);
  // A sequence that does not draft relaxes toward the engine-wide α, 10% a step; unmeasured stays so.
  EXPECT_NEAR(SpecAdaptive::relax_seq(0.3, 0.8), 0.35, 1e-12);
  EXPECT_NEAR(SpecAdaptive::relax_seq(0.9, 0.5), 0.86, 1e-12);
  EXPECT_EQ(SpecAdaptive::relax_seq(-1.0, 0.8), -1.0);
  double x = 0.2;
  for (int i = 0; i < 40; ++i) x = SpecAdaptive::relax_seq(x, 0.7);
  EXPECT_NEAR(x, 0.7 - 0.5 * std::pow(0.9, 40), 1e-12);
}

// A sequence whose α fell below what drafting needs drafts again after some idle steps
// (relax_seq), instead of waiting for a probe: the engine-wide α stays high.
TEST(Speculative, AdaptiveSequenceDraftsAgainAfterAStreakOfMisses) {
  SpecAdaptive a(4, 1000);
  for (int i = 0; i < 4; ++i) {  // one sequence: verify of up to 5 tokens costs a plain step; a draft round 0.3 of it
    a.plain.add(1, 1e-3);
    for (int t = 1; t <= 5; ++t) a.verify.add(t, 1e-3);
    a.draft.add(1, 3e-4);
  }
  for (int i = 0; i < 2; ++i) a.plan({-1.0}, true);  // warm-up
  for (int i = 0; i < 100; ++i) a.observe(4, 3);      // engine-wide α high
  double alpha = 0.8;
  // A streak of misses: α 0.21, below k = 1's break-even (1 + α >= 1.02 · 1.3 ms / 1 ms: α >= 0.33).
  for (int i = 0; i < 6; ++i) alpha = SpecAdaptive::observe_seq(alpha, 1, 0, a.alpha(1));
  ASSERT_EQ(a.plan({alpha}, true)[0], 0) << "alpha " << alpha;
  int idle = 0;
  while (a.plan({alpha}, true)[0] == 0 && idle < 100) {
    alpha = SpecAdaptive::relax_seq(alpha, a.alpha(1));
    ++idle;
  }
  EXPECT_GT(idle, 0);
  EXPECT_LT(idle, 20) << "alpha " << alpha;
}

// The engine-wide acceptance by position is the mean of its first 20 outcomes, then an EMA of
// decay 0.95: its 0.8 start is gone after one outcome (idle sequences relax toward it).
TEST(Speculative, EngineWideAcceptanceIsABiasCorrectedEma) {
  SpecAdaptive a(4, 8);
  EXPECT_DOUBLE_EQ(a.alpha(1), 0.8);
  a.observe(4, 0);  // a miss at position 1; positions 2-4 not reached
  EXPECT_DOUBLE_EQ(a.alpha(1), 0.0);
  EXPECT_DOUBLE_EQ(a.alpha(2), 0.8);
  a.observe(4, 4);
  EXPECT_DOUBLE_EQ(a.alpha(1), 0.5);
  EXPECT_DOUBLE_EQ(a.alpha(2), 1.0);
  for (int i = 0; i < 18; ++i) a.observe(1, 1);  // 20 outcomes at position 1: 19 hits
  EXPECT_NEAR(a.alpha(1), 0.95, 1e-12);
  a.observe(1, 0);  // the 21st weighs 0.05
  EXPECT_NEAR(a.alpha(1), 0.95 * 0.95, 1e-12);
}

// The warm-up drafts full k for up to 8 sequences (the best-accepting first), then for the
// whole batch up to 128 sequences, so that whole-batch plans start from a measured verify cost.
TEST(Speculative, AdaptiveWarmupDraftsEightThenTheWholeBatch) {
  for (int B : {4, 8, 64, 512}) {
    SpecAdaptive a(4, 32);
    for (int i = 0; i < 2; ++i) a.plain.add(B, 1e-3);
    std::vector<double> alpha(size_t(B), -1.0);
    alpha[size_t(B) - 1] = 0.99;
    for (int step = 0; step < 2; ++step) {
      const std::vector<int> k = a.plan(alpha, false);
      const int drafting = int(std::count_if(k.begin(), k.end(), [](int v) { return v > 0; }));
      EXPECT_EQ(drafting, step == 0 ? std::min(B, 8) : std::min(B, 128)) << "B " << B;
      EXPECT_EQ(k.back(), 4) << "B " << B;
      for (int v : k) EXPECT_TRUE(v == 0 || v == 4);
    }
  }
}

// A draft that reads as many weight bytes per token as the target cannot pay even when every
// draft is accepted (a verify forward costs at least a plain step): no warm-up, no probes, and
// the engine runs plain steps only. A draft of 0.9 of the target could in principle (k = 4:
// 5 tokens for 4.6 steps) and is tried.
TEST(Speculative, DraftAsLargeAsTheTargetNeverDrafts) {
  const ModelConfig& target = stories().w.config;
  EXPECT_DOUBLE_EQ(spec_draft_read_ratio(target, target), 1.0);
  EXPECT_LT(spec_draft_read_ratio(target, random_draft().config), 0.9);
  // The ratio counts a tied embedding once (it is the LM head) and leaves an untied input
  // embedding out (a token reads one row of it).
  ModelConfig untied = target;
  untied.tie_word_embeddings = !target.tie_word_embeddings;
  const double diff = double(target.vocab_size) * double(target.hidden_size);
  const double n = double(target.n_params()), nu = double(untied.n_params());
  EXPECT_NEAR(spec_draft_read_ratio(target, untied),
              (untied.tie_word_embeddings ? nu : nu - diff) / (target.tie_word_embeddings ? n : n - diff), 1e-12);
  for (double ratio : {1.0, 0.9}) {
    SpecAdaptive a(4, 8);
    a.set_draft_read_ratio(ratio);
    for (int i = 0; i < 2; ++i) a.plain.add(8, 1e-3);
    const std::vector<double> alpha(8, 1.0);
    int drafting_steps = 0;
    for (int step = 0; step < 300; ++step) {
      const std::vector<int> k = a.plan(alpha, true);
      drafting_steps += std::any_of(k.begin(), k.end(), [](int v) { return v > 0; });
    }
    if (ratio == 1.0) {
      EXPECT_FALSE(a.draft_can_pay());
      EXPECT_EQ(drafting_steps, 0);
    } else {
      EXPECT_TRUE(a.draft_can_pay());
      EXPECT_GT(drafting_steps, 0);
    }
  }
  // The engine: the target as its own draft, adaptive: outputs of plain decoding, no drafting step.
  const SamplingParams p = params(0.f, 60, 3);
  const SpecRun plain = run(opts(), p);
  const SpecRun self = run(spec(opts(), SpecMethod::draft, 4, /*adaptive=*/true), p, &stories().w);
  expect_same(plain, self, "adaptive self draft");
  EXPECT_EQ(self.stats.spec_steps, 0);
  EXPECT_EQ(self.stats.spec_proposed, 0);
}

TEST(SpecStepTimes, InterpolatesBetweenMeasuredSizes) {
  SpecStepTimes t;
  for (int i = 0; i < 2; ++i) {
    t.add(8, 1.0);
    t.add(64, 3.0);
  }
  EXPECT_TRUE(t.measured(8, 2));
  EXPECT_FALSE(t.measured(20));
  EXPECT_DOUBLE_EQ(t.predict(8), 1.0);
  EXPECT_NEAR(t.predict(36), 2.0, 1e-12);    // halfway between 8 and 64
  // Past the largest, up to twice its size: the last two buckets' slope (2 / 56 a unit); beyond,
  // proportional to size from there.
  EXPECT_NEAR(t.predict(100), 3.0 + 36.0 * 2 / 56, 1e-12);
  EXPECT_NEAR(t.predict(128), 3.0 + 64.0 * 2 / 56, 1e-12);
  EXPECT_NEAR(t.predict(256), (3.0 + 64.0 * 2 / 56) * 2, 1e-12);
  EXPECT_DOUBLE_EQ(t.predict(2), 1.0);       // below the smallest: that bucket's time
}

TEST(Speculative, ConfigErrorsNameTheKey) {
  SpeculativeOptions o;
  o.method = SpecMethod::ngram;
  o.num_speculative_tokens = 0;
  EXPECT_NE(o.validate().message().find("engine.speculative.num_speculative_tokens"), std::string::npos);
  o.num_speculative_tokens = 3;
  o.ngram_min = 3;
  o.ngram_max = 2;
  EXPECT_NE(o.validate().message().find("ngram_min"), std::string::npos);
  EXPECT_FALSE(spec_method_from_string("eagle").ok());
  EXPECT_NE(spec_method_from_string("eagle").status().message().find("engine.speculative.method"), std::string::npos);
  ModelConfig a, b;
  a.vocab_size = 512;
  b.vocab_size = 513;
  EXPECT_NE(spec_check_draft(a, b, 64).message().find("vocab_size"), std::string::npos);
}

// A draft vocabulary (FR-Spec, SpeculativeOptions::draft_vocab_ids): the draft's LM head keeps
// two thirds of the ids. Outputs stay plain decoding's (greedy and the match rule, with
// filters); the target as its own draft is accepted exactly where its own token is a kept id.
TEST(Speculative, DraftVocabularyKeepsOutputsExact) {
  std::vector<int32_t> kept;
  for (int32_t id = 0; id < stories().w.config.vocab_size; ++id)
    if (id % 3 != 1) kept.push_back(id);
  auto with_vocab = [&](EngineOptions eo) {
    eo.speculative.draft_vocab_ids = kept;
    return eo;
  };
  const SamplingParams g = params(0.f, 40, 1);
  const SpecRun plain = run(opts(), g);
  const SpecRun self = run(with_vocab(spec(opts(), SpecMethod::draft, 4)), g, &stories().w);
  expect_same(plain, self, "draft = target, draft vocabulary");
  expect_same(plain, run(with_vocab(spec(opts(), SpecMethod::draft, 3)), g, &random_draft()),
              "random draft, draft vocabulary");
  // Greedy self-draft: each draft equals the target's argmax unless that id was left out, so a
  // drafted position is accepted iff the token plain decoding emits there is kept.
  int64_t proposed = 0, accepted = 0;
  for (const RequestOutput& o : self.out) {
    proposed += o.telemetry.spec_proposed;
    accepted += o.telemetry.spec_accepted;
  }
  EXPECT_GT(proposed, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, proposed) << "some emitted tokens are outside the draft vocabulary";
  for (int variant = 0; variant < 2; ++variant) {
    SamplingParams p = params(0.8f, 32, 21 + uint64_t(variant), 2);
    if (variant == 1) {
      p.top_k = 20;
      p.top_p = 0.9f;
    }
    const SpecRun sp_plain = run(opts(), p);
    expect_same(sp_plain, run(with_vocab(spec(opts(), SpecMethod::draft, 4)), p, &stories().w),
                "draft = target, draft vocabulary, sampled");
    expect_same(sp_plain, run(with_vocab(spec(opts(), SpecMethod::draft, 2)), p, &random_draft()),
                "random draft, draft vocabulary, sampled");
  }
  // Every id kept: the column mapping is the identity, so speculative sampling (whose outputs
  // depend on q) draws exactly what the full-vocabulary draft draws.
  std::vector<int32_t> all(size_t(stories().w.config.vocab_size));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
  EngineOptions full = spec(opts(), SpecMethod::draft, 3, false, SpecAcceptance::rejection), mapped = full;
  mapped.speculative.draft_vocab_ids = all;
  const SamplingParams t1 = params(1.f, 32, 8, 2);
  const SpecRun a = run(full, t1, &random_draft()), b = run(mapped, t1, &random_draft());
  expect_same(a, b, "every id kept, rejection");
  EXPECT_EQ(a.stats.spec_accepted, b.stats.spec_accepted);
}

// engine.speculative.draft_vocab files: both forms, the first draft_vocab_size ids, and errors
// that name the key and the problem.
TEST(Speculative, DraftVocabularyFileAndErrors) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  SpeculativeOptions o;
  o.method = SpecMethod::draft;
  o.draft_vocab = write("dv_array.json", "[7, 3, 9, 1]");
  ASSERT_TRUE(spec_resolve_draft_vocab(o, 16).ok());
  EXPECT_EQ(o.draft_vocab_ids, (std::vector<int32_t>{1, 3, 7, 9}));
  SpeculativeOptions first2 = o;
  first2.draft_vocab_ids.clear();
  first2.draft_vocab = write("dv_object.json", R"({"token_ids": [7, 3, 9, 1], "counts": [9, 8, 7, 6]})");
  first2.draft_vocab_size = 2;
  ASSERT_TRUE(spec_resolve_draft_vocab(first2, 16).ok());
  EXPECT_EQ(first2.draft_vocab_ids, (std::vector<int32_t>{3, 7})) << "the first two of the file, ascending";
  auto err = [&](const std::string& text, int size = 0) {
    SpeculativeOptions b;
    b.method = SpecMethod::draft;
    b.draft_vocab = text.empty() ? dir + "/missing.json" : write("dv_bad.json", text);
    b.draft_vocab_size = size;
    const Status st = spec_resolve_draft_vocab(b, 16);
    EXPECT_FALSE(st.ok()) << text;
    return st.message();
  };
  EXPECT_NE(err("").find("engine.speculative.draft_vocab"), std::string::npos);
  EXPECT_NE(err("[1, 2").find("invalid JSON"), std::string::npos);
  EXPECT_NE(err("[1, 16]").find("outside the vocabulary [0, 16)"), std::string::npos);
  EXPECT_NE(err("[1, 2, 1]").find("appears twice"), std::string::npos);
  EXPECT_NE(err("[1, \"a\"]").find("not an integer"), std::string::npos);
  EXPECT_NE(err("[]").find("non-empty"), std::string::npos);
  EXPECT_NE(err("[1, 2]", 3).find("draft_vocab_size = 3"), std::string::npos);
  // Config-level checks: a draft vocabulary needs a draft model.
  EngineConfig c;
  c.speculative.method = SpecMethod::ngram;
  c.speculative.draft_vocab = "v.json";
  EXPECT_NE(c.validate().message().find("engine.speculative.draft_vocab"), std::string::npos);
  c.speculative.method = SpecMethod::draft;
  c.speculative.draft_model = "d";
  c.speculative.draft_vocab.clear();
  c.speculative.draft_vocab_size = 8;
  EXPECT_NE(c.validate().message().find("needs speculative.draft_vocab"), std::string::npos);
}

// Engine::step's token events (grpo serve's streaming) under speculative decoding:
// several tokens per step each get an event, in order, and a sample's text deltas
// add up to its final text (stop strings included); abort_request frees a request.
TEST(Speculative, TokenEventsAndAbort) {
  for (SpecMethod m : {SpecMethod::draft, SpecMethod::ngram}) {
    SCOPED_TRACE(spec_method_name(m));
    ContextOptions co;
    co.deterministic = true;
    Context ctx(co);
    Engine eng(ctx, stories().w, stories().tok.get(), spec(opts(), m, 4), nullptr,
               m == SpecMethod::draft ? &stories().w : nullptr);
    SamplingParams p = params(0.f, 40, 3, 2);
    p.stop = {"the"};
    std::vector<int64_t> ids;
    for (const auto& pr : prompts()) ids.push_back(eng.add_request(pr, p).value());
    const int64_t gone = eng.add_request(prompts()[0], params(0.f, 40, 4)).value();
    EXPECT_TRUE(eng.abort_request(gone));
    EXPECT_FALSE(eng.abort_request(gone));
    std::map<std::pair<int64_t, int>, std::string> text;
    std::map<std::pair<int64_t, int>, std::vector<int32_t>> toks;
    std::vector<RequestOutput> done;
    int64_t multi = 0;
    while (eng.has_unfinished()) {
      std::vector<TokenEvent> ev;
      auto d = eng.step(&ev);
      std::map<std::pair<int64_t, int>, int> per_step;
      for (const TokenEvent& e : ev) {
        text[{e.request_id, e.sample_index}] += e.text_delta;
        toks[{e.request_id, e.sample_index}].push_back(e.token);
        multi += ++per_step[{e.request_id, e.sample_index}] == 2;
      }
      for (auto& o : d) done.push_back(std::move(o));
    }
    ASSERT_EQ(done.size(), ids.size() * 2);
    for (const RequestOutput& o : done) {
      EXPECT_NE(o.request_id, gone);
      const std::pair<int64_t, int> key(o.request_id, o.sample_index);
      EXPECT_EQ(text[key], o.text);
      EXPECT_EQ(toks[key], o.completion_ids);
    }
    // The draft is the target itself: every draft is accepted.
    if (m == SpecMethod::draft) EXPECT_GT(multi, 0) << "no step emitted two tokens of one sample";
  }
}

// While drafting loses, probes are small (k <= 2 for the 8 sequences of best acceptance),
// their spacing grows fourfold after each lost probe (twofold after the lost warm-up), and
// preview predicts plan() without counting the step.
TEST(Speculative, AdaptiveProbesAreSmallAndGrowApart) {
  const int B = 64;
  SpecAdaptive a(4, 8);
  for (int i = 0; i < 4; ++i) {  // a verify token costs a plain step's token: drafting never pays
    a.plain.add(B, 1e-3);
    for (int t = B; t <= 5 * B; t += 8) a.verify.add(t, 1e-3 * t / B);
  }
  std::vector<double> alpha(B, -1.0);
  alpha[5] = 0.3;  // the best-accepting sequences come first in a probe
  alpha[9] = 0.2;
  for (int i = 0; i < 200; ++i) a.observe(4, 0);
  std::vector<int> probe_steps;
  for (int step = 0; step < 400; ++step) {
    const std::vector<int> predicted = a.preview(alpha, false);
    const std::vector<int> k = a.plan(alpha, false);
    const int drafting = int(std::count_if(k.begin(), k.end(), [](int v) { return v > 0; }));
    EXPECT_EQ(predicted, k) << "step " << step;
    if (step < 2) {  // warm-up probes: 8 sequences at full k, then all of them
      EXPECT_EQ(drafting, step == 0 ? 8 : B);
      continue;
    }
    if (drafting == 0) continue;
    probe_steps.push_back(step);
    EXPECT_EQ(drafting, 8) << "step " << step;
    EXPECT_GT(k[5], 0);
    EXPECT_GT(k[9], 0);
    for (int v : k) EXPECT_LE(v, 2);
  }
  // Warm-up at steps 0-1, then probes after 16 (2 · probe_every), 64 and 256 plain steps.
  ASSERT_EQ(probe_steps.size(), 3u);
  EXPECT_EQ(probe_steps[0], 1 + 16);
  EXPECT_EQ(probe_steps[1] - probe_steps[0], 64);
  EXPECT_EQ(probe_steps[2] - probe_steps[1], 256);
}
