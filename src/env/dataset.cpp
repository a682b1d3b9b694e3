// Dataset loading with field mapping; prompt templates; seeded ordering.
#include "env/dataset.h"

#include "env/gsm8k.h"

namespace grpo {

const nlohmann::json* json_find_path(const nlohmann::json& obj, const std::string& path) {
  const nlohmann::json* cur = &obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

namespace {

// Text of a string or number field; error text when absent or of another type.
std::string field_text(const nlohmann::json& row, const std::string& field, std::string* out) {
  const nlohmann::json* v = json_find_path(row, field);
  if (!v) return "missing field '" + field + "'";
  if (v->is_string()) {
    *out = v->get<std::string>();
    return {};
  }
  if (v->is_number_integer()) {
    *out = std::to_string(v->get<int64_t>());
    return {};
  }
  if (v->is_number()) {
    *out = v->dump();
    return {};
  }
  return "field '" + field + "' must be a string or a number, got " + v->type_name();
}

// Maps one row; returns an error message (without file:line) or empty.
std::string map_row(const nlohmann::json& row, const FieldMap& map, const std::string& default_id,
                    Example* ex) {
  std::string err = field_text(row, map.prompt_field, &ex->question);
  if (!err.empty()) return err;
  std::string ans;
  err = field_text(row, map.answer_field, &ans);
  if (!err.empty()) return err;
  if (map.answer_is_solution) {
    auto gold = gsm8k_gold_answer(ans);
    if (!gold) return "field '" + map.answer_field + "' has no '#### <answer>' line";
    ex->solution = ans;
    ex->answer = *gold;
  } else {
    ex->answer = ans;
  }
  ex->id = default_id;
  if (!map.id_field.empty()) {
    err = field_text(row, map.id_field, &ex->id);
    if (!err.empty()) return err;
  }
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (it.key() != map.prompt_field && it.key() != map.answer_field && it.key() != map.id_field)
      ex->meta[it.key()] = it.value();
  }
  return {};
}

}  // namespace

Result<Dataset> dataset_load_jsonl(const std::string& path, const std::string& name,
                                   const FieldMap& map, const JsonlOptions& opt) {
  GRPO_ASSIGN_OR_RETURN(JsonlFile f, jsonl_read(path, opt));
  Dataset ds;
  ds.name = name;
  ds.report = f.report;
  ds.examples.reserve(f.rows.size());
  for (size_t i = 0; i < f.rows.size(); ++i) {
    Example ex;
    std::string err = map_row(f.rows[i], map, name + "/" + std::to_string(i), &ex);
    if (!err.empty()) {
      std::string msg = path + ":" + std::to_string(f.line_of_row[i]) + ": " + err;
      if (opt.on_bad_line == BadLinePolicy::fail)
        return error_status(msg + " (check data.prompt_field / data.answer_field, or skip bad lines)");
      ds.report.n_bad++;
      if (ds.report.errors.size() < opt.max_reported_errors) ds.report.errors.push_back(msg);
      continue;
    }
    ds.examples.push_back(std::move(ex));
  }
  ds.report.n_rows = ds.examples.size();
  return ds;
}

Result<std::string> prompt_render(const std::string& tmpl, const Example& ex) {
  std::string out;
  out.reserve(tmpl.size() + ex.question.size());
  for (size_t i = 0; i < tmpl.size(); ++i) {
    char c = tmpl[i];
    if ((c == '{' || c == '}') && i + 1 < tmpl.size() && tmpl[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') return error_status("prompt template: unmatched '}' at offset " + std::to_string(i) + " (write '}}' for a literal brace)");
    if (c != '{') {
      out += c;
      continue;
    }
    size_t close = tmpl.find('}', i);
    if (close == std::string::npos)
      return error_status("prompt template: unclosed '{' at offset " + std::to_string(i) + " (write '{{' for a literal brace)");
    std::string key = tmpl.substr(i + 1, close - i - 1);
    if (key == "question") out += ex.question;
    else if (key == "answer") out += ex.answer;
    else if (key == "id") out += ex.id;
    else
      return error_status("prompt template: unknown placeholder '{" + key + "}' (valid: {question}, {answer}, {id})");
    i = close;
  }
  return out;
}

uint64_t splitmix64_next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<size_t> dataset_order(size_t n, uint64_t seed) {
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  uint64_t st = seed;
  for (size_t i = n; i > 1; --i) {
    // Modulo bias is below 2^-40 for any realistic n; irrelevant for shuffling.
    size_t j = static_cast<size_t>(splitmix64_next(&st) % i);
    std::swap(idx[i - 1], idx[j]);
  }
  return idx;
}

}  // namespace grpo
