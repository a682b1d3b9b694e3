// JSON Lines reader/writer. See jsonl.h for the error contract.
#include "env/jsonl.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace grpo {

namespace {

bool is_blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  return true;
}

// Parses one line into `out`; returns an empty string on success, else the error.
std::string parse_line(const std::string& line, bool require_object, nlohmann::json* out) {
  try {
    *out = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    return e.what();
  }
  if (require_object && !out->is_object())
    return std::string("expected a JSON object, got ") + out->type_name();
  return {};
}

}  // namespace

Result<JsonlFile> jsonl_parse(const std::string& text, const std::string& name,
                              const JsonlOptions& opt) {
  JsonlFile f;
  size_t start = 0;
  size_t line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    f.report.n_lines++;
    if (is_blank(line)) {
      f.report.n_blank++;
      continue;
    }
    nlohmann::json v;
    std::string err = parse_line(line, opt.require_object, &v);
    if (!err.empty()) {
      std::string msg = name + ":" + std::to_string(line_no) + ": " + err;
      if (opt.on_bad_line == BadLinePolicy::fail)
        return error_status(msg + " (fix the line, or set data.on_bad_line = \"skip\" to skip bad lines)");
      f.report.n_bad++;
      if (f.report.errors.size() < opt.max_reported_errors) f.report.errors.push_back(msg);
      continue;
    }
    f.rows.push_back(std::move(v));
    f.line_of_row.push_back(line_no);
  }
  f.report.n_rows = f.rows.size();
  return f;
}

Result<JsonlFile> jsonl_read(const std::string& path, const JsonlOptions& opt) {
  // A directory opens as a stream that reads nothing: it would pass for an empty file.
  if (std::filesystem::is_directory(path))
    return error_status("'" + path + "' is a directory, not a JSONL file: point at the .jsonl file itself");
  std::ifstream in(path, std::ios::binary);
  if (!in) return error_status("cannot open JSONL file '" + path + "': check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return error_status("error while reading JSONL file '" + path + "'");
  return jsonl_parse(ss.str(), path, opt);
}

std::string jsonl_report_summary(const std::string& name, const JsonlReport& r) {
  std::string s = name + ": " + std::to_string(r.n_rows) + " rows";
  if (r.n_bad > 0) {
    s += ", " + std::to_string(r.n_bad) + " bad line(s) skipped";
    if (!r.errors.empty()) s += " (first: " + r.errors.front() + ")";
  }
  return s;
}

Status jsonl_write(const std::string& path, const std::vector<nlohmann::json>& rows) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return error_status("cannot open '" + path + "' for writing");
  for (const auto& r : rows) out << r.dump() << '\n';
  out.flush();
  if (!out) return error_status("error while writing '" + path + "' (disk full?)");
  return ok_status();
}

}  // namespace grpo
