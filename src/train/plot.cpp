// HTML/SVG line charts of run metrics. See plot.h.
#include "train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace grpo {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string fmt_px(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// "Nice" tick step (1, 2 or 5 times a power of ten) for about n ticks over span.
double nice_step(double span, int n) {
  double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

std::string chart(const std::string& name, const std::vector<MetricHistory::Point>& pts, int W, int H) {
  const double L = 56, R = 12, T = 24, B = 28;  // margins
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& p : pts) {
    if (!std::isfinite(p.value)) continue;
    x0 = std::min(x0, double(p.step)), x1 = std::max(x1, double(p.step));
    y0 = std::min(y0, p.value), y1 = std::max(y1, p.value);
  }
  std::string s = "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
                  std::to_string(H) + "\" role=\"img\" aria-label=\"" + esc(name) + "\">\n";
  s += "<text x=\"" + fmt_px(L) + "\" y=\"16\" class=\"t\">" + esc(name) + "</text>\n";
  if (x0 > x1) return s + "<text x=\"" + fmt_px(W / 2.0) + "\" y=\"" + fmt_px(H / 2.0) + "\" class=\"n\">no data</text></svg></figure>\n";
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= std::max(1e-9, std::fabs(y0) * 0.1), y1 += std::max(1e-9, std::fabs(y1) * 0.1);
  double pw = W - L - R, ph = H - T - B;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * ph; };
  s += "<rect x=\"" + fmt_px(L) + "\" y=\"" + fmt_px(T) + "\" width=\"" + fmt_px(pw) + "\" height=\"" + fmt_px(ph) + "\" class=\"f\"/>\n";
  double ys = nice_step(y1 - y0, 4);
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-12 * ys; v += ys) {
    std::string y = fmt_px(Y(v));
    s += "<line x1=\"" + fmt_px(L) + "\" x2=\"" + fmt_px(L + pw) + "\" y1=\"" + y + "\" y2=\"" + y + "\" class=\"g\"/>";
    s += "<text x=\"" + fmt_px(L - 4) + "\" y=\"" + y + "\" class=\"yl\">" + fmt(std::fabs(v) < ys * 1e-9 ? 0 : v) + "</text>\n";
  }
  double xs = std::max(1.0, nice_step(x1 - x0, 6));
  for (double v = std::ceil(x0 / xs) * xs; v <= x1; v += xs) {
    std::string x = fmt_px(X(v));
    s += "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fmt_px(T) + "\" y2=\"" + fmt_px(T + ph) + "\" class=\"g\"/>";
    s += "<text x=\"" + x + "\" y=\"" + fmt_px(T + ph + 16) + "\" class=\"xl\">" + fmt(v) + "</text>\n";
  }
  // One polyline per finite run of points; a run of one point is a dot.
  std::string line;
  double lx = 0, ly = 0;
  int run = 0;
  auto close_line = [&]() {
    if (run == 1) s += "<circle cx=\"" + fmt_px(lx) + "\" cy=\"" + fmt_px(ly) + "\" r=\"3\" class=\"d\"/>\n";
    if (run > 1) s += "<polyline points=\"" + line + "\" class=\"l\"/>\n";
    line.clear();
    run = 0;
  };
  for (const auto& p : pts) {
    if (!std::isfinite(p.value)) {
      close_line();
      continue;
    }
    lx = X(double(p.step));
    ly = Y(p.value);
    if (run++ > 0) line += ' ';
    line += fmt_px(lx);
    line += ',';
    line += fmt_px(ly);
  }
  close_line();
  return s + "</svg><figcaption>last: " + fmt(pts.back().value) + " at step " + std::to_string(pts.back().step) +
         "</figcaption></figure>\n";
}

}  // namespace

const std::vector<std::string>& plot_default_metrics() {
  static const std::vector<std::string> m = {"reward/mean", "reward/std", "eval/accuracy", "loss", "kl",
                                             "grad_norm", "lr", "completion/mean_length", "entropy", "clip_ratio"};
  return m;
}

std::string plot_render_html(const MetricHistory& history, const PlotOptions& opt) {
  std::vector<std::string> names = opt.metrics;
  if (names.empty()) {
    for (const auto& n : plot_default_metrics())
      if (history.series().count(n)) names.push_back(n);
    if (names.empty())
      for (const auto& [n, _] : history.series()) names.push_back(n);
  }
  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + esc(opt.title) + "</title>\n<style>\n"
      "body{font-family:sans-serif;margin:16px;background:#fff;color:#222}\n"
      "figure{display:inline-block;margin:8px}figcaption{font-size:12px;color:#555}\n"
      ".t{font-size:14px;font-weight:bold}.n{font-size:13px;text-anchor:middle;fill:#888}\n"
      ".f{fill:#fafafa;stroke:#999}.g{stroke:#e3e3e3}.l{fill:none;stroke:#1f77b4;stroke-width:1.6}.d{fill:#1f77b4}\n"
      ".yl{font-size:11px;text-anchor:end;dominant-baseline:middle}.xl{font-size:11px;text-anchor:middle}\n"
      "</style></head><body>\n<h1>" + esc(opt.title) + "</h1>\n";
  for (const auto& n : names) {
    auto it = history.series().find(n);
    static const std::vector<MetricHistory::Point> empty;
    h += chart(n, it == history.series().end() ? empty : it->second, opt.width, opt.height);
  }
  if (!opt.curriculum_report.is_null()) h += plot_curriculum_html(opt.curriculum_report, opt.width, opt.height);
  return h + "</body></html>\n";
}

Status plot_write_html(const std::string& path, const MetricHistory& history, const PlotOptions& opt) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return error_status("cannot write plot '" + tmp + "': check that the run directory exists");
    out << plot_render_html(history, opt);
    if (!out) return error_status("error writing plot '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return error_status("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  return ok_status();
}

}  // namespace grpo
