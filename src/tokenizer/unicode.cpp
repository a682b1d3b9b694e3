// UTF-8 helpers; see unicode.h.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>

namespace grpo {

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {
// Expected sequence length for a lead byte (0 = never a lead), and the allowed
// range of the second byte (Unicode Table 3-7: excludes overlongs and surrogates).
struct Lead {
  int len;
  uint8_t lo, hi;
};
Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}
// Number of bytes from s[i] that form a valid (possibly incomplete) prefix.
size_t valid_prefix(std::string_view s, size_t i, int* want) {
  Lead L = lead_info(uint8_t(s[i]));
  *want = L.len;
  if (L.len <= 1) return L.len;
  size_t k = 1;
  for (; k < size_t(L.len) && i + k < s.size(); ++k) {
    uint8_t c = uint8_t(s[i + k]);
    bool ok = (k == 1) ? (c >= L.lo && c <= L.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
  }
  return k;
}
}  // namespace

size_t utf8_seq_len(std::string_view s, size_t i) {
  int want;
  size_t k = valid_prefix(s, i, &want);
  return (want > 0 && k == size_t(want)) ? k : 0;
}

size_t utf8_first_invalid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) { ++i; continue; }
    size_t n = utf8_seq_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

size_t utf8_bad_len(std::string_view s, size_t i, bool at_end_ok) {
  int want;
  size_t k = valid_prefix(s, i, &want);
  if (want == 0) return 1;
  if (at_end_ok && i + k == s.size() && k < size_t(want)) return 0;
  return k;  // the lead plus the continuation bytes that were still valid
}

size_t utf8_append_lossy(std::string& out, std::string_view s, bool hold_incomplete) {
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    while (i < s.size() && uint8_t(s[i]) < 0x80) ++i;  // ASCII fast path
    out.append(s.data() + start, i - start);
    if (i == s.size()) break;
    size_t n = utf8_seq_len(s, i);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
      continue;
    }
    size_t bad = utf8_bad_len(s, i, hold_incomplete);
    if (bad == 0) return i;  // truncated sequence at the end: the caller keeps it
    out.append("\xEF\xBF\xBD");
    i += bad;
  }
  return s.size();
}

namespace {
struct ByteMap {
  std::array<std::string, 256> to_text;
  std::array<int16_t, 324> to_byte;  // code points used are < 256 + 68
  ByteMap() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the rest get 256, 257, ... in
    // byte order (GPT-2's bytes_to_unicode()).
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      int cp = printable ? b : next++;
      utf8_append(to_text[b], uint32_t(cp));
      to_byte[cp] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_text[b]; }

int unicode_to_byte(uint32_t cp) {
  const auto& m = byte_map().to_byte;
  return cp < m.size() ? m[cp] : -1;
}

namespace {
bool normalize_span(std::string_view s, int opts, std::string& out) {
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                    &dst, utf8proc_option_t(opts));
  if (n < 0) return false;
  out.append(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
  return true;
}
}  // namespace

bool unicode_normalize(std::string_view s, NormForm form, std::string& out) {
  if (form == NormForm::none) {
    out.assign(s);
    return true;
  }
  int opts = UTF8PROC_STABLE;
  if (form == NormForm::nfc) opts |= UTF8PROC_COMPOSE;
  if (form == NormForm::nfd) opts |= UTF8PROC_DECOMPOSE;
  if (form == NormForm::nfkc) opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  if (form == NormForm::nfkd) opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  // ASCII is invariant under all four forms, no ASCII pair composes, and an ASCII
  // character is never the second half of a composition. So only each non-ASCII run,
  // together with the one ASCII character before it (a possible base for combining
  // marks), needs the library; text between such spans is copied as is.
  std::string res;
  res.reserve(s.size());
  size_t i = 0, copied = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) { ++i; continue; }
    size_t b = i > copied ? i - 1 : i;  // include the preceding ASCII base
    size_t e = i;
    while (e < s.size() && uint8_t(s[e]) >= 0x80) ++e;
    res.append(s.data() + copied, b - copied);
    if (!normalize_span(s.substr(b, e - b), opts, res)) return false;
    copied = i = e;
  }
  res.append(s.data() + copied, s.size() - copied);
  out.swap(res);
  return true;
}

}  // namespace grpo
