// Scheduler bookkeeping without a model: chunked prefill, decode batching,
// sequence cap, preemption by recompute and resume, sibling prefix sharing
// (n > 1), cache reset. A fake "model" appends a token that depends only on the
// sequence and its length, so preempted and undisturbed runs must agree.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "engine/scheduler.h"

using namespace grpo;

namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, int n_prompt, int max_new, int start = 0,
                                   std::shared_ptr<SeqGroup> group = nullptr) {
  auto s = std::make_unique<Sequence>();
  s->seq_id = id;
  s->tokens.resize(size_t(n_prompt));
  std::iota(s->tokens.begin(), s->tokens.end(), start);
  s->n_prompt = n_prompt;
  s->max_total = n_prompt + max_new;
  s->group = std::move(group);
  return s;
}

// Runs one step: commit, append a fake token to sampled sequences, finish at max_total.
SchedulerOutput run_step(Scheduler& sch) {
  SchedulerOutput out = sch.schedule();
  sch.on_step_done(out);
  for (const auto& ss : out.seqs) {
    if (!ss.sample) continue;
    Sequence* s = ss.seq;
    s->tokens.push_back(int32_t(1000 + 10 * s->seq_id + s->n_total()));
    if (s->n_total() >= s->max_total) sch.finish(s, FinishReason::length);
  }
  return out;
}

}  // namespace

TEST(Scheduler, ChunkedPrefillSplitsLongPromptsAcrossSteps) {
  BlockManager bm(16, 4, true);
  Scheduler sch({.max_num_seqs = 4, .max_num_batched_tokens = 4, .enable_chunked_prefill = true}, bm);
  auto s = make_seq(0, 10, 2);
  sch.add(s.get());
  auto o1 = run_step(sch);
  ASSERT_EQ(o1.seqs.size(), 1u);
  EXPECT_EQ(o1.seqs[0].n_new, 4);
  EXPECT_FALSE(o1.seqs[0].sample);
  auto o2 = run_step(sch);
  EXPECT_EQ(o2.seqs[0].n_new, 4);
  EXPECT_FALSE(o2.seqs[0].sample);
  auto o3 = run_step(sch);
  EXPECT_EQ(o3.seqs[0].n_new, 2);
  EXPECT_TRUE(o3.seqs[0].sample);  // the last chunk yields the first completion token
  auto o4 = run_step(sch);
  EXPECT_EQ(o4.seqs[0].n_new, 1);  // decode
  EXPECT_TRUE(s->finished());
  EXPECT_EQ(s->n_completion(), 2);
  EXPECT_EQ(bm.n_free(), 16);
}

TEST(Scheduler, WithoutChunkingAPromptWaitsForAWholeBudget) {
  BlockManager bm(16, 4, true);
  Scheduler sch({.max_num_seqs = 4, .max_num_batched_tokens = 8, .enable_chunked_prefill = false}, bm);
  auto a = make_seq(0, 6, 3), b = make_seq(1, 6, 3, 50);
  sch.add(a.get());
  sch.add(b.get());
  auto o1 = run_step(sch);  // only a fits (6 + 6 > 8)
  ASSERT_EQ(o1.seqs.size(), 1u);
  EXPECT_EQ(o1.n_tokens, 6);
  auto o2 = run_step(sch);  // a decodes (1), b's prompt (6) fits: 7 <= 8
  ASSERT_EQ(o2.seqs.size(), 2u);
  EXPECT_EQ(o2.seqs[0].seq, a.get());
  EXPECT_EQ(o2.seqs[0].n_new, 1);
  EXPECT_EQ(o2.seqs[1].n_new, 6);
}

TEST(Scheduler, DecodeBatchingAndSequenceCap) {
  BlockManager bm(64, 4, true);
  Scheduler sch({.max_num_seqs = 2, .max_num_batched_tokens = 100}, bm);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(make_seq(i, 3, 2, 10 * i));
    sch.add(seqs.back().get());
  }
  auto o1 = run_step(sch);
  EXPECT_EQ(o1.seqs.size(), 2u);  // the cap
  EXPECT_EQ(o1.n_tokens, 6);
  EXPECT_EQ(o1.n_sampled, 2);
  auto o2 = run_step(sch);  // both decode their last token and finish
  EXPECT_EQ(o2.n_tokens, 2);
  EXPECT_EQ(sch.running().size(), 0u);
  auto o3 = run_step(sch);
  EXPECT_EQ(o3.seqs.size(), 1u);
  EXPECT_EQ(o3.seqs[0].seq, seqs[2].get());
}

