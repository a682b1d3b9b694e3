// Engine-service telemetry for the server's /metrics page (Prometheus text exposition format 0.0.4):
// counters, and cumulative latency histograms with fixed buckets. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace grpo {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implicit
  void observe(double v);
  // Appends `name_bucket{le=...}`, `name_sum` and `name_count` lines.
  void render(const std::string& name, const std::string& help, std::string& out) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct ServiceMetrics {
  ServiceMetrics();
  Histogram ttft_s, e2e_s, inter_token_s, queue_s;
  std::mutex mu;
  uint64_t prompt_tokens = 0, generation_tokens = 0;
  uint64_t requests_finished = 0, requests_aborted = 0, requests_failed = 0;
  std::map<std::string, uint64_t> finish_reasons;  // per sample
  std::map<std::pair<std::string, int>, uint64_t> http_requests;  // (endpoint, status)
  std::map<std::string, uint64_t> model_requests;  // generation requests by the `model` they named

  void count_model(const std::string& model);

  void count_http(const std::string& endpoint, int status);
};

// Escapes a Prometheus label value (backslash, quote, newline).
std::string prometheus_label(const std::string& v);

}  // namespace grpo
