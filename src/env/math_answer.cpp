// Numeric answer parsing and equivalence. Rules are documented in math_answer.h.
#include "env/math_answer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace grpo {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s->find(from, pos)) != std::string::npos) {
    s->replace(pos, from.size(), to);
    pos += to.size();
  }
}

// Index just past the brace that closes the '{' at `open`; npos if unbalanced.
size_t match_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    else if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// If the whole of s is `cmd{...}`, returns the content.
std::optional<std::string> unwrap_command(const std::string& s, std::string_view cmd) {
  if (s.compare(0, cmd.size(), cmd) != 0 || s.size() <= cmd.size() || s[cmd.size()] != '{')
    return std::nullopt;
  size_t end = match_brace(s, cmd.size());
  if (end != s.size()) return std::nullopt;
  return s.substr(cmd.size() + 1, end - cmd.size() - 2);
}

// Replaces every `cmd{X}` by X (text-style commands that only decorate).
void strip_command_everywhere(std::string* s, std::string_view cmd) {
  size_t pos = 0;
  while ((pos = s->find(cmd, pos)) != std::string::npos) {
    size_t open = pos + cmd.size();
    if (open >= s->size() || (*s)[open] != '{') {
      pos = open;
      continue;
    }
    size_t end = match_brace(*s, open);
    if (end == std::string::npos) return;
    std::string inner = s->substr(open + 1, end - open - 2);
    s->replace(pos, end - pos, inner);
  }
}

// Builds a reduced exact Number from a 128-bit ratio; inexact if it does not fit.
Number make_ratio(__int128 num, __int128 den) {
  Number n;
  if (den < 0) num = -num, den = -den;
  __int128 a = num < 0 ? -num : num, b = den;
  while (b != 0) {
    __int128 t = a % b;
    a = b;
    b = t;
  }
  if (a > 1) num /= a, den /= a;
  n.approx = static_cast<long double>(num) / static_cast<long double>(den);
  const __int128 lim = INT64_MAX;
  if (num > lim || num < -lim || den > lim) {
    n.exact = false;
    return n;
  }
  n.num = static_cast<int64_t>(num);
  n.den = static_cast<int64_t>(den);
  return n;
}

Number make_inexact(long double v) {
  Number n;
  n.exact = false;
  n.approx = v;
  return n;
}

Number divide(const Number& a, const Number& b) {
  if (a.exact && b.exact) return make_ratio(static_cast<__int128>(a.num) * b.den, static_cast<__int128>(a.den) * b.num);
  return make_inexact(a.approx / b.approx);
}

bool is_zero(const Number& n) { return n.exact ? n.num == 0 : n.approx == 0; }

// Decimal literal at s[*p]: digits with optional well-formed thousands commas,
// optional fraction ".ddd" (or ".ddd" alone). Advances *p; nullopt if none.
std::optional<Number> parse_literal(std::string_view s, size_t* p) {
  size_t i = *p;
  std::string int_digits, frac_digits;
  while (i < s.size() && is_digit(s[i])) int_digits += s[i++];
  if (!int_digits.empty()) {
    // ",ddd" groups only when exactly three digits follow each comma.
    while (i + 3 < s.size() && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) && is_digit(s[i + 3]) &&
           (i + 4 >= s.size() || !is_digit(s[i + 4]))) {
      int_digits.append(s.substr(i + 1, 3));
      i += 4;
    }
  }
  if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
    ++i;
    while (i < s.size() && is_digit(s[i])) frac_digits += s[i++];
  }
  if (int_digits.empty() && frac_digits.empty()) return std::nullopt;
  *p = i;
  std::string all = int_digits + frac_digits;
  size_t nz = all.find_first_not_of('0');
  size_t sig = nz == std::string::npos ? 0 : all.size() - nz;
  if (sig <= 18 && frac_digits.size() <= 18) {
    __int128 num = 0, den = 1;
    for (char c : all) num = num * 10 + (c - '0');
    for (size_t k = 0; k < frac_digits.size(); ++k) den *= 10;
    return make_ratio(num, den);
  }
  std::string text = (int_digits.empty() ? "0" : int_digits) + "." + frac_digits;
  return make_inexact(std::strtold(text.c_str(), nullptr));
}

std::optional<Number> parse_signed(std::string_view s, size_t* p);

// One brace group {X} or a single character (for \frac12); parsed as a number.
std::optional<Number> parse_frac_arg(std::string_view s, size_t* p) {
  while (*p < s.size() && is_space(s[*p])) ++*p;
  if (*p >= s.size()) return std::nullopt;
  if (s[*p] == '{') {
    size_t end = match_brace(s, *p);
    if (end == std::string_view::npos) return std::nullopt;
    std::string inner = trim(s.substr(*p + 1, end - *p - 2));
    *p = end;
    size_t q = 0;
    auto v = parse_signed(inner, &q);
    if (!v || q != inner.size()) return std::nullopt;
    return v;
  }
  if (!is_digit(s[*p])) return std::nullopt;
  Number n = make_ratio(s[*p] - '0', 1);
  ++*p;
  return n;
}

