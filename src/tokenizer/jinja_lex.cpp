// Jinja subset lexer: splits template source into text and tag tokens, applying
// jinja2's whitespace rules as HF configures them (trim_blocks: drop the newline after
// a block tag; lstrip_blocks: drop spaces before a block tag at a line start; "-"
// markers strip all whitespace on that side), after newline normalization and dropping
// one trailing newline (keep_trailing_newline=False).
#include <cstring>

#include "tokenizer/jinja_lex.h"
#include "tokenizer/unicode.h"

namespace grpo::jinja {

namespace {

[[noreturn]] void fail(int line, const std::string& msg) {
  throw TemplateError("chat template: " + msg + " at line " + std::to_string(line));
}

int line_of(const std::string& src, size_t pos) {
  int l = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) l += src[k] == '\n';
  return l;
}

std::string unescape(const std::string& s, int line) {  // Python unicode-escape
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\\' || k + 1 == s.size()) { out += s[k]; continue; }
    char c = s[++k];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '0': out += '\0'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': case '\'': case '"': out += c; break;
      case 'x': case 'u': case 'U': {
        size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (k + n >= s.size()) fail(line, "truncated \\" + std::string(1, c) + " escape");
        utf8_append(out, uint32_t(std::stoul(s.substr(k + 1, n), nullptr, 16)));
        k += n;
        break;
      }
      case '\n': break;
      default: out += '\\'; out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<Tok> lex(std::string src) {
  // jinja2 normalizes newlines to \n and drops one trailing newline (keep_trailing_newline=False).
  std::string norm;
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') { norm += '\n'; if (k + 1 < src.size() && src[k + 1] == '\n') ++k; }
    else norm += src[k];
  }
  if (!norm.empty() && norm.back() == '\n') norm.pop_back();
  src.swap(norm);
  std::vector<Tok> toks;
  size_t pos = 0;
  bool strip_next = false;  // the previous tag ended with '-'
  while (pos < src.size()) {
    size_t q = pos;
    while ((q = src.find('{', q)) != std::string::npos && (q + 1 >= src.size() || !std::strchr("{%#", src[q + 1]))) ++q;
    size_t text_end = q == std::string::npos ? src.size() : q;
    std::string text = src.substr(pos, text_end - pos);
    if (strip_next) text.erase(0, text.find_first_not_of(" \t\n\r\f\v") == std::string::npos ? text.size() : text.find_first_not_of(" \t\n\r\f\v"));
    strip_next = false;
    if (q != std::string::npos) {
      char kind = src[q + 1];
      char mod = q + 2 < src.size() ? src[q + 2] : 0;
      if (mod == '-') {
        size_t e = text.find_last_not_of(" \t\n\r\f\v");
        text.erase(e == std::string::npos ? 0 : e + 1);
      } else if (kind != '{' && mod != '+') {  // lstrip_blocks: only whitespace since the line start
        size_t l = text.rfind('\n');
        size_t from = l == std::string::npos ? 0 : l + 1;
        bool line_start = l != std::string::npos || pos == 0 || src[pos - 1] == '\n';
        if (line_start && text.find_first_not_of(" \t\r\f\v", from) == std::string::npos) text.erase(from);
      }
    }
    if (!text.empty()) toks.push_back({Tok::text, text, 0, 0, line_of(src, pos)});
    if (q == std::string::npos) break;
    char kind = src[q + 1];
    int line = line_of(src, q);
    pos = q + 2;
    if (pos < src.size() && (src[pos] == '-' || src[pos] == '+')) ++pos;
    bool block = kind != '{';
    if (kind == '#') {
      size_t e = src.find("#}", pos);
      if (e == std::string::npos) fail(line, "unterminated comment");
      strip_next = e > pos && src[e - 1] == '-';
      pos = e + 2;
      if (!strip_next && pos < src.size() && src[pos] == '\n') ++pos;  // trim_blocks
      continue;
    }
    toks.push_back({block ? Tok::block_begin : Tok::var_begin, "", 0, 0, line});
    const char* close = block ? "%}" : "}}";
    for (;;) {
      while (pos < src.size() && std::strchr(" \t\n\r", src[pos])) ++pos;
      if (pos >= src.size()) fail(line, std::string("unterminated ") + (block ? "{% tag" : "{{ tag"));
      int tl = line_of(src, pos);
      if (src.compare(pos, 2, close) == 0 || (src[pos] == '-' && src.compare(pos + 1, 2, close) == 0)) {
        strip_next = src[pos] == '-';
        pos += strip_next ? 3 : 2;
        if (block && !strip_next && pos < src.size() && src[pos] == '\n') ++pos;  // trim_blocks
        toks.push_back({block ? Tok::block_end : Tok::var_end, "", 0, 0, tl});
        break;
      }
      char c = src[pos];
      if (std::isalpha(uint8_t(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() && (std::isalnum(uint8_t(src[e])) || src[e] == '_')) ++e;
        toks.push_back({Tok::name, src.substr(pos, e - pos), 0, 0, tl});
        pos = e;
      } else if (std::isdigit(uint8_t(c))) {
        size_t e = pos;
        while (e < src.size() && (std::isdigit(uint8_t(src[e])) || src[e] == '_')) ++e;
        bool is_float = e + 1 < src.size() && src[e] == '.' && std::isdigit(uint8_t(src[e + 1]));
        if (is_float) { ++e; while (e < src.size() && std::isdigit(uint8_t(src[e]))) ++e; }
        std::string num = src.substr(pos, e - pos);
        Tok t{is_float ? Tok::num_float : Tok::num_int, num, 0, 0, tl};
        if (is_float) t.f = std::stod(num); else t.i = std::stoll(num);
        toks.push_back(t);
        pos = e;
      } else if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < src.size() && src[e] != c) e += src[e] == '\\' ? 2 : 1;
        if (e >= src.size()) fail(tl, "unterminated string");
        toks.push_back({Tok::str, unescape(src.substr(pos + 1, e - pos - 1), tl), 0, 0, tl});
        pos = e + 1;
      } else {
        static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string o(1, c);
        for (const char* t : two) if (src.compare(pos, 2, t) == 0) o = t;
        if (o.size() == 1 && !std::strchr("+-*/%~<>()[]{}.,:|=", c)) fail(tl, std::string("unexpected character '") + c + "'");
        toks.push_back({Tok::op, o, 0, 0, tl});
        pos += o.size();
      }
    }
  }
  toks.push_back({Tok::eof, "", 0, 0, line_of(src, src.size())});
  return toks;
}


}  // namespace grpo::jinja
