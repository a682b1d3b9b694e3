// Jinja evaluator: walks the parsed template with jinja2's scoping (a for-loop has
// its own scope, so `set` inside it does not leak out; `namespace()` objects are the
// way out), Python operator semantics and the HF globals raise_exception,
// strftime_now (formats RenderEnv::date_ymd, for reproducible prompts) and namespace.
#include <cmath>
#include <ctime>

#include "tokenizer/jinja.h"

namespace grpo::jinja {

namespace {

bool is_num(const Value& v) { return v.kind == Value::integer || v.kind == Value::floating || v.kind == Value::boolean; }
double dbl(const Value& v) { return v.kind == Value::floating ? v.f : v.kind == Value::integer ? double(v.i) : double(v.b); }
int64_t intv(const Value& v) { return v.kind == Value::integer ? v.i : int64_t(v.b); }

class Evaluator {
 public:
  explicit Evaluator(const RenderEnv& env) : env_(env) { scopes_.emplace_back(); }
  std::string out;

  void exec(const Body& body) {
    for (auto& s : body) exec(*s);
  }

 private:
  const RenderEnv& env_;
  std::vector<std::map<std::string, Value>> scopes_;

  Value lookup(const std::string& n) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    auto g = env_.globals.find(n);
    if (g != env_.globals.end()) return g->second;
    if (n == "namespace" || n == "raise_exception" || n == "strftime_now" || n == "range") return Value::make_func(n);
    return Value();
  }

  void exec(const Stmt& s) {
    switch (s.type) {
      case Stmt::text: out += s.str; break;
      case Stmt::output: out += to_str(eval(*s.expr)); break;
      case Stmt::if_:
        for (auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) { exec(body); break; }
        break;
      case Stmt::set: {
        Value v = eval(*s.expr);
        if (s.targets.size() == 1) { scopes_.back()[s.targets[0]] = std::move(v); break; }
        Value obj = lookup(s.targets[0]);
        if (obj.kind != Value::ns) fail_at(s.line, "cannot set attribute '" + s.targets[1] + "' of a " + kind_name(obj) + " (only namespace objects)");
        for (auto& kv : *obj.d)
          if (kv.first == s.targets[1]) { kv.second = std::move(v); return; }
        obj.d->emplace_back(s.targets[1], std::move(v));
        break;
      }
      case Stmt::for_: exec_for(s); break;
    }
  }

  void exec_for(const Stmt& s) {
    Value seq = eval(*s.expr);
    List items;
    if (seq.kind == Value::list) items = *seq.l;
    else if (seq.kind == Value::dict) for (auto& kv : *seq.d) items.push_back(Value::make_str(kv.first));
    else if (seq.kind == Value::string) items = apply_filter("list", seq, {}, {}, s.line).l ? *apply_filter("list", seq, {}, {}, s.line).l : List{};
    else if (seq.kind != Value::undefined) fail_at(s.line, std::string("cannot loop over a ") + kind_name(seq));
    scopes_.emplace_back();
    auto bind = [&](const Value& item) {
      if (s.targets.size() == 1) { scopes_.back()[s.targets[0]] = item; return; }
      if (item.kind != Value::list || item.l->size() != s.targets.size())
        fail_at(s.line, "cannot unpack a " + std::string(kind_name(item)) + " into " + std::to_string(s.targets.size()) + " loop variables");
      for (size_t k = 0; k < s.targets.size(); ++k) scopes_.back()[s.targets[k]] = (*item.l)[k];
    };
    if (s.filter) {  // `for x in xs if cond`: filter first, so loop.* counts the kept items
      List kept;
      for (auto& it : items) { bind(it); if (truthy(eval(*s.filter))) kept.push_back(it); }
      items.swap(kept);
    }
    const int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      bind(items[k]);
      Dict loop = {{"index0", Value::make_int(k)}, {"index", Value::make_int(k + 1)},
                   {"revindex0", Value::make_int(n - 1 - k)}, {"revindex", Value::make_int(n - k)},
                   {"first", Value::make_bool(k == 0)}, {"last", Value::make_bool(k == n - 1)},
                   {"length", Value::make_int(n)},
                   {"previtem", k > 0 ? items[k - 1] : Value()}, {"nextitem", k + 1 < n ? items[k + 1] : Value()}};
      scopes_.back()["loop"] = Value::make_dict(std::move(loop));
      exec(s.body);
    }
    scopes_.pop_back();
    if (n == 0) exec(s.else_body);
  }

