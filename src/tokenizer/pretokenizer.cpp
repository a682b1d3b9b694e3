// Pre-tokenizer steps (HF semantics): PCRE2 regex splits with the five split
// behaviours, ByteLevel (optional prefix space + GPT-2 regex) and Metaspace.
// HF compiles its patterns with Oniguruma; PCRE2 with UTF+UCP agrees on \p{..}
// classes and case folding, and pcre2_pattern_from_hf() patches the one known
// difference (\s in Oniguruma is White_Space, which includes U+0085).
#include <pcre2.h>

#include "core/check.h"
#include "tokenizer/tokenizer_impl.h"

namespace grpo {

std::string pcre2_pattern_from_hf(const std::string& hf) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < hf.size(); ++i) {
    char c = hf[i];
    if (c == '\\' && i + 1 < hf.size()) {
      char n = hf[++i];
      if (n == 's') out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (n == 'S' && !in_class) out += "[^\\s\\x{85}]";
      else { out += c; out += n; }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < hf.size() && hf[i + 1] == '^') out += hf[++i];
      if (i + 1 < hf.size() && hf[i + 1] == ']') out += hf[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < hf.size() && hf[i + 1] == ':') {  // [:posix:]
      size_t e = hf.find(":]", i + 2);
      if (e != std::string::npos) { out.append(hf, i, e + 2 - i); i = e + 1; continue; }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Result<std::shared_ptr<Regex>> Regex::compile(const std::string& pattern, bool literal) {
  std::string p = literal ? pattern : pcre2_pattern_from_hf(pattern);
  // PCRE2_LITERAL does not combine with PCRE2_UCP (which only matters for classes anyway).
  uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    return error_status("regex '" + pattern + "' does not compile at offset " + std::to_string(off) + ": " +
                        reinterpret_cast<char*>(buf));
  }
  // Without JIT pcre2_match() still works (slower); JIT can be missing on some builds.
  bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  std::shared_ptr<Regex> re(new Regex());
  re->pattern_ = pattern;
  re->code_ = code;
  re->jit_ = jit;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

namespace {
// Per-thread match state: one match data block and a JIT stack large enough for
// backtracking over long whitespace runs (\s+(?!\S) on megabyte inputs).
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(mctx, nullptr, stack); }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
};
}  // namespace

void Regex::find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  thread_local MatchState st;
  auto* code = static_cast<pcre2_code*>(code_);
  auto subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  PCRE2_SIZE pos = 0;
  while (pos < s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subj, s.size(), pos, 0, st.md, st.mctx)
                  : pcre2_match(code, subj, s.size(), pos, 0, st.md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    GRPO_CHECK_MSG(rc >= 0, "pcre2_match failed (e.g. JIT stack exhausted)");
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    if (ov[1] == ov[0]) {  // empty match: HF drops it; step over one character
      size_t n = utf8_seq_len(s, ov[0]);
      pos = ov[0] + (n ? n : 1);
      continue;
    }
    out.emplace_back(uint32_t(ov[0]), uint32_t(ov[1]));
    pos = ov[1];
  }
}

