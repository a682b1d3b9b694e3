// KV block manager (see block_manager.h for the contract).
#include "engine/block_manager.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/sampling.h"  // sampling_mix64

namespace grpo {

namespace {
constexpr uint64_t kRootHash = 0x6A09E667F3BCC908ull;
// The chain's root for a salt (see match_prefix); salt 0 keeps the plain root.
uint64_t root_of(uint64_t salt) { return salt == 0 ? kRootHash : kRootHash ^ (salt * 0x9E3779B97F4A7C15ull + 1); }
}

BlockManager::BlockManager(int n_blocks, int block_size, bool enable_prefix_caching)
    : n_blocks_(n_blocks), block_size_(block_size), caching_(enable_prefix_caching), info_(size_t(n_blocks)) {
  GRPO_CHECK(n_blocks > 0 && block_size > 0);
  free_.reserve(size_t(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 handed out first
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> ids) {
  uint64_t h = sampling_mix64(parent ^ 0xBB67AE8584CAA73Bull);
  for (int32_t t : ids) h = sampling_mix64(h ^ uint64_t(uint32_t(t)));
  return h;
}

int32_t BlockManager::lookup(uint64_t parent, std::span<const int32_t> ids, uint64_t* hash) const {
  *hash = hash_block(parent, ids);
  auto it = by_hash_.find(*hash);
  if (it == by_hash_.end()) return -1;
  const BlockInfo& bi = info_[size_t(it->second)];
  if (bi.parent != parent || !std::equal(ids.begin(), ids.end(), bi.tokens.begin(), bi.tokens.end())) return -1;
  return it->second;
}

int BlockManager::match_prefix(std::span<const int32_t> tokens, int max_tokens, uint64_t salt) const {
  if (!caching_) return 0;
  const int n_full = std::min<int>(max_tokens, int(tokens.size())) / block_size_;
  uint64_t parent = root_of(salt), h = 0;
  int j = 0;
  for (; j < n_full; ++j) {
    if (lookup(parent, tokens.subspan(size_t(j) * block_size_, size_t(block_size_)), &h) < 0) break;
    parent = h;
  }
  return j * block_size_;
}

bool BlockManager::can_allocate(std::span<const int32_t> tokens, int n_hit, int n_target, uint64_t salt) const {
  GRPO_CHECK(n_hit % block_size_ == 0 && n_hit <= n_target && n_target <= int(tokens.size()));
  const int n_hit_blocks = n_hit / block_size_;
  int hits_unreferenced = 0;  // hit blocks that sit in the LRU are taken out of the obtainable pool
  uint64_t parent = root_of(salt), h = 0;
  for (int j = 0; j < n_hit_blocks; ++j) {
    int32_t b = lookup(parent, tokens.subspan(size_t(j) * block_size_, size_t(block_size_)), &h);
    GRPO_CHECK_MSG(b >= 0, "can_allocate: n_hit does not match the prefix cache (call match_prefix first)");
    if (info_[size_t(b)].ref == 0) ++hits_unreferenced;
    parent = h;
  }
  const int n_fresh = blocks_for(n_target) - n_hit_blocks;
  return n_fresh + hits_unreferenced <= n_free();
}

void BlockManager::take_hit(int32_t b) {
  BlockInfo& bi = info_[size_t(b)];
  if (bi.ref == 0) {
    GRPO_CHECK(bi.in_lru);
    lru_.erase(bi.lru_pos);
    bi.in_lru = false;
  }
  ++bi.ref;
}

int32_t BlockManager::take_fresh() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    GRPO_CHECK_MSG(!lru_.empty(), "block pool exhausted (missing can_allocate/can_append check)");
    b = lru_.front();
    lru_.pop_front();
    BlockInfo& ev = info_[size_t(b)];
    ev.in_lru = false;
    by_hash_.erase(ev.hash);
    ev.registered = false;
    ev.tokens.clear();
  }
  GRPO_CHECK(info_[size_t(b)].ref == 0);
  info_[size_t(b)].ref = 1;
  return b;
}

void BlockManager::allocate(BlockTable& table, std::span<const int32_t> tokens, int n_hit, int n_target,
                            uint64_t salt) {
  GRPO_CHECK_MSG(table.blocks.empty(), "allocate: the table already holds blocks");
  GRPO_CHECK(can_allocate(tokens, n_hit, n_target, salt));
  table = BlockTable{};
  table.epoch = epoch_;
  table.last_hash = root_of(salt);
  uint64_t h = 0;
  for (int j = 0; j < n_hit / block_size_; ++j) {
    int32_t b = lookup(table.last_hash, tokens.subspan(size_t(j) * block_size_, size_t(block_size_)), &h);
    take_hit(b);
    table.blocks.push_back(b);
    table.last_hash = h;
    table.n_hashed = j + 1;
  }
  while (int(table.blocks.size()) < blocks_for(n_target)) table.blocks.push_back(take_fresh());
  register_full_blocks(table, tokens, n_target);
}

bool BlockManager::can_append(const BlockTable& table, int n_target) const {
  return blocks_for(n_target) - int(table.blocks.size()) <= n_free();
}

void BlockManager::append(BlockTable& table, std::span<const int32_t> tokens, int n_target, int n_register) {
  GRPO_CHECK(n_target <= int(tokens.size()));
  GRPO_CHECK_MSG(can_append(table, n_target), "append: not enough free blocks (call can_append first)");
  while (int(table.blocks.size()) < blocks_for(n_target)) table.blocks.push_back(take_fresh());
  register_full_blocks(table, tokens, n_register >= 0 ? std::min(n_register, n_target) : n_target);
}

void BlockManager::truncate(BlockTable& table, int n_tokens) {
  const size_t keep = size_t(blocks_for(n_tokens));
  GRPO_CHECK_MSG(int(keep) >= table.n_hashed, "truncate: would drop a registered (committed) block");
  while (table.blocks.size() > keep) {
    const int32_t b = table.blocks.back();
    table.blocks.pop_back();
    BlockInfo& bi = info_[size_t(b)];
    GRPO_CHECK(bi.ref > 0 && !bi.registered);
    if (--bi.ref == 0) free_.push_back(b);
  }
}

void BlockManager::register_full_blocks(BlockTable& table, std::span<const int32_t> tokens, int n_target) {
  if (!caching_ || table.epoch != epoch_) return;
  const int n_full = n_target / block_size_;
  for (int j = table.n_hashed; j < n_full; ++j) {
    auto ids = tokens.subspan(size_t(j) * block_size_, size_t(block_size_));
    const uint64_t h = hash_block(table.last_hash, ids);
    const int32_t b = table.blocks[size_t(j)];
    BlockInfo& bi = info_[size_t(b)];
    // An equal block registered by another sequence wins; this one stays private.
    if (!bi.registered && by_hash_.find(h) == by_hash_.end()) {
      bi.registered = true;
      bi.hash = h;
      bi.parent = table.last_hash;
      bi.tokens.assign(ids.begin(), ids.end());
      by_hash_[h] = b;
    }
    table.last_hash = h;
    table.n_hashed = j + 1;
  }
}

void BlockManager::free(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    BlockInfo& bi = info_[size_t(*it)];
    GRPO_CHECK(bi.ref > 0);
    if (--bi.ref > 0) continue;
    if (bi.registered) {
      bi.lru_pos = lru_.insert(lru_.end(), *it);
      bi.in_lru = true;
    } else {
      free_.push_back(*it);
    }
  }
  table = BlockTable{};
}

void BlockManager::reset_prefix_cache() {
  ++epoch_;
  by_hash_.clear();
  for (int32_t b : lru_) {
    info_[size_t(b)].in_lru = false;
    free_.push_back(b);
  }
  lru_.clear();
  for (auto& bi : info_) {
    bi.registered = false;
    bi.tokens.clear();
  }
}

}  // namespace grpo
