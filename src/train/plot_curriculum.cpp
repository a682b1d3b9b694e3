// Curriculum section of the run plot (see plot.h): inline SVG of the EMA KDE
// with its cut valleys, and the cluster table. Only numbers are rendered, so
// nothing needs HTML escaping.
#include <cmath>
#include <cstdio>
#include <string>

#include "train/plot.h"

namespace grpo {

namespace {

std::string num(const char* f, double v) {
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

std::string plot_curriculum_html(const nlohmann::json& rep, int W, int H) {
  const double L = 56, R = 12, T = 24, B = 28;
  const double pw = W - L - R, ph = H - T - B;
  std::string h = "<h2>Curriculum (KDE valleys) at step " + std::to_string(rep.value("step", int64_t(0))) + "</h2>\n";
  const auto& d = rep.contains("density") ? rep["density"] : nlohmann::json::array();
  if (!d.is_array() || d.size() < 2) return h + "<p>no density in the report</p>\n";
  double ymax = 0;
  for (const auto& v : d) ymax = std::max(ymax, v.get<double>());
  if (!(ymax > 0)) ymax = 1;
  const double M = double(d.size());
  auto X = [&](double x) { return L + x * pw; };
  auto Y = [&](double y) { return T + (1.0 - y / ymax) * ph; };
  h += "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
       std::to_string(H) + "\" role=\"img\" aria-label=\"curriculum KDE\">\n";
  h += "<text x=\"" + num("%.1f", L) + "\" y=\"16\" class=\"t\">KDE of per-problem reward EMA</text>\n";
  h += "<rect x=\"" + num("%.1f", L) + "\" y=\"" + num("%.1f", T) + "\" width=\"" + num("%.1f", pw) + "\" height=\"" +
       num("%.1f", ph) + "\" class=\"f\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double x = X(t / 4.0);
    h += "<text x=\"" + num("%.1f", x) + "\" y=\"" + num("%.1f", T + ph + 16) + "\" class=\"xl\">" +
         num("%.2f", t / 4.0) + "</text>\n";
  }
  h += "<text x=\"" + num("%.1f", L - 4) + "\" y=\"" + num("%.1f", T) + "\" class=\"yl\">" + num("%.3g", ymax) +
       "</text>\n";
  std::string pts;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) pts += ' ';
    pts += num("%.1f", X(double(i) / (M - 1))) + "," + num("%.1f", Y(d[i].get<double>()));
  }
  h += "<polyline points=\"" + pts + "\" class=\"l\"/>\n";
  if (rep.contains("valleys"))
    for (const auto& v : rep["valleys"]) {
      const std::string x = num("%.1f", X(v.value("x", 0.0)));
      h += "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + num("%.1f", T) + "\" y2=\"" + num("%.1f", T + ph) +
           "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n";
    }
  h += "</svg><figcaption>dashed: cuts at the deepest valleys</figcaption></figure>\n";
  h += "<table border=\"1\" cellpadding=\"4\" style=\"border-collapse:collapse;font-size:13px\">\n"
       "<tr><th>cluster</th><th>EMA range</th><th>problems</th><th>mean reward (EMA)</th><th>rollouts/prompt</th></tr>\n";
  if (rep.contains("clusters")) {
    int k = 0;
    for (const auto& c : rep["clusters"]) {
      const auto& mr = c["mean_reward"];
      h += "<tr><td>" + std::to_string(k++) + "</td><td>" + num("%.3f", c.value("lo", 0.0)) + " – " +
           num("%.3f", c.value("hi", 1.0)) + "</td><td>" + std::to_string(c.value("size", int64_t(0))) + "</td><td>" +
           (mr.is_number() ? num("%.4f", mr.get<double>()) : std::string("–")) + "</td><td>" +
           std::to_string(c.value("group_size", 0)) + "</td></tr>\n";
    }
  }
  return h + "</table>\n";
}

}  // namespace grpo