// Optional sign, then \frac{a}{b} or a literal, then optional "/b" and "^e".
std::optional<Number> parse_signed(std::string_view s, size_t* p) {
  size_t i = *p;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  std::optional<Number> v;
  if (s.substr(i, 5) == "\\frac") {
    i += 5;
    auto a = parse_frac_arg(s, &i);
    if (!a) return std::nullopt;
    auto b = parse_frac_arg(s, &i);
    if (!b || is_zero(*b)) return std::nullopt;
    v = divide(*a, *b);
  } else {
    v = parse_literal(s, &i);
    if (!v) return std::nullopt;
    size_t j = i;
    while (j < s.size() && is_space(s[j])) ++j;
    if (j < s.size() && s[j] == '/') {
      ++j;
      while (j < s.size() && is_space(s[j])) ++j;
      size_t k = j;
      auto d = parse_literal(s, &k);
      if (d) {
        if (is_zero(*d)) return std::nullopt;
        v = divide(*v, *d);
        i = k;
      }
    } else if (j < s.size() && s[j] == '^' && v->exact && v->den == 1) {
      ++j;
      bool brace = j < s.size() && s[j] == '{';
      if (brace) ++j;
      size_t k = j;
      int e = 0;
      while (k < s.size() && is_digit(s[k]) && e <= 62) e = e * 10 + (s[k++] - '0');
      if (k == j || e > 62 || (brace && (k >= s.size() || s[k] != '}'))) return std::nullopt;
      i = brace ? k + 1 : k;
      long double r = std::pow(static_cast<long double>(v->num), e);
      if (std::fabs(r) < 9.0e18L) {
        __int128 acc = 1;
        for (int t = 0; t < e; ++t) acc *= v->num;
        v = make_ratio(acc, 1);
      } else {
        v = make_inexact(r);
      }
    }
  }
  if (neg) {
    v->num = -v->num;
    v->approx = -v->approx;
  }
  *p = i;
  return v;
}

}  // namespace

std::string answer_normalize(std::string_view text) {
  std::string s = trim(text);
  auto strip_trailing_punct = [&s]() {
    while (!s.empty() && (std::string_view(".,;:!?").find(s.back()) != std::string_view::npos || is_space(s.back())))
      s.pop_back();
  };
  // Peel whole-string wrappers (and trailing punctuation after them) until none applies.
  for (bool changed = true; changed;) {
    changed = false;
    strip_trailing_punct();
    for (std::string_view cmd : {"\\boxed", "\\fbox", "\\text", "\\textbf", "\\mathrm", "\\mbox"}) {
      if (auto in = unwrap_command(s, cmd)) {
        s = trim(*in);
        changed = true;
      }
    }
    auto strip_pair = [&](std::string_view open, std::string_view close) {
      if (s.size() >= open.size() + close.size() && s.compare(0, open.size(), open) == 0 &&
          s.compare(s.size() - close.size(), close.size(), close) == 0) {
        s = trim(s.substr(open.size(), s.size() - open.size() - close.size()));
        changed = true;
      }
    };
    strip_pair("$$", "$$");
    strip_pair("\\(", "\\)");
    strip_pair("\\[", "\\]");
    if (s.size() >= 2 && s.front() == '$' && s.back() == '$' && s.find('$', 1) == s.size() - 1) strip_pair("$", "$");
  }
  for (std::string_view cmd : {"\\textbf", "\\textrm", "\\text", "\\mathrm", "\\mathbf", "\\mbox"})
    strip_command_everywhere(&s, cmd);
  static const std::pair<std::string_view, std::string_view> kRepl[] = {
      {"\\$", ""}, {"$", ""}, {"\xE2\x82\xAC", ""} /* € */, {"\xC2\xA3", ""} /* £ */,
      {"\xC2\xA5", ""} /* ¥ */, {"\xE2\x82\xB9", ""} /* ₹ */, {"\\%", "%"}, {"\\,", ""},
      {"\\!", ""}, {"\\;", ""}, {"\\:", ""}, {"\\ ", " "}, {"{,}", ""}, {"~", " "},
      {"\xE2\x88\x92", "-"} /* U+2212 minus */, {"\\left", ""}, {"\\right", ""},
      {"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"}};
  for (const auto& [from, to] : kRepl) replace_all(&s, from, to);
  s = trim(s);
  strip_trailing_punct();
  for (std::string_view cur : {"USD", "EUR", "GBP"}) {
    if (s.compare(0, cur.size(), cur) == 0 && s.size() > cur.size() && (is_space(s[cur.size()]) || is_digit(s[cur.size()])))
      s = trim(s.substr(cur.size()));
  }
  // Leading "x =" / "total=" assignment.
  if (!s.empty() && std::isalpha(static_cast<unsigned char>(s[0]))) {
    size_t i = 0;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    size_t j = i;
    while (j < s.size() && is_space(s[j])) ++j;
    if (j < s.size() && s[j] == '=') s = trim(s.substr(j + 1));
  }
  return s;
}