  Value getattr(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::undefined) fail_at(line, "'" + name + "' of an undefined value");
    if (const Value* v = obj.find(name)) return *v;
    return Value();  // jinja2: missing attributes are undefined
  }

  Value getitem(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::undefined) fail_at(line, "indexing an undefined value");
    if (obj.kind == Value::dict || obj.kind == Value::ns) return getattr(obj, to_str(key), line);
    if ((obj.kind == Value::list || obj.kind == Value::string) && key.kind == Value::integer) {
      List l = obj.kind == Value::list ? *obj.l : *apply_filter("list", obj, {}, {}, line).l;
      int64_t i = key.i < 0 ? key.i + int64_t(l.size()) : key.i;
      return i >= 0 && i < int64_t(l.size()) ? l[i] : Value();
    }
    fail_at(line, std::string("cannot index a ") + kind_name(obj) + " with a " + kind_name(key));
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.args[0]);
    if (obj.kind != Value::list && obj.kind != Value::string) fail_at(e.line, std::string("cannot slice a ") + kind_name(obj));
    List l = obj.kind == Value::list ? *obj.l : *apply_filter("list", obj, {}, {}, e.line).l;
    int64_t n = int64_t(l.size());
    auto part = [&](int k, int64_t dflt) { return e.args[k] ? intv(eval(*e.args[k])) : dflt; };
    int64_t step = part(3, 1);
    if (step == 0) fail_at(e.line, "slice step cannot be zero");
    auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { if (v < 0) v += n; return std::max(lo, std::min(hi, v)); };
    int64_t b = e.args[1] ? clamp(part(1, 0), step > 0 ? 0 : -1, step > 0 ? n : n - 1) : (step > 0 ? 0 : n - 1);
    int64_t en = e.args[2] ? clamp(part(2, 0), step > 0 ? 0 : -1, step > 0 ? n : n - 1) : (step > 0 ? n : -1);
    List out;
    for (int64_t i = b; step > 0 ? i < en : i > en; i += step) out.push_back(l[i]);
    if (obj.kind == Value::list) return Value::make_list(std::move(out));
    std::string s;
    for (auto& c : out) s += c.s;
    return Value::make_str(s);
  }

  Value call(const Expr& e) {
    List args;
    KwArgs kw;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    for (auto& [name, x] : e.kwargs) kw.emplace_back(name, eval(*x));
    const Expr& callee = *e.args[0];
    if (callee.type == Expr::getattr) {
      Value obj = eval(*callee.args[0]);
      bool builtin_type = obj.kind == Value::string || obj.kind == Value::dict || obj.kind == Value::list;
      if (!obj.find(callee.op) && builtin_type) return call_method(obj, callee.op, args, kw, e.line);
    }
    Value f = eval(callee);
    if (f.kind != Value::func) fail_at(e.line, std::string("chat template calls a ") + kind_name(f) + ", which is not a supported function");
    if (f.s == "raise_exception") throw TemplateError("chat template raised an exception: " + (args.empty() ? "" : to_str(args[0])));
    if (f.s == "namespace") {
      Value ns = Value::make_dict();
      ns.kind = Value::ns;
      for (auto& [k, v] : kw) ns.d->emplace_back(k, v);
      return ns;
    }
    if (f.s == "range") {
      int64_t b = args.size() > 1 ? intv(args[0]) : 0, en = intv(args.size() > 1 ? args[1] : args.at(0));
      List l;
      for (int64_t i = b; i < en; ++i) l.push_back(Value::make_int(i));
      return Value::make_list(std::move(l));
    }
    // strftime_now(fmt): the date comes from the caller so that prompts are reproducible.
    std::tm tm{};
    if (std::sscanf(env_.date_ymd.c_str(), "%d-%d-%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) != 3)
      fail_at(e.line, "strftime_now needs a date (YYYY-MM-DD), got '" + env_.date_ymd + "'");
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    std::time_t t = timegm(&tm);
    gmtime_r(&t, &tm);  // fills the weekday and day of the year
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, args.empty() ? "" : to_str(args[0]).c_str(), &tm);
    return Value::make_str(std::string(buf, n));
  }

  Value binary(const Expr& e) {
    const std::string& op = e.op;
    if (op == "and") { Value a = eval(*e.args[0]); return truthy(a) ? eval(*e.args[1]) : a; }
    if (op == "or") { Value a = eval(*e.args[0]); return truthy(a) ? a : eval(*e.args[1]); }
    Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (op == "~") return Value::make_str(to_str(a) + to_str(b));
    if (op == "==") return Value::make_bool(equal(a, b));
    if (op == "!=") return Value::make_bool(!equal(a, b));
    if (op == "in" || op == "not in") {
      bool r;
      if (b.kind == Value::string && a.kind == Value::string) r = b.s.find(a.s) != std::string::npos;
      else if (b.kind == Value::list || b.kind == Value::dict) r = apply_test("in", a, {b}, e.line);
      else fail_at(e.line, std::string("'in' needs a string, list or dict on the right, got ") + kind_name(b));
      return Value::make_bool(op == "in" ? r : !r);
    }
    if (a.kind == Value::string && b.kind == Value::string) {
      if (op == "+") return Value::make_str(a.s + b.s);
      if (op == "<") return Value::make_bool(a.s < b.s);
      if (op == ">") return Value::make_bool(a.s > b.s);
      if (op == "<=") return Value::make_bool(a.s <= b.s);
      if (op == ">=") return Value::make_bool(a.s >= b.s);
    }
    if (op == "+" && a.kind == Value::list && b.kind == Value::list) {
      List l = *a.l;
      l.insert(l.end(), b.l->begin(), b.l->end());
      return Value::make_list(std::move(l));
    }
    if (is_num(a) && is_num(b)) {
      bool ints = a.kind != Value::floating && b.kind != Value::floating;
      double x = dbl(a), y = dbl(b);
      if (op == "<") return Value::make_bool(x < y);
      if (op == ">") return Value::make_bool(x > y);
      if (op == "<=") return Value::make_bool(x <= y);
      if (op == ">=") return Value::make_bool(x >= y);
      if (ints && op != "/" && op != "**") {
        int64_t p = intv(a), q = intv(b);
        if ((op == "//" || op == "%") && q == 0) fail_at(e.line, "division by zero");
        if (op == "+") return Value::make_int(p + q);
        if (op == "-") return Value::make_int(p - q);
        if (op == "*") return Value::make_int(p * q);
        int64_t fl = p / q - ((p % q != 0) && ((p < 0) != (q < 0)));  // Python floors
        if (op == "//") return Value::make_int(fl);
        if (op == "%") return Value::make_int(p - fl * q);
      }
      if (op == "+") return Value::make_float(x + y);
      if (op == "-") return Value::make_float(x - y);
      if (op == "*") return Value::make_float(x * y);
      if (op == "/") { if (y == 0) fail_at(e.line, "division by zero"); return Value::make_float(x / y); }
      if (op == "//") return Value::make_float(std::floor(x / y));
      if (op == "**") return ints && intv(b) >= 0 ? Value::make_int(int64_t(std::pow(x, y))) : Value::make_float(std::pow(x, y));
    }
    if (op == "*" && a.kind == Value::string && b.kind == Value::integer) {
      std::string s;
      for (int64_t k = 0; k < b.i; ++k) s += a.s;
      return Value::make_str(s);
    }
    fail_at(e.line, "unsupported operand types for " + op + ": " + kind_name(a) + " and " + kind_name(b));
  }

  Value eval(const Expr& e) {
    switch (e.type) {
      case Expr::literal: return e.lit;
      case Expr::name: return lookup(e.op);
      case Expr::getattr: return getattr(eval(*e.args[0]), e.op, e.line);
      case Expr::getitem: return getitem(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::slice: return slice(e);
      case Expr::call: return call(e);
      case Expr::filter: case Expr::test: {
        Value in = eval(*e.args[0]);
        List args;
        KwArgs kw;
        for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        for (auto& [name, x] : e.kwargs) kw.emplace_back(name, eval(*x));
        if (e.type == Expr::test) return Value::make_bool(apply_test(e.op, in, args, e.line));
        return apply_filter(e.op, in, args, kw, e.line);
      }
      case Expr::unary: {
        Value v = eval(*e.args[0]);
        if (e.op == "not") return Value::make_bool(!truthy(v));
        if (!is_num(v)) fail_at(e.line, "unary " + e.op + " on a " + kind_name(v));
        if (e.op == "+") return v;
        return v.kind == Value::floating ? Value::make_float(-v.f) : Value::make_int(-intv(v));
      }
      case Expr::binary: return binary(e);
      case Expr::cond: return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : (e.args.size() > 2 ? eval(*e.args[2]) : Value());
      case Expr::list_lit: {
        List l;
        for (auto& x : e.args) l.push_back(eval(*x));
        return Value::make_list(std::move(l));
      }
      case Expr::dict_lit: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) d.emplace_back(to_str(eval(*e.args[k])), eval(*e.args[k + 1]));
        return Value::make_dict(std::move(d));
      }
    }
    fail_at(e.line, "bad expression");
  }
};

}  // namespace

std::string render(const Body& body, const RenderEnv& env) {
  Evaluator ev(env);
  ev.exec(body);
  return std::move(ev.out);
}

}  // namespace grpo::jinja
