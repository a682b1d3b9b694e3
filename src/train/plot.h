// End-of-run plot: one self-contained HTML page with an inline SVG line chart
// per metric over steps. No JavaScript, no external CSS or fonts, so the file
// opens anywhere (and in a browser without network access).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/metrics_writer.h"

namespace grpo {

// Metrics charted when the caller passes none: those of these names present
// in the history, in this order.
const std::vector<std::string>& plot_default_metrics();

struct PlotOptions {
  std::string title = "grpo run";
  std::vector<std::string> metrics;  // empty: plot_default_metrics(); names absent from the history are listed as "no data"
  int width = 640, height = 260;     // of each chart, in CSS pixels
  // A KDE curriculum cluster report (KdeCurriculum::report); null = no curriculum section.
  nlohmann::json curriculum_report;
};

// The curriculum section: the KDE curve over [0, 1] with the cut valleys marked,
// and a table of clusters (EMA range, size, mean reward, rollouts per prompt).
std::string plot_curriculum_html(const nlohmann::json& report, int width, int height);

// HTML text of the page. Non-finite values are skipped (they break the line).
std::string plot_render_html(const MetricHistory& history, const PlotOptions& opt);

// Writes plot_render_html to `path` (atomically: temp file + rename).
Status plot_write_html(const std::string& path, const MetricHistory& history, const PlotOptions& opt);

}  // namespace grpo