std::optional<Number> answer_to_number(std::string_view text) {
  std::string s = answer_normalize(text);
  size_t p = 0;
  auto v = parse_signed(s, &p);
  if (!v) return std::nullopt;
  // Rest: optional percent, then unit words without digits.
  std::string_view rest = std::string_view(s).substr(p);
  while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
  if (!rest.empty() && rest.front() == '%') rest.remove_prefix(1);
  for (char c : rest)
    if (is_digit(c)) return std::nullopt;
  if (!rest.empty() && rest.front() == '^') return std::nullopt;  // a power we could not evaluate
  return v;
}

bool numbers_equal(const Number& a, const Number& b) {
  if (a.exact && b.exact) {
    if (a.num == b.num && a.den == b.den) return true;
    auto terminating = [](int64_t d) {
      while (d % 2 == 0) d /= 2;
      while (d % 5 == 0) d /= 5;
      return d == 1;
    };
    if (terminating(a.den) && terminating(b.den)) return false;
  }
  long double m = std::max(std::fabs(a.approx), std::fabs(b.approx));
  return std::fabs(a.approx - b.approx) <= kAnswerRelTol * m;
}

std::string number_render(const Number& n) {
  char buf[64];
  if (!n.exact) {
    std::snprintf(buf, sizeof buf, "%.12Lg", n.approx);
    return buf;
  }
  if (n.den == 1) return std::to_string(n.num);
  int64_t d = n.den;
  int k2 = 0, k5 = 0;
  while (d % 2 == 0) d /= 2, ++k2;
  while (d % 5 == 0) d /= 5, ++k5;
  int k = std::max(k2, k5);
  if (d != 1 || k > 18) return std::to_string(n.num) + "/" + std::to_string(n.den);
  __int128 scale = 1;
  for (int i = 0; i < k; ++i) scale *= 10;
  __int128 v = static_cast<__int128>(n.num < 0 ? -n.num : n.num) * (scale / n.den);
  std::string digits;
  for (__int128 t = v; t > 0; t /= 10) digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(t % 10)));
  while (static_cast<int>(digits.size()) <= k) digits.insert(digits.begin(), '0');
  digits.insert(digits.end() - k, '.');
  return (n.num < 0 ? "-" : "") + digits;
}

std::optional<std::string> last_number_in(std::string_view t) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < t.size()) {
    bool starts = is_digit(t[i]) || (t[i] == '.' && i + 1 < t.size() && is_digit(t[i + 1]));
    if (!starts || (i > 0 && (is_digit(t[i - 1]) || std::isalpha(static_cast<unsigned char>(t[i - 1]))))) {
      ++i;
      continue;
    }
    size_t b = i;
    // A '-' directly before counts as a sign unless it follows a word or number ("3-4").
    if (b > 0 && t[b - 1] == '-' && (b == 1 || !std::isalnum(static_cast<unsigned char>(t[b - 2])))) --b;
    size_t p = i;
    (void)parse_literal(t, &p);
    if (p + 1 < t.size() && t[p] == '/' && is_digit(t[p + 1])) {
      size_t q = p + 1;
      if (parse_literal(t, &q)) p = q;
    }
    last = std::string(t.substr(b, p - b));
    i = p;
  }
  return last;
}

std::optional<std::string> last_boxed_content(std::string_view t) {
  std::vector<std::pair<size_t, size_t>> hits;  // (position, command length)
  for (std::string_view cmd : {"\\boxed", "\\fbox"}) {
    for (size_t pos = t.find(cmd); pos != std::string_view::npos; pos = t.find(cmd, pos + 1))
      hits.push_back({pos, cmd.size()});
  }
  std::sort(hits.begin(), hits.end());
  for (auto it = hits.rbegin(); it != hits.rend(); ++it) {
    size_t open = it->first + it->second;
    while (open < t.size() && t[open] == ' ') ++open;
    if (open >= t.size() || t[open] != '{') continue;
    size_t end = match_brace(t, open);
    if (end == std::string_view::npos) continue;  // truncated box: try an earlier one
    return std::string(t.substr(open + 1, end - open - 2));
  }
  return std::nullopt;
}

bool math_answers_equivalent(std::string_view a, std::string_view b) {
  auto na = answer_to_number(a), nb = answer_to_number(b);
  if (na && nb) return numbers_equal(*na, *nb);
  auto squash = [](std::string_view s) {
    std::string n = answer_normalize(s), out;
    for (char c : n)
      if (!is_space(c)) out += c;
    return out;
  };
  std::string sa = squash(a), sb = squash(b);
  return !sa.empty() && sa == sb;
}

}  // namespace grpo
