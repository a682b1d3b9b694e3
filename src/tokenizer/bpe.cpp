// BPE model: turns one pre-token into ids the way HF tokenizers' BPE does.
// Symbols start as single characters (bytes for byte-level models); the pair with the
// lowest merge rank is merged first, leftmost first among equal ranks (HF's priority
// queue order), until no adjacent pair has a merge. Results are cached per pre-token.
#include <algorithm>
#include <cstring>

#include "tokenizer/tokenizer_impl.h"

namespace grpo {

namespace {
struct Sym {
  int id;
  int prev, next;  // linked list over the symbol array; -1 at the ends
  bool alive;
};
struct Cand {
  uint32_t rank;
  int pos;  // index of the left symbol
  int new_id;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};
}  // namespace

void BpeModel::merge(std::vector<int>& ids) const {
  const int n = int(ids.size());
  if (n < 2 || merges.empty()) return;
  auto lookup = [&](int a, int b, uint64_t* v) {
    auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    if (it == merges.end()) return false;
    *v = it->second;
    return true;
  };
  if (n == 2) {  // the most common case after a cache miss on short words
    uint64_t v;
    if (lookup(ids[0], ids[1], &v)) ids = {int(uint32_t(v))};
    return;
  }
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;  // min-heap on (rank, pos) via std::greater
  syms.resize(n);
  for (int i = 0; i < n; ++i) syms[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  heap.clear();
  auto push = [&](Cand c) { heap.push_back(c); std::push_heap(heap.begin(), heap.end(), std::greater<Cand>()); };
  uint64_t v;
  for (int i = 0; i + 1 < n; ++i)
    if (lookup(ids[i], ids[i + 1], &v)) push({uint32_t(v >> 32), i, int(uint32_t(v))});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    Cand c = heap.back();
    heap.pop_back();
    Sym& L = syms[c.pos];
    if (!L.alive || L.next < 0) continue;
    Sym& R = syms[L.next];
    // Stale entry: one side was merged into something else since it was queued.
    if (!lookup(L.id, R.id, &v) || int(uint32_t(v)) != c.new_id) continue;
    L.id = c.new_id;
    R.alive = false;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = c.pos;
    if (L.prev >= 0 && lookup(syms[L.prev].id, L.id, &v)) push({uint32_t(v >> 32), L.prev, int(uint32_t(v))});
    if (L.next >= 0 && lookup(L.id, syms[L.next].id, &v)) push({uint32_t(v >> 32), c.pos, int(uint32_t(v))});
  }
  ids.clear();
  for (int i = 0; i >= 0; i = syms[i].next) ids.push_back(syms[i].id);
}

void BpeModel::encode_uncached(std::string_view word, std::vector<int>& out) const {
  if (ignore_merges) {  // Llama-3: a pre-token that is itself a token is emitted whole
    const StrMap& m = byte_level ? raw_vocab : vocab;
    auto it = m.find(word);
    if (it != m.end()) { out.push_back(it->second); return; }
  }
  thread_local std::vector<int> syms;
  syms.clear();
  if (byte_level) {
    for (unsigned char b : word) {
      int id = byte_ids[b];
      if (id >= 0) syms.push_back(id);
      else if (unk_id >= 0 && !(fuse_unk && !syms.empty() && syms.back() == unk_id)) syms.push_back(unk_id);
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      size_t n = utf8_seq_len(word, i);
      if (n == 0) n = 1;  // a stray byte: only byte fallback can represent it
      auto it = vocab.find(word.substr(i, n));
      if (it != vocab.end()) {
        syms.push_back(it->second);
      } else {
        bool all = byte_fallback;
        for (size_t k = 0; all && k < n; ++k) all = byte_ids[uint8_t(word[i + k])] >= 0;
        if (all) {
          for (size_t k = 0; k < n; ++k) syms.push_back(byte_ids[uint8_t(word[i + k])]);
        } else if (unk_id >= 0 && !(fuse_unk && !syms.empty() && syms.back() == unk_id)) {
          syms.push_back(unk_id);
        }
      }
      i += n;
    }
  }
  merge(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

namespace {
// Fast 64-bit hash for short byte strings (cache keys); never returns 0.
uint64_t word_hash(std::string_view w) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (w.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= w.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, w.data() + i, 8);
    h = (h ^ x) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, w.data() + i, w.size() - i);
  h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h | 1;
}
}  // namespace

bool WordCache::find(std::string_view w, uint64_t h, std::vector<int>& out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == h && s.key_len == w.size() && std::memcmp(keys_.data() + s.key_off, w.data(), w.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
      return true;
    }
  }
}

void WordCache::grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void WordCache::insert(std::string_view w, uint64_t h, const int* ids, size_t n) {
  if (2 * (count_ + 1) > slots_.size()) {  // keep the load factor <= 1/2
    if (slots_.size() >= kMaxSlots) return;
    grow();
  }
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i].hash != 0; i = (i + 1) & mask)
    if (slots_[i].hash == h && slots_[i].key_len == w.size() && std::memcmp(keys_.data() + slots_[i].key_off, w.data(), w.size()) == 0)
      return;  // another thread inserted it meanwhile
  slots_[i] = {h, uint32_t(keys_.size()), uint32_t(w.size()), uint32_t(ids_.size()), uint32_t(n)};
  keys_.append(w);
  ids_.insert(ids_.end(), ids, ids + n);
  ++count_;
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.size() > 256) {  // long pre-tokens are rare and would crowd the cache
    encode_uncached(word, out);
    return;
  }
  const uint64_t h = word_hash(word);
  Shard& sh = cache_[(h >> 59) % kShards];
  {
    std::lock_guard<std::mutex> lk(sh.mu);
    if (sh.cache.find(word, h, out)) return;
  }
  size_t start = out.size();
  encode_uncached(word, out);
  std::lock_guard<std::mutex> lk(sh.mu);
  sh.cache.insert(word, h, out.data() + start, out.size() - start);
}

}  // namespace grpo
