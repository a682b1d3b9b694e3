// Metric sinks for a training run. A step's metrics are an ordered list of
// (name, value) pairs, names like "reward/mean", "loss", "eval/accuracy".
// Writers: JSONL (metrics_jsonl.h), TensorBoard (tensorboard.h); MetricHistory
// keeps everything in memory for the end-of-run plot (plot.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace grpo {

using MetricList = std::vector<std::pair<std::string, double>>;

class MetricWriter {
 public:
  virtual ~MetricWriter() = default;
  // Records the metrics of one step; wall_time is seconds since the Unix epoch.
  virtual Status write(int64_t step, double wall_time, const MetricList& metrics) = 0;
  virtual Status flush() = 0;
};

// Fans out to several writers; the first error is returned (others still run).
class MultiMetricWriter : public MetricWriter {
 public:
  void add(std::unique_ptr<MetricWriter> w) { writers_.push_back(std::move(w)); }
  Status write(int64_t step, double wall_time, const MetricList& metrics) override;
  Status flush() override;

 private:
  std::vector<std::unique_ptr<MetricWriter>> writers_;
};

// In-memory series per metric name, in insertion order of steps.
class MetricHistory : public MetricWriter {
 public:
  struct Point {
    int64_t step;
    double value;
  };
  Status write(int64_t step, double wall_time, const MetricList& metrics) override;
  Status flush() override { return ok_status(); }
  const std::map<std::string, std::vector<Point>>& series() const { return series_; }
  void add(const std::string& name, int64_t step, double value) { series_[name].push_back({step, value}); }

 private:
  std::map<std::string, std::vector<Point>> series_;
};

// Seconds since the Unix epoch (TensorBoard's wall_time).
double unix_time_now();

}  // namespace grpo
