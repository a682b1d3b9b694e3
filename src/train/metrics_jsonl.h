// JSONL metric log: one JSON object per step and line, flushed after each
// write so that a crashed run keeps every completed step, e.g.
//   {"step":3,"time":1763774520.25,"reward/mean":0.5,"loss":0.12}
// Non-finite values (NaN, inf) have no JSON spelling: they are written as null.
#pragma once
#include <cstdio>
#include <string>

#include "train/metrics_writer.h"

namespace grpo {

class JsonlMetricWriter : public MetricWriter {
 public:
  // Opens (append = keep existing lines, for resumed runs) or truncates `path`.
  static Result<std::unique_ptr<JsonlMetricWriter>> open(const std::string& path, bool append = false);
  ~JsonlMetricWriter() override;
  Status write(int64_t step, double wall_time, const MetricList& metrics) override;
  Status flush() override;

 private:
  JsonlMetricWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

// Reads a metrics JSONL file back into a history (for `grpo plot` and tests).
// Lines must be objects with an integer "step"; "time" is skipped, null values
// are skipped, other non-numeric values are an error naming file:line.
Result<MetricHistory> metrics_jsonl_load(const std::string& path);

// Keeps the records of a metrics JSONL file whose step is <= `step` (rewritten
// atomically); a missing file is fine. Used when a run resumes.
Status metrics_jsonl_truncate(const std::string& path, int64_t step);

}  // namespace grpo
