// NgramIndex (engine/ngram_index.h): hashed n-grams with their latest end; a hit is
// re-checked against the tokens, so a hash collision only loses a proposal.
#include "engine/ngram_index.h"

#include <algorithm>

#include "core/check.h"

namespace grpo {

uint64_t NgramIndex::key(const int32_t* gram, int n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ uint64_t(n);
  for (int i = 0; i < n; ++i) {
    h ^= uint64_t(uint32_t(gram[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

std::vector<int32_t> NgramIndex::propose(const std::vector<int32_t>& tokens, int n_min, int n_max, int k) {
  const int N = int(tokens.size());
  GRPO_CHECK_MSG(N >= indexed_, "NgramIndex: the tokens must only grow between calls");
  // Index the n-grams ending before N (end index e exclusive, e ≤ N − 1): an occurrence of the
  // suffix must start before N − n, i.e. end before N.
  for (int e = indexed_ + 1; e <= N - 1; ++e)
    for (int n = n_min; n <= n_max && n <= e; ++n) last_end_[key(tokens.data() + e - n, n)] = e;
  indexed_ = std::max(indexed_, N - 1);
  for (int n = std::min(n_max, N - 1); n >= n_min; --n) {
    const int32_t* suffix = tokens.data() + (N - n);
    auto it = last_end_.find(key(suffix, n));
    if (it == last_end_.end()) continue;
    const int from = it->second;
    if (!std::equal(suffix, suffix + n, tokens.data() + from - n)) continue;  // a collision
    const int to = std::min(N, from + k);
    return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
  }
  return {};
}

}  // namespace grpo