TEST(Scheduler, PreemptsNewestAndResumesWithIdenticalTokens) {
  // The same 3 requests with a roomy pool and with a pool too small for all of them.
  auto run_all = [](int n_blocks, int64_t* n_preempt, std::vector<std::vector<int32_t>>* outs) {
    BlockManager bm(n_blocks, 2, true);
    Scheduler sch({.max_num_seqs = 8, .max_num_batched_tokens = 64}, bm);
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int i = 0; i < 3; ++i) {
      seqs.push_back(make_seq(i, 3, 8, 100 * i));
      sch.add(seqs.back().get());
    }
    for (int step = 0; step < 200 && sch.has_work(); ++step) {
      auto o = run_step(sch);
      for (Sequence* p : o.preempted) {
        EXPECT_EQ(p->n_computed, 0);
        EXPECT_TRUE(p->table.blocks.empty());
      }
      if (!o.preempted.empty()) {
        // The victim is the most recently admitted: the last sequence.
        EXPECT_EQ(o.preempted[0], seqs[2].get());
      }
    }
    EXPECT_FALSE(sch.has_work());
    EXPECT_EQ(bm.n_free(), n_blocks);
    *n_preempt = sch.n_preemptions();
    for (auto& s : seqs) outs->push_back(s->tokens);
  };
  int64_t np_ref = 0, np_small = 0;
  std::vector<std::vector<int32_t>> ref, small;
  run_all(64, &np_ref, &ref);
  run_all(12, &np_small, &small);  // 3 sequences of 11 tokens need 18 blocks of 2
  EXPECT_EQ(np_ref, 0);
  EXPECT_GT(np_small, 0);
  EXPECT_EQ(ref, small);
}

TEST(Scheduler, ResumeRecomputesPromptAndGeneratedTokensFromCache) {
  // 6 blocks of 2 tokens; a and b have 4-token prompts and may generate 6 tokens.
  BlockManager bm(6, 2, true);
  Scheduler sch({.max_num_seqs = 8, .max_num_batched_tokens = 64}, bm);
  auto a = make_seq(0, 4, 6), b = make_seq(1, 4, 6, 50);
  sch.add(a.get());
  sch.add(b.get());
  run_step(sch);  // prefill: 2 + 2 blocks; both have 5 tokens
  run_step(sch);  // token 5 needs a 3rd block each: pool full; both have 6 tokens
  run_step(sch);  // token 6 fits the 3rd blocks; both have 7 tokens
  auto o = run_step(sch);  // a's token 7 needs a 4th block: b (newest) is preempted
  ASSERT_EQ(o.preempted.size(), 1u);
  EXPECT_EQ(o.preempted[0], b.get());
  EXPECT_EQ(b->status, SeqStatus::waiting);
  EXPECT_EQ(sch.waiting().front(), b.get());
  EXPECT_EQ(b->n_total(), 7);  // keeps its generated tokens
  EXPECT_EQ(b->n_preemptions, 1);
  // b's freed blocks went to the LRU tail-first; a took b's 3rd block at once and
  // its 2nd when a needed a 5th block; b's first block [50, 51] survives.
  while (!a->finished()) run_step(sch);
  auto r = sch.schedule();
  ASSERT_EQ(r.seqs.size(), 1u);
  EXPECT_EQ(r.seqs[0].seq, b.get());
  EXPECT_EQ(b->n_computed, 2);
  EXPECT_EQ(r.seqs[0].n_new, 5);  // the rest of prompt + generated tokens is recomputed
  EXPECT_TRUE(r.seqs[0].sample);
  EXPECT_EQ(b->prefix_hit_tokens, 0);  // telemetry counts the first admission only
}

