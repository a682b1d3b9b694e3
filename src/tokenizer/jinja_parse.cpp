// Jinja subset parser: recursive descent over jinja_lex.cpp's tokens, with jinja2's precedence:
// cond-expr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < filters/tests.
#include <cstring>

#include "tokenizer/jinja_lex.h"

namespace grpo::jinja {

namespace {

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
    if (!is_op(o)) fail_at(peek().line, std::string("expected '") + o + "'" + got());
    next();
  }
  std::string got() const { return peek().s.empty() ? "" : " but found '" + peek().s + "'"; }
  void expect(Tok::Kind k, const char* what) {
    if (peek().kind != k) fail_at(peek().line, std::string("expected ") + what + got());
    next();
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) fail_at(peek().line, "expected a name" + got());
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
        if (!ends.empty()) fail_at(tk.line, "missing {% " + ends.back() + " %}");
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
      if (!is_name("in")) fail_at(peek().line, "expected 'in'" + got());
      next();
      s->expr = parse_or();
      if (is_name("if")) { next(); s->filter = parse_or(); }
      if (is_name("recursive")) fail_at(line, "chat template uses unsupported recursive for-loop");
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
      if (!is_op("=")) fail_at(line, "chat template uses unsupported block or tuple {% set %}");
      next();
      s->expr = parse_expr();
    } else {
      fail_at(line, "chat template uses unsupported {% " + kw + " %}");
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
          if (is_op(",")) fail_at(t.line, "chat template uses unsupported tuple literal");
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
    fail_at(t.line, "unexpected '" + t.s + "' in expression");
  }
};

}  // namespace

Body parse_template(const std::string& src) { return Parser(lex(src)).parse_all(); }

}  // namespace grpo::jinja
