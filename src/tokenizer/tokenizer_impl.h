// Internal pieces of the tokenizer pipeline (not part of the public API):
// normalizer steps, pre-tokenizer steps (PCRE2 regex splits, ByteLevel, Metaspace),
// the BPE model with its merge table and cache, and the loaded TokenizerImpl.
// The pipeline is HF's: split out added tokens -> normalize -> pre-tokenize -> BPE.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace grpo {

// Transparent hash for string_view lookups. Deliberately not noexcept: libstdc++ then
// stores each node's hash, so a lookup does not re-hash every key in the bucket chain.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int, StrHash, std::equal_to<>>;

// A PCRE2 pattern compiled with UTF, UCP and JIT (match-invalid-UTF, so any bytes are safe).
class Regex {
 public:
  // literal: the pattern is a plain string (HF's {"String": ...} patterns).
  static Result<std::shared_ptr<Regex>> compile(const std::string& pattern, bool literal);
  ~Regex();
  // Appends [begin, end) of each non-empty match in s, left to right.
  void find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;      // JIT-compiled: matched with pcre2_jit_match (no per-call checks)
};

// Rewrites HF (Oniguruma) regex syntax where PCRE2 differs: \s and \S also cover U+0085.
std::string pcre2_pattern_from_hf(const std::string& hf);

struct NormStep {
  enum Kind { unicode, prepend, replace, strip } kind = unicode;
  NormForm form = NormForm::none;    // unicode
  std::string text;                  // prepend: the prefix; replace: the content
  std::shared_ptr<Regex> re;         // replace
  bool strip_left = false, strip_right = false;
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokStep {
  enum Kind { split, byte_level, metaspace } kind = split;
  std::shared_ptr<Regex> re;         // split; byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;     // byte_level
  std::string replacement;           // metaspace
  int prepend = 0;                   // metaspace: 0 never, 1 first, 2 always
  bool ms_split = true;              // metaspace
};

// Pre-tokens of one text segment: ranges into buf.
struct Pieces {
  std::string buf;
  std::vector<std::pair<uint32_t, uint32_t>> r;  // (begin, end) into buf
  std::vector<uint8_t> first;                    // piece starts at offset 0 of the input
};

struct PreTokenizer {
  std::vector<PreTokStep> steps;
  // Splits `text` (one segment between added tokens) into pre-tokens. at_start: the
  // segment begins at offset 0 of the whole input (Metaspace prepend_scheme "first").
  void run(std::string_view text, bool at_start, Pieces& out, Pieces& tmp) const;
};

// Pre-token -> ids memo for one cache shard: open addressing with linear probing,
// keys and ids in flat arenas (no per-entry allocation, one probe per hit). Grows to
// kMaxSlots, then stops inserting; it is a cache, so that is always correct.
class WordCache {
 public:
  bool find(std::string_view w, uint64_t h, std::vector<int>& out) const;
  void insert(std::string_view w, uint64_t h, const int* ids, size_t n);

 private:
  static constexpr size_t kMaxSlots = size_t(1) << 16;
  struct Slot {
    uint64_t hash = 0;  // 0 = empty
    uint32_t key_off = 0, key_len = 0, ids_off = 0, n_ids = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int> ids_;
  size_t count_ = 0;
  void grow();
};

class BpeModel {
 public:
  StrMap vocab;                  // token (model alphabet) -> id
  StrMap raw_vocab;              // byte-level: token as raw bytes -> id (ignore_merges)
  std::unordered_map<uint64_t, uint64_t> merges;  // (a << 32 | b) -> (rank << 32 | merged id)
  bool byte_level = false, byte_fallback = false, ignore_merges = false, fuse_unk = false;
  int unk_id = -1;
  std::array<int, 256> byte_ids{};  // byte-level: id of the byte's char; fallback: <0xNN>

  // Appends the ids of one pre-token (raw bytes for byte-level models, else UTF-8).
  void encode_word(std::string_view word, std::vector<int>& out) const;
  void merge(std::vector<int>& syms) const;  // applies merges, lowest rank first

 private:
  static constexpr int kShards = 16;
  struct Shard {
    std::mutex mu;
    WordCache cache;
  };
  mutable std::array<Shard, kShards> cache_;
  void encode_uncached(std::string_view word, std::vector<int>& out) const;
};

struct TokenizerImpl {
  std::string source;
  std::vector<NormStep> normalizer;
  PreTokenizer pre;
  BpeModel model;
  std::vector<std::string> id_to_token;   // vocabulary and added tokens
  std::vector<std::string> id_bytes;      // decoded bytes per id
  std::vector<uint8_t> special;           // per id
  int decode_strip_left = 0;              // leading spaces removed from the decoded text
  std::vector<AddedToken> added;
  std::vector<int> prefix_ids, suffix_ids;  // added by encode(add_special_tokens=true)
  std::string bos_token, eos_token, chat_template;
  int bos_id = -1, eos_id = -1;
  bool add_bos = false;
  std::vector<int> eos_ids;

  // Added-token matching: candidates by first byte, longest first.
  std::array<std::vector<int>, 256> added_by_byte;  // indexes into `added`
  bool any_normalized_added = false;

  void finish_added();  // builds added_by_byte; call after `added` is final
  void encode(std::string_view text, bool add_special, std::vector<int>& out) const;
};

}  // namespace grpo
