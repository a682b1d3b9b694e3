// A Jinja2 subset for chat templates (internal to chat_template.cpp): values with
// Python semantics, the parsed template tree, and the parser/evaluator entry points.
// What is implemented is what HF chat templates of the Qwen2/2.5/3 and Llama-3.x
// families use; any other construct is a TemplateError naming it and its line, never
// a silently different prompt. Errors travel as exceptions inside the interpreter and
// become a Status at render_chat().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace grpo::jinja {

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // keeps insertion order like Python dicts

struct Value {
  enum Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, func } kind = undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;               // string; func: the builtin's name
  std::shared_ptr<List> l;     // list
  std::shared_ptr<Dict> d;     // dict and namespace (namespaces are mutable through `set ns.x`)

  static Value make_none() { Value v; v.kind = none; return v; }
  static Value make_bool(bool x) { Value v; v.kind = boolean; v.b = x; return v; }
  static Value make_int(int64_t x) { Value v; v.kind = integer; v.i = x; return v; }
  static Value make_float(double x) { Value v; v.kind = floating; v.f = x; return v; }
  static Value make_str(std::string x) { Value v; v.kind = string; v.s = std::move(x); return v; }
  static Value make_list(List x = {}) { Value v; v.kind = list; v.l = std::make_shared<List>(std::move(x)); return v; }
  static Value make_dict(Dict x = {}) { Value v; v.kind = dict; v.d = std::make_shared<Dict>(std::move(x)); return v; }
  static Value make_func(std::string name) { Value v; v.kind = func; v.s = std::move(name); return v; }

  const Value* find(const std::string& key) const;  // dict/namespace member or nullptr
};

Value from_json(const nlohmann::ordered_json& j);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string to_str(const Value& v);          // Python str(): None -> "None", True -> "True"
std::string to_json(const Value& v, int indent, int level = 0);  // json.dumps(ensure_ascii=False)
const char* kind_name(const Value& v);

// ---- builtins (jinja_builtins.cpp); `line` is for error messages ----------------
using KwArgs = std::vector<std::pair<std::string, Value>>;
Value apply_filter(const std::string& name, const Value& in, const List& args, const KwArgs& kw, int line);
bool apply_test(const std::string& name, const Value& v, const List& args, int line);
Value call_method(const Value& obj, const std::string& name, const List& args, const KwArgs& kw, int line);
[[noreturn]] void fail_at(int line, const std::string& msg);

// ---- parsed template --------------------------------------------------------------

struct Expr {
  enum Type { literal, name, getattr, getitem, slice, call, filter, test, unary, binary, cond, list_lit, dict_lit } type;
  int line = 0;
  std::string op;                         // name / attribute / filter / test / operator
  Value lit;
  std::vector<std::unique_ptr<Expr>> args;  // operands, call/filter positional args
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum Type { text, output, if_, for_, set } type;
  int line = 0;
  std::string str;                                    // text: the literal text
  ExprPtr expr;                                       // output; for: iterable; set: value
  std::vector<std::pair<ExprPtr, Body>> branches;     // if/elif (else: null condition)
  std::vector<std::string> targets;                   // for: loop variables; set: name [, attribute]
  ExprPtr filter;                                     // for ... if filter
  Body body, else_body;                               // for
};

// Parses template source with HF's settings (trim_blocks, lstrip_blocks, one trailing
// newline dropped). Throws TemplateError.
Body parse_template(const std::string& src);

struct RenderEnv {
  std::map<std::string, Value> globals;
  std::string date_ymd;  // strftime_now() formats this date (YYYY-MM-DD)
};
// Renders a parsed template. Throws TemplateError.
std::string render(const Body& body, const RenderEnv& env);

}  // namespace grpo::jinja
