// Server telemetry (see metrics.h).
#include "engine/service_metrics.h"

#include <cstdio>

#include "core/check.h"

namespace grpo {

namespace {
std::string fmt_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0};
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  for (size_t i = 1; i < bounds_.size(); ++i) GRPO_CHECK(bounds_[i] > bounds_[i - 1]);
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + fmt_num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + fmt_num(sum_) + "\n";
  out += name + "_count " + std::to_string(n_) + "\n";
}

ServiceMetrics::ServiceMetrics()
    : ttft_s(latency_buckets()), e2e_s(latency_buckets()), inter_token_s(latency_buckets()), queue_s(latency_buckets()) {}

void ServiceMetrics::count_model(const std::string& model) {
  std::lock_guard<std::mutex> lk(mu);
  ++model_requests[model];
}

void ServiceMetrics::count_http(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu);
  ++http_requests[{endpoint, status}];
}

std::string prometheus_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

}  // namespace grpo
