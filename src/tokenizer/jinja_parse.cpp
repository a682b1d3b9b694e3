// Jinja subset: lexer (with HF's trim_blocks + lstrip_blocks whitespace rules, as
// jinja2 applies them) and recursive-descent parser with jinja2's precedence:
// cond-expr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < filters/tests.
#include <cstring>

#include "tokenizer/jinja.h"
#include "tokenizer/unicode.h"

namespace grpo::jinja {

namespace {

struct Tok {
  enum Kind { text, var_begin, var_end, block_begin, block_end, name, str, num_int, num_float, op, eof } kind;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

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

class Parser {
 public:
  explicit Parser(std::vector<Tok> t) : t_(std::move(t)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  std::vector<Tok> t_;
  size_t p_ = 0;

  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Tok& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(const char* o, size_t k = 0) const { return peek(k).kind == Tok::op && peek(k).s == o; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).kind == Tok::name && peek(k).s == n; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(peek().line, std::string("expected '") + o + "'" + got());
    next();
  }
  std::string got() const { return peek().s.empty() ? "" : " but found '" + peek().s + "'"; }
  void expect(Tok::Kind k, const char* what) {
    if (peek().kind != k) fail(peek().line, std::string("expected ") + what + got());
    next();
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) fail(peek().line, "expected a name" + got());
    return next().s;
  }

  static ExprPtr node(Expr::Type ty, int line, std::string op = {}) {
    auto e = std::make_unique<Expr>();
    e->type = ty;
    e->line = line;
    e->op = std::move(op);
    return e;
  }

  // Parses statements until a block tag whose keyword is in `ends` (left unconsumed
  // after its name; *end receives the keyword) or the end of the template.
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    Body body;
    for (;;) {
      const Tok& tk = peek();
      if (tk.kind == Tok::eof) {
        if (!ends.empty()) fail(tk.line, "missing {% " + ends.back() + " %}");
        return body;
      }
      if (tk.kind == Tok::text) {
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::text;
        s->str = next().s;
        body.push_back(std::move(s));
        continue;
      }
      if (tk.kind == Tok::var_begin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::output;
        s->line = tk.line;
        s->expr = parse_expr();
        expect(Tok::var_end, "'}}'");
        body.push_back(std::move(s));
        continue;
      }
      expect(Tok::block_begin, "a tag");
      int line = peek().line;
      std::string kw = expect_name();
      for (auto& e : ends)
        if (e == kw) { *end = kw; return body; }
      body.push_back(parse_stmt(kw, line));
    }
  }

  std::unique_ptr<Stmt> parse_stmt(const std::string& kw, int line) {
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string end;
    if (kw == "if") {
      s->type = Stmt::if_;
      ExprPtr cond = parse_expr();
      for (;;) {
        expect(Tok::block_end, "'%}'");
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "endif") break;
        cond = end == "elif" ? parse_expr() : nullptr;
        if (end == "else") {
          expect(Tok::block_end, "'%}'");
          s->branches.emplace_back(nullptr, parse_body({"endif"}, &end));
          break;
        }
      }
    } else if (kw == "for") {
      s->type = Stmt::for_;
      s->targets.push_back(expect_name());
      while (is_op(",")) { next(); s->targets.push_back(expect_name()); }
      if (!is_name("in")) fail(peek().line, "expected 'in'" + got());
      next();
      s->expr = parse_or();
      if (is_name("if")) { next(); s->filter = parse_or(); }
      if (is_name("recursive")) fail(line, "chat template uses unsupported recursive for-loop");
      expect(Tok::block_end, "'%}'");
      s->body = parse_body({"else", "endfor"}, &end);
      if (end == "else") {
        expect(Tok::block_end, "'%}'");
        s->else_body = parse_body({"endfor"}, &end);
      }
    } else if (kw == "set") {
      s->type = Stmt::set;
      s->targets.push_back(expect_name());
      if (is_op(".")) { next(); s->targets.push_back(expect_name()); }
      if (!is_op("=")) fail(line, "chat template uses unsupported block or tuple {% set %}");
      next();
      s->expr = parse_expr();
    } else {
      fail(line, "chat template uses unsupported {% " + kw + " %}");
    }
    expect(Tok::block_end, "'%}'");
    return s;
  }

