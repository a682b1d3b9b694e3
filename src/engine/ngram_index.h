// Incremental prompt-lookup index of one sequence (speculative decoding, method ngram):
// the most recent end position of every n-gram (n in [n_min, n_max]) of its committed
// tokens, so that a step's lookup costs O(n_max) hash probes instead of a scan of the
// whole context (spec_ngram_propose, the reference, is O(context · n_max) per step).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace grpo {

class NgramIndex {
 public:
  // The proposal spec_ngram_propose(tokens, n_min, n_max, k) gives: tokens that followed the
  // most recent earlier occurrence of the longest matching suffix. `tokens` must extend the
  // tokens of the previous call (committed tokens only: no drafts); n_min / n_max must not
  // change between calls.
  std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int n_min, int n_max, int k);

 private:
  static uint64_t key(const int32_t* gram, int n);
  std::unordered_map<uint64_t, int> last_end_;  // key of an n-gram -> its latest end index (exclusive)
  int indexed_ = 0;                             // n-grams ending at or before this index are in last_end_
};

}  // namespace grpo
