// KV block manager: a fixed pool of n_blocks blocks of block_size tokens, a
// block table per sequence, and prefix caching of FULL blocks.
//
// Prefix caching: a full block is identified by the chained hash
// h_j = hash(h_{j-1}, tokens of block j) (h_{-1} = a fixed root), so equal hashes
// mean equal whole prefixes. A block is registered when a sequence's covered range
// first includes all of it (the engine writes its K/V in the same forward step;
// every layer writes the step's K/V before attending, so a sequence admitted in
// the same step may already reference it). Only full blocks are registered, so a
// partially filled last block is never shared and no copy-on-write is needed.
// Hits are verified against the stored tokens and parent hash (no collisions).
// Blocks whose refcount drops to 0 keep their contents: registered ones go to an
// LRU (evictable, reusable by a hit), others to the free list. Fresh blocks come
// from the free list first, then by evicting the least recently freed cached block.
// A sequence frees its blocks last-to-first, so a prefix outlives its tails.
//
// Check before mutate: can_allocate/allocate, can_append/append.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace grpo {

struct BlockTable {
  std::vector<int32_t> blocks;  // physical block ids; block i holds tokens [i·bs, (i+1)·bs)
  int n_hashed = 0;             // leading full blocks whose chained hash is known
  uint64_t last_hash = 0;       // hash of block n_hashed-1 (the chain's parent)
  uint64_t epoch = 0;           // cache epoch when allocated; a stale table registers nothing
};

class BlockManager {
 public:
  BlockManager(int n_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  bool prefix_caching() const { return caching_; }
  int n_blocks() const { return n_blocks_; }
  // Blocks obtainable now (free list + unreferenced cached blocks).
  int n_free() const { return int(free_.size() + lru_.size()); }
  int n_cached() const { return int(by_hash_.size()); }  // registered (shareable) blocks
  int refcount(int32_t block) const { return info_[size_t(block)].ref; }
  bool is_registered(int32_t block) const { return info_[size_t(block)].registered; }
  int blocks_for(int n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }

  // Number of leading tokens of `tokens` held by cached full blocks, counting only
  // blocks that end at or before max_tokens. 0 when prefix caching is off.
  // salt != 0 starts the hash chain from another root, so sequences whose K/V differ
  // for the same tokens (another LoRA adapter) never share blocks with salt 0 ones.
  int match_prefix(std::span<const int32_t> tokens, int max_tokens, uint64_t salt = 0) const;

  // For a sequence without blocks whose first n_hit tokens matched (match_prefix):
  // can blocks covering n_target >= n_hit tokens be obtained?
  bool can_allocate(std::span<const int32_t> tokens, int n_hit, int n_target, uint64_t salt = 0) const;
  // Takes the hit blocks (refcount+1) and fresh ones up to n_target tokens, and
  // registers the full blocks within n_target. Precondition: can_allocate.
  void allocate(BlockTable& table, std::span<const int32_t> tokens, int n_hit, int n_target, uint64_t salt = 0);

  // Grows an allocated table to cover n_target tokens (decode: one more token;
  // chunked prefill: the next chunk). tokens holds at least n_target ids.
  // n_register >= 0 caps the registered full blocks to the first n_register tokens
  // (speculative tokens appended for verification are not committed and must never be hashed).
  bool can_append(const BlockTable& table, int n_target) const;
  void append(BlockTable& table, std::span<const int32_t> tokens, int n_target, int n_register = -1);
  // Drops the blocks past the first blocks_for(n_tokens) (a speculative tail that was
  // rejected). Those blocks were never registered (see append's n_register).
  void truncate(BlockTable& table, int n_tokens);

  // Releases every block of the table (last to first) and clears it.
  void free(BlockTable& table);

  // Forgets every registered hash (after the weights change): nothing computed so far
  // will be hit again. Tables in flight keep their blocks but register nothing more.
  void reset_prefix_cache();

 private:
  struct BlockInfo {
    int ref = 0;
    bool registered = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;             // the block's ids while registered (hit verification)
    std::list<int32_t>::iterator lru_pos;    // valid while in lru_
    bool in_lru = false;
  };
  static uint64_t hash_block(uint64_t parent, std::span<const int32_t> ids);
  // Id of the registered block holding these ids after `parent`, or -1.
  int32_t lookup(uint64_t parent, std::span<const int32_t> ids, uint64_t* hash) const;
  int32_t take_fresh();
  void take_hit(int32_t b);
  void register_full_blocks(BlockTable& table, std::span<const int32_t> tokens, int n_target);

  int n_blocks_, block_size_;
  bool caching_;
  uint64_t epoch_ = 1;
  std::vector<BlockInfo> info_;
  std::vector<int32_t> free_;                 // unreferenced, unregistered (a stack)
  std::list<int32_t> lru_;                    // unreferenced, registered: front = evict first
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace grpo