  ExprPtr parse_expr() {  // conditional expression
    ExprPtr e = parse_or();
    if (!is_name("if")) return e;
    int line = next().line;
    auto c = node(Expr::cond, line);
    c->args.push_back(parse_or());
    c->args.push_back(std::move(e));
    if (is_name("else")) { next(); c->args.push_back(parse_expr()); }
    return c;
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = node(Expr::binary, line, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) { int l = next().line; e = binary("or", std::move(e), parse_and(), l); }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) { int l = next().line; e = binary("and", std::move(e), parse_not(), l); }
    return e;
  }
  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    auto e = node(Expr::unary, next().line, "not");
    e->args.push_back(parse_not());
    return e;
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    for (;;) {
      int l = peek().line;
      if (peek().kind == Tok::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                     peek().s == "<=" || peek().s == ">=")) {
        std::string op = next().s;
        e = binary(op, std::move(e), parse_math1(), l);
      } else if (is_name("in")) {
        next();
        e = binary("in", std::move(e), parse_math1(), l);
      } else if (is_name("not") && is_name("in", 1)) {
        next(), next();
        e = binary("not in", std::move(e), parse_math1(), l);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) { auto& t = next(); e = binary(t.s, std::move(e), parse_concat(), t.line); }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) { int l = next().line; e = binary("~", std::move(e), parse_math2(), l); }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto& t = next();
      e = binary(t.s, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) { int l = next().line; e = binary("**", std::move(e), parse_unary(), l); }
    return e;
  }
  ExprPtr parse_unary() {
    if (is_op("-") || is_op("+")) {
      auto& t = next();
      auto e = node(Expr::unary, t.line, t.s);
      e->args.push_back(parse_unary());
      return parse_filters(std::move(e));
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        e.args.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }
  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      int l = peek().line;
      if (is_op(".")) {
        next();
        auto g = node(Expr::getattr, l, expect_name());
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        next();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && is_op(":")) { next(); slice = true; continue; }
          break;
        }
        expect_op("]");
        auto g = node(slice ? Expr::slice : Expr::getitem, l);
        g->args.push_back(std::move(e));
        for (int k = 0; k < (slice ? 3 : 1); ++k) g->args.push_back(std::move(parts[k]));
        e = std::move(g);
      } else if (is_op("(")) {
        auto c = node(Expr::call, l);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      int l = peek().line;
      if (is_op("|")) {
        next();
        auto f = node(Expr::filter, l, expect_name());
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        bool negate = is_name("not") ? (next(), true) : false;
        auto t = node(Expr::test, l, expect_name());
        t->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*t);
        else if (peek().kind == Tok::str || peek().kind == Tok::num_int || peek().kind == Tok::num_float)
          t->args.push_back(parse_primary());
        e = std::move(t);
        if (negate) {
          auto n = node(Expr::unary, l, "not");
          n->args.push_back(std::move(e));
          e = std::move(n);
        }
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_primary() {
    const Tok& t = next();
    auto lit = [&](Value v) { auto e = node(Expr::literal, t.line); e->lit = std::move(v); return e; };
    switch (t.kind) {
      case Tok::str: {
        std::string s = t.s;
        while (peek().kind == Tok::str) s += next().s;  // adjacent literals concatenate
        return lit(Value::make_str(s));
      }
      case Tok::num_int: return lit(Value::make_int(t.i));
      case Tok::num_float: return lit(Value::make_float(t.f));
      case Tok::name:
        if (t.s == "true" || t.s == "True") return lit(Value::make_bool(true));
        if (t.s == "false" || t.s == "False") return lit(Value::make_bool(false));
        if (t.s == "none" || t.s == "None") return lit(Value::make_none());
        return node(Expr::name, t.line, t.s);
      case Tok::op:
        if (t.s == "(") {
          ExprPtr e = parse_expr();
          if (is_op(",")) fail(t.line, "chat template uses unsupported tuple literal");
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          auto e = node(Expr::list_lit, t.line);
          while (!is_op("]")) { e->args.push_back(parse_expr()); if (!is_op("]")) expect_op(","); }
          next();
          return e;
        }
        if (t.s == "{") {
          auto e = node(Expr::dict_lit, t.line);
          while (!is_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    fail(t.line, "unexpected '" + t.s + "' in expression");
  }
};

}  // namespace

Body parse_template(const std::string& src) { return Parser(lex(src)).parse_all(); }

}  // namespace grpo::jinja