TEST(Scheduler, SiblingsShareThePromptThroughThePrefixCache) {
  BlockManager bm(64, 4, true);
  Scheduler sch({.max_num_seqs = 8, .max_num_batched_tokens = 8}, bm);
  auto g = std::make_shared<SeqGroup>();
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int j = 0; j < 3; ++j) {
    seqs.push_back(make_seq(j, 10, 2, 0, g));  // the same 10-token prompt
    seqs.back()->sample_index = j;
    sch.add(seqs.back().get());
  }
  // Step 1: the leader gets an 8-token chunk; its siblings wait (the prompt is not complete).
  auto o1 = run_step(sch);
  ASSERT_EQ(o1.seqs.size(), 1u);
  EXPECT_EQ(o1.seqs[0].n_new, 8);
  // Step 2: the leader finishes its prompt (2 tokens); the siblings hit its 2 full
  // blocks (8 tokens) and compute only the 2-token tail each: 2 + 2 + 2 = 6 tokens.
  auto o2 = run_step(sch);
  ASSERT_EQ(o2.seqs.size(), 3u);
  EXPECT_EQ(o2.n_tokens, 6);
  EXPECT_EQ(seqs[1]->prefix_hit_tokens, 8);
  EXPECT_EQ(seqs[2]->prefix_hit_tokens, 8);
  EXPECT_EQ(bm.refcount(seqs[0]->table.blocks[0]), 3);
  EXPECT_NE(seqs[1]->table.blocks[2], seqs[0]->table.blocks[2]);  // partial blocks are private
}

TEST(Scheduler, SiblingsAdmittedInTheSameStepWhenThePromptFits) {
  BlockManager bm(64, 4, true);
  Scheduler sch({.max_num_seqs = 8, .max_num_batched_tokens = 64}, bm);
  auto g = std::make_shared<SeqGroup>();
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int j = 0; j < 4; ++j) {
    seqs.push_back(make_seq(j, 13, 2, 0, g));
    sch.add(seqs.back().get());
  }
  auto o = run_step(sch);
  EXPECT_EQ(o.seqs.size(), 4u);
  EXPECT_EQ(o.n_tokens, 13 + 3 * 1);  // siblings hit 12 tokens (3 full blocks), compute 1
  EXPECT_EQ(bm.n_cached(), 3);
}

TEST(Scheduler, CacheResetStopsHits) {
  BlockManager bm(32, 4, true);
  Scheduler sch({.max_num_seqs = 8, .max_num_batched_tokens = 64}, bm);
  auto a = make_seq(0, 9, 1);
  sch.add(a.get());
  run_step(sch);
  EXPECT_TRUE(a->finished());
  auto b = make_seq(1, 9, 1);
  sch.add(b.get());
  run_step(sch);
  EXPECT_EQ(b->prefix_hit_tokens, 8);
  bm.reset_prefix_cache();
  auto c = make_seq(2, 9, 1);
  sch.add(c.get());
  auto o = run_step(sch);
  EXPECT_EQ(c->prefix_hit_tokens, 0);
  EXPECT_EQ(o.n_tokens, 9);
  EXPECT_EQ(bm.n_free(), 32);
}

TEST(Scheduler, AbortRequestFreesRunningAndWaitingSamplesAndSharedBlocks) {
  BlockManager bm(12, 4, true);
  Scheduler sch({.max_num_seqs = 3, .max_num_batched_tokens = 64}, bm);
  auto g = std::make_shared<SeqGroup>();
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int j = 0; j < 4; ++j) {  // request 7: four samples sharing a 9-token prompt
    seqs.push_back(make_seq(j, 9, 20, 0, g));
    seqs.back()->request_id = 7;
    sch.add(seqs.back().get());
  }
  auto other = make_seq(10, 5, 20, 100);
  other->request_id = 8;
  sch.add(other.get());
  run_step(sch);  // sample 0 prefills; its siblings wait for it
  run_step(sch);  // siblings 1 and 2 join through the prefix cache; sample 3 waits (sequence cap)
  ASSERT_EQ(sch.running().size(), 3u);
  ASSERT_EQ(sch.waiting().size(), 2u);
  EXPECT_TRUE(sch.abort_request(99).empty());  // unknown: nothing changes
  EXPECT_EQ(sch.running().size(), 3u);
  const auto gone = sch.abort_request(7);
  EXPECT_EQ(gone.size(), 4u);
  for (const auto& s : seqs) {
    EXPECT_TRUE(s->finished());
    EXPECT_EQ(s->finish, FinishReason::abort);
    EXPECT_TRUE(s->table.blocks.empty());
  }
  EXPECT_EQ(bm.n_free(), 12);  // every block (shared prompt blocks included) is obtainable again
  EXPECT_TRUE(sch.abort_request(7).empty());
  while (sch.has_work()) run_step(sch);  // the other request still runs to the end
  EXPECT_TRUE(other->finished());
  EXPECT_EQ(other->finish, FinishReason::length);
  EXPECT_EQ(bm.n_free(), 12);
}
