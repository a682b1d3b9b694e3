// Jinja builtins used by chat templates: filters, tests, and Python str/dict methods.
// Semantics follow jinja2 + Python (e.g. `length` counts code points, `trim` and
// str.strip() strip Unicode whitespace). Unknown names are errors, not no-ops.
#include <algorithm>

#include "tokenizer/jinja.h"
#include "tokenizer/unicode.h"

namespace grpo::jinja {

void fail_at(int line, const std::string& msg) {
  throw TemplateError("chat template: " + msg + " at line " + std::to_string(line));
}

namespace {

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_seq_len(s, i);
    if (n == 0) { cps.push_back(0xFFFD); ++i; continue; }
    uint32_t cp = uint8_t(s[i]) & (n == 1 ? 0x7F : n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    cps.push_back(cp);
    i += n;
  }
  return cps;
}
std::string from_cps(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) utf8_append(out, cps[k]);
  return out;
}
bool py_space(uint32_t c) {  // Python str.isspace()
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// Python str.strip/lstrip/rstrip with an optional set of characters.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = code_points(s);
  std::vector<uint32_t> set;
  bool ws = !chars || chars->kind == Value::none || chars->kind == Value::undefined;
  if (!ws) set = code_points(chars->s);
  auto strip_it = [&](uint32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}
const Value& arg(const List& a, size_t k, int line, const char* what) {
  if (k >= a.size()) fail_at(line, std::string("missing argument to ") + what);
  return a[k];
}
const Value* kwarg(const KwArgs& kw, const char* name) {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}
const std::string& str_arg(const List& a, size_t k, int line, const char* what) {
  const Value& v = arg(a, k, line, what);
  if (v.kind != Value::string) fail_at(line, std::string(what) + " expects a string argument, got " + kind_name(v));
  return v.s;
}
List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::list: return *v.l;
    case Value::dict: { List l; for (auto& kv : *v.d) l.push_back(Value::make_str(kv.first)); return l; }
    case Value::string: { List l; auto c = code_points(v.s); for (size_t k = 0; k < c.size(); ++k) l.push_back(Value::make_str(from_cps(c, k, k + 1))); return l; }
    case Value::undefined: return {};
    default: fail_at(line, std::string("cannot iterate over a ") + kind_name(v));
  }
}
std::string lower(std::string s) { for (char& c : s) c = char(std::tolower(uint8_t(c))); return s; }
std::string upper(std::string s) { for (char& c : s) c = char(std::toupper(uint8_t(c))); return s; }
std::string replace_all(std::string s, const std::string& a, const std::string& b, int64_t count) {
  if (a.empty()) return s;
  for (size_t p = s.find(a); p != std::string::npos && count != 0; p = s.find(a, p + b.size()), --count) s.replace(p, a.size(), b);
  return s;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& in, const List& args, const KwArgs& kw, int line) {
  if (name == "trim") return Value::make_str(py_strip(to_str(in), args.empty() ? nullptr : &args[0], true, true));
  if (name == "length" || name == "count") {
    if (in.kind == Value::string) return Value::make_int(int64_t(code_points(in.s).size()));
    if (in.kind == Value::undefined) return Value::make_int(0);
    return Value::make_int(int64_t(iterate(in, line).size()));
  }
  if (name == "tojson") {
    const Value* ind = kwarg(kw, "indent");
    if (!ind && !args.empty()) ind = &args[0];
    return Value::make_str(to_json(in, ind && ind->kind == Value::integer ? int(ind->i) : 0));
  }
  if (name == "string") return Value::make_str(to_str(in));
  if (name == "safe") return in;
  if (name == "lower") return Value::make_str(lower(to_str(in)));
  if (name == "upper") return Value::make_str(upper(to_str(in)));
  if (name == "capitalize") { std::string s = lower(to_str(in)); if (!s.empty()) s[0] = char(std::toupper(uint8_t(s[0]))); return Value::make_str(s); }
  if (name == "replace") return Value::make_str(replace_all(to_str(in), str_arg(args, 0, line, "replace"), str_arg(args, 1, line, "replace"), -1));
  if (name == "first" || name == "last") {
    List l = iterate(in, line);
    if (l.empty()) return Value();
    return name == "first" ? l.front() : l.back();
  }
  if (name == "list") return Value::make_list(iterate(in, line));
  if (name == "join") {
    std::string sep = args.empty() ? "" : to_str(args[0]), out;
    List l = iterate(in, line);
    for (size_t k = 0; k < l.size(); ++k) out += (k ? sep : "") + to_str(l[k]);
    return Value::make_str(out);
  }
  if (name == "default" || name == "d") {
    bool boolean = (args.size() > 1 && truthy(args[1])) || (kwarg(kw, "boolean") && truthy(*kwarg(kw, "boolean")));
    bool use_default = in.kind == Value::undefined || (boolean && !truthy(in));
    return use_default ? (args.empty() ? Value::make_str("") : args[0]) : in;
  }
  if (name == "items") {
    if (in.kind != Value::dict) fail_at(line, std::string("items filter needs a dict, got ") + kind_name(in));
    List l;
    for (auto& [k, v] : *in.d) l.push_back(Value::make_list({Value::make_str(k), v}));
    return Value::make_list(std::move(l));
  }
  if (name == "select" || name == "reject") {
    const std::string& test = str_arg(args, 0, line, name.c_str());
    List rest(args.begin() + 1, args.end()), out;
    for (auto& x : iterate(in, line))
      if (apply_test(test, x, rest, line) == (name == "select")) out.push_back(x);
    return Value::make_list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    const std::string& attr = str_arg(args, 0, line, name.c_str());
    List rest(args.size() > 2 ? args.begin() + 2 : args.end(), args.end()), out;
    for (auto& x : iterate(in, line)) {
      const Value* a = x.find(attr);
      Value av = a ? *a : Value();
      bool ok = args.size() > 1 ? apply_test(str_arg(args, 1, line, name.c_str()), av, rest, line) : truthy(av);
      if (ok == (name == "selectattr")) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value* attr = kwarg(kw, "attribute");
    for (auto& x : iterate(in, line)) {
      if (attr) { const Value* a = x.find(to_str(*attr)); out.push_back(a ? *a : Value()); }
      else out.push_back(apply_filter(str_arg(args, 0, line, "map"), x, List(args.begin() + 1, args.end()), {}, line));
    }
    return Value::make_list(std::move(out));
  }
  if (name == "int") {
    if (in.kind == Value::integer) return in;
    if (in.kind == Value::floating) return Value::make_int(int64_t(in.f));
    try { return Value::make_int(std::stoll(to_str(in))); } catch (...) { return Value::make_int(0); }
  }
  if (name == "float") {
    if (in.kind == Value::floating) return in;
    if (in.kind == Value::integer) return Value::make_float(double(in.i));
    try { return Value::make_float(std::stod(to_str(in))); } catch (...) { return Value::make_float(0); }
  }
  if (name == "abs") return in.kind == Value::floating ? Value::make_float(std::abs(in.f)) : Value::make_int(std::abs(in.i));
  fail_at(line, "chat template uses unsupported filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const List& args, int line) {
  using K = Value::Kind;
  if (name == "defined") return v.kind != K::undefined;
  if (name == "undefined") return v.kind == K::undefined;
  if (name == "none") return v.kind == K::none;
  if (name == "string") return v.kind == K::string;
  if (name == "number") return v.kind == K::integer || v.kind == K::floating || v.kind == K::boolean;
  if (name == "integer") return v.kind == K::integer;
  if (name == "float") return v.kind == K::floating;
  if (name == "boolean") return v.kind == K::boolean;
  if (name == "true") return v.kind == K::boolean && v.b;
  if (name == "false") return v.kind == K::boolean && !v.b;
  if (name == "mapping") return v.kind == K::dict;
  if (name == "iterable") return v.kind == K::list || v.kind == K::dict || v.kind == K::string || v.kind == K::undefined;
  if (name == "sequence") return v.kind == K::list || v.kind == K::dict || v.kind == K::string;
  if (name == "callable") return v.kind == K::func;
  if (name == "equalto" || name == "eq" || name == "==") return equal(v, arg(args, 0, line, name.c_str()));
  if (name == "ne" || name == "!=") return !equal(v, arg(args, 0, line, name.c_str()));
  if (name == "sameas") {
    const Value& o = arg(args, 0, line, "sameas");
    return v.kind == o.kind && (v.kind != K::boolean || v.b == o.b) && (v.kind == K::none || v.kind == K::boolean);
  }
  if (name == "odd" || name == "even") {
    if (v.kind != K::integer) fail_at(line, "test '" + name + "' needs an integer");
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "lower") return v.kind == K::string && lower(v.s) == v.s;
  if (name == "upper") return v.kind == K::string && upper(v.s) == v.s;
  if (name == "in") {
    const Value& c = arg(args, 0, line, "in");
    if (c.kind == K::string) return v.kind == K::string && c.s.find(v.s) != std::string::npos;
    for (auto& x : iterate(c, line)) if (equal(x, v)) return true;
    return false;
  }
  fail_at(line, "chat template uses unsupported test '" + name + "'");
}

Value call_method(const Value& obj, const std::string& name, const List& a, const KwArgs& kw, int line) {
  if (obj.kind == Value::string) {
    const std::string& s = obj.s;
    if (name == "startswith" || name == "endswith") {
      List cands = a.size() && a[0].kind == Value::list ? *a[0].l : List{arg(a, 0, line, name.c_str())};
      for (auto& c : cands) {
        const std::string& p = c.s;
        bool hit = p.size() <= s.size() && (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                                                  : s.compare(s.size() - p.size(), p.size(), p) == 0);
        if (hit) return Value::make_bool(true);
      }
      return Value::make_bool(false);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::make_str(py_strip(s, a.empty() ? nullptr : &a[0], name != "rstrip", name != "lstrip"));
    if (name == "split" || name == "rsplit") {
      const Value* sep = a.size() ? &a[0] : kwarg(kw, "sep");
      int64_t maxsplit = a.size() > 1 ? a[1].i : kwarg(kw, "maxsplit") ? kwarg(kw, "maxsplit")->i : -1;
      List out;
      if (!sep || sep->kind == Value::none) {  // runs of whitespace, no empty strings
        if (name == "rsplit" && maxsplit >= 0) fail_at(line, "chat template uses unsupported rsplit(None, maxsplit)");
        auto cps = code_points(s);
        size_t k = 0;
        while (k < cps.size()) {
          while (k < cps.size() && py_space(cps[k])) ++k;
          if (k == cps.size()) break;
          size_t b = k;
          if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) { out.push_back(Value::make_str(from_cps(cps, b, cps.size()))); break; }
          while (k < cps.size() && !py_space(cps[k])) ++k;
          out.push_back(Value::make_str(from_cps(cps, b, k)));
        }
        return Value::make_list(std::move(out));
      }
      const std::string& d = sep->s;
      if (d.empty()) fail_at(line, "split(): empty separator");
      if (name == "rsplit" && maxsplit >= 0) fail_at(line, "chat template uses unsupported rsplit(sep, maxsplit)");
      size_t b = 0;
      for (size_t p; (p = s.find(d, b)) != std::string::npos && (maxsplit < 0 || int64_t(out.size()) < maxsplit); b = p + d.size())
        out.push_back(Value::make_str(s.substr(b, p - b)));
      out.push_back(Value::make_str(s.substr(b)));
      return Value::make_list(std::move(out));
    }
    if (name == "upper") return Value::make_str(upper(s));
    if (name == "lower") return Value::make_str(lower(s));
    if (name == "replace")
      return Value::make_str(replace_all(s, str_arg(a, 0, line, "replace"), str_arg(a, 1, line, "replace"), a.size() > 2 ? a[2].i : -1));
    if (name == "find") { size_t p = s.find(str_arg(a, 0, line, "find")); return Value::make_int(p == std::string::npos ? -1 : int64_t(p)); }
    if (name == "count") {
      const std::string& n = str_arg(a, 0, line, "count");
      int64_t c = 0;
      for (size_t p = s.find(n); !n.empty() && p != std::string::npos; p = s.find(n, p + n.size())) ++c;
      return Value::make_int(c);
    }
    if (name == "join") {
      std::string out;
      List l = iterate(arg(a, 0, line, "join"), line);
      for (size_t k = 0; k < l.size(); ++k) out += (k ? s : "") + to_str(l[k]);
      return Value::make_str(out);
    }
    if (name == "capitalize") return apply_filter("capitalize", obj, {}, {}, line);
    if (name == "title") {  // upper-case the first letter of each run of letters
      std::string t = s;
      bool prev_alpha = false;
      for (char& c : t) {
        bool a = std::isalpha(uint8_t(c));
        c = char(a && !prev_alpha ? std::toupper(uint8_t(c)) : std::tolower(uint8_t(c)));
        prev_alpha = a;
      }
      return Value::make_str(t);
    }
  }
  if (obj.kind == Value::dict) {
    if (name == "get") {
      const Value* v = obj.find(to_str(arg(a, 0, line, "get")));
      return v ? *v : (a.size() > 1 ? a[1] : Value::make_none());
    }
    List out;
    for (auto& [k, v] : *obj.d) {
      if (name == "keys") out.push_back(Value::make_str(k));
      else if (name == "values") out.push_back(v);
      else if (name == "items") out.push_back(Value::make_list({Value::make_str(k), v}));
    }
    if (name == "keys" || name == "values" || name == "items") return Value::make_list(std::move(out));
  }
  fail_at(line, std::string("chat template uses unsupported method ") + kind_name(obj) + "." + name + "()");
}

}  // namespace grpo::jinja
