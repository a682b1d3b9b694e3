// JSONL metric writer and reader. Format in metrics_jsonl.h.
#include "train/metrics_jsonl.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace grpo {

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status MultiMetricWriter::write(int64_t step, double wall_time, const MetricList& metrics) {
  Status first;
  for (auto& w : writers_) {
    Status s = w->write(step, wall_time, metrics);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status MultiMetricWriter::flush() {
  Status first;
  for (auto& w : writers_) {
    Status s = w->flush();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status MetricHistory::write(int64_t step, double, const MetricList& metrics) {
  for (const auto& [k, v] : metrics) series_[k].push_back({step, v});
  return ok_status();
}

Result<std::unique_ptr<JsonlMetricWriter>> JsonlMetricWriter::open(const std::string& path, bool append) {
  std::FILE* f = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (!f) return error_status("cannot open metrics file '" + path + "' for writing: check that the run directory exists and is writable");
  return std::unique_ptr<JsonlMetricWriter>(new JsonlMetricWriter(f, path));
}

JsonlMetricWriter::~JsonlMetricWriter() {
  if (f_) std::fclose(f_);
}

Status JsonlMetricWriter::write(int64_t step, double wall_time, const MetricList& metrics) {
  // ordered_json keeps "step" and "time" first and metrics in the caller's order.
  nlohmann::ordered_json j;
  j["step"] = step;
  j["time"] = wall_time;
  for (const auto& [k, v] : metrics) {
    if (std::isfinite(v)) j[k] = v;
    else j[k] = nullptr;
  }
  std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return error_status("error writing metrics file '" + path_ + "' (disk full?)");
  return ok_status();
}

Status JsonlMetricWriter::flush() {
  if (std::fflush(f_) != 0) return error_status("error flushing metrics file '" + path_ + "'");
  return ok_status();
}

Result<MetricHistory> metrics_jsonl_load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return error_status("cannot open metrics file '" + path + "'");
  MetricHistory h;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = path + ":" + std::to_string(n) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      return error_status(where + e.what());
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
      return error_status(where + "expected an object with an integer \"step\"");
    int64_t step = j["step"].get<int64_t>();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "step" || it.key() == "time" || it->is_null()) continue;
      if (!it->is_number()) return error_status(where + "metric '" + it.key() + "' is not a number");
      h.add(it.key(), step, it->get<double>());
    }
  }
  return h;
}

Status metrics_jsonl_truncate(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return ok_status();
  GRPO_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string kept;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  return write_file_atomic(path, kept);
}

}  // namespace grpo
