// JSON Lines reading: one JSON value per line. Bad lines are never dropped
// silently: each one is reported as "file:line: <JSON error>", and the caller
// chooses whether the first bad line fails the read or bad lines are skipped
// and counted (JsonlReport). Blank lines (only whitespace) are ignored and
// counted separately; they are not errors.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace grpo {

enum class BadLinePolicy { fail, skip };

struct JsonlOptions {
  BadLinePolicy on_bad_line = BadLinePolicy::fail;
  bool require_object = true;    // each line must be a JSON object, not e.g. a bare number
  size_t max_reported_errors = 20;  // messages kept in JsonlReport::errors (all are counted)
};

struct JsonlReport {
  size_t n_lines = 0;    // physical lines read
  size_t n_rows = 0;     // values returned
  size_t n_blank = 0;    // whitespace-only lines (ignored)
  size_t n_bad = 0;      // lines that failed to parse (skipped under BadLinePolicy::skip)
  std::vector<std::string> errors;  // "file:line: message", at most max_reported_errors
};

struct JsonlFile {
  std::vector<nlohmann::json> rows;
  std::vector<size_t> line_of_row;  // 1-based source line of each row, for later error messages
  JsonlReport report;
};

// Reads `path`. Fails when the file cannot be opened, or (policy fail) at the
// first bad line with "path:line: <error>". Under policy skip it succeeds and
// the report carries the count and the first messages; the caller must show
// them (see jsonl_report_summary).
Result<JsonlFile> jsonl_read(const std::string& path, const JsonlOptions& opt = {});

// Parses JSONL text already in memory; `name` stands in for the file name in messages.
Result<JsonlFile> jsonl_parse(const std::string& text, const std::string& name,
                              const JsonlOptions& opt = {});

// One-line human summary, e.g. "train.jsonl: 7473 rows, 2 bad lines skipped (first: ...)".
std::string jsonl_report_summary(const std::string& name, const JsonlReport& r);

// Writes rows as JSONL (one compact object per line). Used by tests and tools.
Status jsonl_write(const std::string& path, const std::vector<nlohmann::json>& rows);

}  // namespace grpo
