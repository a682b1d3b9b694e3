// Jinja values with Python semantics: truthiness, equality, str() and json.dumps
// (ensure_ascii=False, Python's default separators), as HF's tojson filter produces.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja.h"

namespace grpo::jinja {

const Value* Value::find(const std::string& key) const {
  if ((kind != dict && kind != ns) || !d) return nullptr;
  for (auto& [k, v] : *d)
    if (k == key) return &v;
  return nullptr;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::make_none();
    case nlohmann::ordered_json::value_t::boolean: return Value::make_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::make_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::make_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::make_str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (auto& x : j) l.push_back(from_json(x));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: throw TemplateError("chat template: unsupported JSON value in the template inputs");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::undefined: case Value::none: return false;
    case Value::boolean: return v.b;
    case Value::integer: return v.i != 0;
    case Value::floating: return v.f != 0;
    case Value::string: return !v.s.empty();
    case Value::list: return !v.l->empty();
    case Value::dict: return !v.d->empty();
    default: return true;
  }
}

static bool numeric(const Value& v) { return v.kind == Value::integer || v.kind == Value::floating || v.kind == Value::boolean; }
static double as_double(const Value& v) { return v.kind == Value::floating ? v.f : v.kind == Value::integer ? double(v.i) : v.b; }

bool equal(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    if (a.kind != Value::floating && b.kind != Value::floating)
      return (a.kind == Value::integer ? a.i : a.b) == (b.kind == Value::integer ? b.i : b.b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::undefined: case Value::none: return true;
    case Value::string: case Value::func: return a.s == b.s;
    case Value::list:
      if (a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); ++k)
        if (!equal((*a.l)[k], (*b.l)[k])) return false;
      return true;
    case Value::dict:
      if (a.d->size() != b.d->size()) return false;
      for (auto& [k, v] : *a.d) {
        const Value* o = b.find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    default: return a.d == b.d;
  }
}

static std::string float_repr(double f) {  // Python repr(float)
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

static std::string py_repr(const Value& v) {
  if (v.kind != Value::string) return to_str(v);
  bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
  std::string out(1, dq ? '"' : '\'');
  for (char c : v.s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\'' && !dq) out += "\\'";
    else out += c;
  }
  return out + (dq ? '"' : '\'');
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::undefined: return "";
    case Value::none: return "None";
    case Value::boolean: return v.b ? "True" : "False";
    case Value::integer: return std::to_string(v.i);
    case Value::floating: return float_repr(v.f);
    case Value::string: return v.s;
    case Value::list: {
      std::string s = "[";
      for (size_t k = 0; k < v.l->size(); ++k) s += (k ? ", " : "") + py_repr((*v.l)[k]);
      return s + "]";
    }
    case Value::dict: {
      std::string s = "{";
      bool first = true;
      for (auto& [k, x] : *v.d) { s += (first ? "" : ", ") + py_repr(Value::make_str(k)) + ": " + py_repr(x); first = false; }
      return s + "}";
    }
    case Value::ns: return "<Namespace>";
    case Value::func: return "<function " + v.s + ">";
  }
  return "";
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out += b; }
        else out += char(c);
    }
  }
  out += '"';
}

std::string to_json(const Value& v, int indent, int level) {
  std::string out;
  auto nl = [&](int lv) { if (indent > 0) { out += '\n'; out.append(size_t(indent) * lv, ' '); } };
  const char* item_sep = indent > 0 ? "," : ", ";
  switch (v.kind) {
    case Value::none: return "null";
    case Value::boolean: return v.b ? "true" : "false";
    case Value::integer: return std::to_string(v.i);
    case Value::floating:
      if (std::isnan(v.f)) return "NaN";
      if (std::isinf(v.f)) return v.f > 0 ? "Infinity" : "-Infinity";
      return float_repr(v.f);
    case Value::string: json_string(out, v.s); return out;
    case Value::list:
      if (v.l->empty()) return "[]";
      out += '[';
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += item_sep;
        nl(level + 1);
        out += to_json((*v.l)[k], indent, level + 1);
      }
      nl(level);
      return out + "]";
    case Value::dict:
      if (v.d->empty()) return "{}";
      out += '{';
      for (size_t k = 0; k < v.d->size(); ++k) {
        if (k) out += item_sep;
        nl(level + 1);
        json_string(out, (*v.d)[k].first);
        out += ": " + to_json((*v.d)[k].second, indent, level + 1);
      }
      nl(level);
      return out + "}";
    default: throw TemplateError(std::string("chat template: tojson cannot serialize a ") + kind_name(v));
  }
}

const char* kind_name(const Value& v) {
  static const char* names[] = {"undefined value", "None", "bool", "int", "float", "str", "list", "dict", "namespace", "function"};
  return names[v.kind];
}

}  // namespace grpo::jinja
