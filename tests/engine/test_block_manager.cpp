// Block manager bookkeeping without a model: allocation, refcounts, prefix
// hits on full blocks only, LRU eviction order, cache reset.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/block_manager.h"

using namespace grpo;

namespace {
std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}
}  // namespace

TEST(BlockManager, AllocateRegistersOnlyFullBlocks) {
  BlockManager bm(8, 4, true);
  auto toks = iota_tokens(10);  // blocks: [0..3] full, [4..7] full, [8,9] partial
  ASSERT_TRUE(bm.can_allocate(toks, 0, 10));
  BlockTable t;
  bm.allocate(t, toks, 0, 10);
  EXPECT_EQ(t.blocks.size(), 3u);
  EXPECT_EQ(bm.n_free(), 5);
  EXPECT_EQ(bm.n_cached(), 2);  // the partial third block is not registered
  EXPECT_TRUE(bm.is_registered(t.blocks[0]));
  EXPECT_TRUE(bm.is_registered(t.blocks[1]));
  EXPECT_FALSE(bm.is_registered(t.blocks[2]));
  for (int32_t b : t.blocks) EXPECT_EQ(bm.refcount(b), 1);
}

TEST(BlockManager, PrefixHitSharesFullBlocksAndCountsRefs) {
  BlockManager bm(8, 4, true);
  auto a = iota_tokens(10);
  BlockTable ta;
  bm.allocate(ta, a, 0, 10);
  auto b = a;
  b[9] = 99;  // same first 9 tokens: the two full blocks match, the partial one cannot
  EXPECT_EQ(bm.match_prefix(b, 9), 8);
  EXPECT_EQ(bm.match_prefix(b, 7), 4);  // only blocks ending at or before max_tokens count
  auto c = a;
  c[5] = 77;  // differs inside block 1: only block 0 matches
  EXPECT_EQ(bm.match_prefix(c, 9), 4);
  // Same ids as block 1 but at the start (different parent): no hit (chained hash).
  std::vector<int32_t> d = {4, 5, 6, 7, 8};
  EXPECT_EQ(bm.match_prefix(d, 4), 0);

  ASSERT_TRUE(bm.can_allocate(b, 8, 10));
  BlockTable tb;
  bm.allocate(tb, b, 8, 10);
  EXPECT_EQ(tb.blocks[0], ta.blocks[0]);
  EXPECT_EQ(tb.blocks[1], ta.blocks[1]);
  EXPECT_NE(tb.blocks[2], ta.blocks[2]);  // the partial last block is private
  EXPECT_EQ(bm.refcount(ta.blocks[0]), 2);
  EXPECT_EQ(bm.refcount(ta.blocks[2]), 1);
  EXPECT_EQ(bm.n_free(), 4);  // 8 - 3 - 1 fresh

  bm.free(ta);
  EXPECT_EQ(bm.refcount(tb.blocks[0]), 1);
  EXPECT_EQ(bm.n_free(), 5);
  bm.free(tb);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(bm.n_cached(), 2);  // contents stay cached after the last reference goes
  EXPECT_EQ(bm.match_prefix(a, 10), 8);
}

TEST(BlockManager, AppendGrowsAndRegistersBlocksAsTheyFill) {
  BlockManager bm(8, 4, true);
  auto toks = iota_tokens(12);
  BlockTable t;
  bm.allocate(t, toks, 0, 3);
  EXPECT_EQ(bm.n_cached(), 0);
  EXPECT_TRUE(bm.can_append(t, 4));
  bm.append(t, toks, 4);  // block 0 now full
  EXPECT_EQ(t.blocks.size(), 1u);
  EXPECT_EQ(bm.n_cached(), 1);
  bm.append(t, toks, 5);  // one token into a fresh block
  EXPECT_EQ(t.blocks.size(), 2u);
  bm.append(t, toks, 12);
  EXPECT_EQ(t.blocks.size(), 3u);
  EXPECT_EQ(bm.n_cached(), 3);
  EXPECT_EQ(bm.match_prefix(toks, 12), 12);
}

TEST(BlockManager, HitOnUnreferencedBlockLeavesLruAndCountsAgainstFree) {
  BlockManager bm(4, 4, true);
  auto a = iota_tokens(8);
  BlockTable ta;
  bm.allocate(ta, a, 0, 8);
  bm.free(ta);
  EXPECT_EQ(bm.n_free(), 4);
  // A hit on 2 cached (unreferenced) blocks + 3 fresh would need 5 of the 4 obtainable blocks.
  auto b = iota_tokens(20);
  EXPECT_EQ(bm.match_prefix(b, 19), 8);
  EXPECT_FALSE(bm.can_allocate(b, 8, 20));
  EXPECT_TRUE(bm.can_allocate(b, 8, 16));
  BlockTable tb;
  bm.allocate(tb, b, 8, 16);
  EXPECT_EQ(bm.n_free(), 0);
  EXPECT_EQ(bm.refcount(tb.blocks[0]), 1);
  EXPECT_FALSE(bm.can_append(tb, 17));
}

TEST(BlockManager, EvictionTakesFreeListFirstThenOldestTailFirst) {
  BlockManager bm(4, 2, true);
  auto a = iota_tokens(6);  // 3 full blocks
  BlockTable ta;
  bm.allocate(ta, a, 0, 6);
  bm.free(ta);  // LRU order (evict first): block of tokens [4,5], then [2,3], then [0,1]
  EXPECT_EQ(bm.n_cached(), 3);
  // A new unrelated sequence of 2 blocks: first the never-used free block, then one eviction.
  auto b = iota_tokens(4, 100);
  BlockTable tb;
  bm.allocate(tb, b, 0, 4);
  EXPECT_EQ(bm.n_cached(), 4);  // 3 - 1 evicted + 2 new
  EXPECT_EQ(bm.match_prefix(a, 6), 4);  // the tail block [4,5] was evicted, the prefix survives
  BlockTable tc;
  auto c = iota_tokens(2, 200);
  bm.allocate(tc, c, 0, 2);  // evicts [2,3]
  EXPECT_EQ(bm.match_prefix(a, 6), 2);
}

TEST(BlockManager, ResetForgetsEverythingAndStaleTablesRegisterNothing) {
  BlockManager bm(8, 4, true);
  auto a = iota_tokens(10);
  BlockTable ta, tb;
  bm.allocate(ta, a, 0, 6);
  bm.allocate(tb, iota_tokens(8, 50), 0, 8);
  bm.free(tb);
  bm.reset_prefix_cache();
  EXPECT_EQ(bm.n_cached(), 0);
  EXPECT_EQ(bm.n_free(), 6);
  EXPECT_EQ(bm.match_prefix(iota_tokens(8, 50), 8), 0);
  bm.append(ta, a, 10);  // block 1 fills, but ta predates the reset: not registered
  EXPECT_EQ(bm.n_cached(), 0);
  bm.free(ta);
  EXPECT_EQ(bm.n_free(), 8);
}

TEST(BlockManager, NoPrefixCachingNeverHits) {
  BlockManager bm(8, 4, false);
  auto a = iota_tokens(8);
  BlockTable ta;
  bm.allocate(ta, a, 0, 8);
  EXPECT_EQ(bm.match_prefix(a, 8), 0);
  EXPECT_EQ(bm.n_cached(), 0);
  bm.free(ta);
  EXPECT_EQ(bm.n_free(), 8);
}