namespace {
using Range = std::pair<uint32_t, uint32_t>;

// Splits piece [b, e) of p.buf by the regex matches and appends the resulting pieces to
// out (which shares p.buf), following HF's SplitDelimiterBehavior.
void split_piece(const Pieces& p, size_t k, const PreTokStep& st, std::vector<Range>& matches, Pieces& out) {
  auto [b, e] = p.r[k];
  matches.clear();
  st.re->find_all(std::string_view(p.buf).substr(b, e - b), matches);
  std::vector<std::pair<Range, bool>> segs;  // (range, is_match) covering [b, e)
  uint32_t at = 0;
  for (auto [mb, me] : matches) {
    if (mb > at) segs.push_back({{b + at, b + mb}, st.invert});
    segs.push_back({{b + mb, b + me}, !st.invert});
    at = me;
  }
  if (b + at < e) segs.push_back({{b + at, e}, st.invert});
  size_t first_out = out.r.size();
  bool prev_match = false;
  int64_t carry = -1;  // merged_with_next: start of a match waiting for its next piece
  for (size_t i = 0; i < segs.size(); ++i) {
    auto [rg, is_match] = segs[i];
    bool have = out.r.size() > first_out;
    bool extend = false;
    switch (st.behavior) {
      case SplitBehavior::removed: if (is_match) { prev_match = true; continue; } break;
      case SplitBehavior::isolated: break;
      case SplitBehavior::merged_with_previous: extend = is_match && !prev_match && have; break;
      case SplitBehavior::merged_with_next:
        if (is_match && i + 1 < segs.size() && !segs[i + 1].second) { carry = rg.first; continue; }
        if (carry >= 0) { rg.first = uint32_t(carry); carry = -1; }
        break;
      case SplitBehavior::contiguous: extend = is_match == prev_match && have; break;
    }
    if (extend) out.r.back().second = rg.second;
    else { out.r.push_back(rg); out.first.push_back(p.first[k] && rg.first == b); }
    prev_match = is_match;
  }
}
}  // namespace

void PreTokenizer::run(std::string_view text, bool at_start, Pieces& out, Pieces& tmp) const {
  out.buf.assign(text);
  out.r.clear();
  out.first.clear();
  if (!text.empty()) { out.r.push_back({0, uint32_t(text.size())}); out.first.push_back(at_start); }
  thread_local std::vector<Range> matches;
  for (const PreTokStep& st : steps) {
    bool rebuild = (st.kind == PreTokStep::byte_level && st.add_prefix_space) || st.kind == PreTokStep::metaspace;
    if (rebuild) {  // the step edits text: copy each piece into a new buffer
      tmp.buf.clear();
      tmp.r.clear();
      tmp.first.clear();
      for (size_t k = 0; k < out.r.size(); ++k) {
        std::string_view s = std::string_view(out.buf).substr(out.r[k].first, out.r[k].second - out.r[k].first);
        uint32_t b = uint32_t(tmp.buf.size());
        if (st.kind == PreTokStep::byte_level) {
          if (s.front() != ' ') tmp.buf += ' ';
          tmp.buf += s;
        } else {
          std::string piece;
          for (char c : s) (c == ' ') ? void(piece += st.replacement) : void(piece += c);
          bool pre = st.prepend == 2 || (st.prepend == 1 && out.first[k]);
          if (pre && piece.compare(0, st.replacement.size(), st.replacement) != 0) tmp.buf += st.replacement;
          tmp.buf += piece;
        }
        tmp.r.push_back({b, uint32_t(tmp.buf.size())});
        tmp.first.push_back(out.first[k]);
      }
      std::swap(out, tmp);
    }
    if (st.kind == PreTokStep::metaspace && st.ms_split) {  // each replacement starts a piece
      tmp.r.clear();
      tmp.first.clear();
      const std::string& rep = st.replacement;
      for (size_t k = 0; k < out.r.size(); ++k) {
        auto [b, e] = out.r[k];
        uint32_t start = b;
        for (size_t pos = out.buf.find(rep, b + 1); pos != std::string::npos && pos < e; pos = out.buf.find(rep, pos + 1)) {
          tmp.r.push_back({start, uint32_t(pos)});
          tmp.first.push_back(out.first[k] && start == b);
          start = uint32_t(pos);
        }
        tmp.r.push_back({start, e});
        tmp.first.push_back(out.first[k] && start == b);
      }
      out.r.swap(tmp.r);
      out.first.swap(tmp.first);
    } else if (st.re) {  // ranges are re-cut; the buffer stays
      tmp.r.clear();
      tmp.first.clear();
      for (size_t k = 0; k < out.r.size(); ++k) split_piece(out, k, st, matches, tmp);
      out.r.swap(tmp.r);
      out.first.swap(tmp.first);
    }
  }
}

}  // namespace grpo
