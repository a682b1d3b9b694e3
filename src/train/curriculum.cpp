// KDE valley curriculum (definitions in curriculum.h).
#include "train/curriculum.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include "core/check.h"

namespace grpo {

namespace {

// f from distinct values with multiplicities: a run's EMAs repeat (every unsampled
// problem sits at ema_init), so this costs distinct values x grid, not problems x grid.
std::vector<double> kde_density_counted(const std::vector<std::pair<double, int64_t>>& vc, int64_t n,
                                        double bandwidth, int grid_points) {
  GRPO_CHECK(grid_points >= 2 && bandwidth > 0 && n > 0);
  const double norm = 1.0 / (double(n) * bandwidth * std::sqrt(2.0 * M_PI));
  std::vector<double> d(static_cast<size_t>(grid_points));
  for (int i = 0; i < grid_points; ++i) {
    const double x = double(i) / double(grid_points - 1);
    double s = 0;
    for (const auto& [e, c] : vc) {
      const double u = (x - e) / bandwidth;
      s += double(c) * std::exp(-0.5 * u * u);
    }
    d[size_t(i)] = s * norm;
  }
  return d;
}

}  // namespace

std::vector<double> kde_grid_density(const std::vector<double>& xs, double bandwidth, int grid_points) {
  GRPO_CHECK(!xs.empty());
  std::map<double, int64_t> counts;
  for (double e : xs) ++counts[e];
  return kde_density_counted({counts.begin(), counts.end()}, int64_t(xs.size()), bandwidth, grid_points);
}

std::vector<KdeValley> kde_find_valleys(const std::vector<double>& d, int grid_points) {
  GRPO_CHECK(int(d.size()) == grid_points && grid_points >= 2);
  const int M = grid_points;
  // prefix_max[i] = max d[0..i]; suffix_max[i] = max d[i..M-1].
  std::vector<double> prefix_max(d.size()), suffix_max(d.size());
  for (int i = 0; i < M; ++i) prefix_max[size_t(i)] = i ? std::max(prefix_max[size_t(i - 1)], d[size_t(i)]) : d[0];
  for (int i = M - 1; i >= 0; --i)
    suffix_max[size_t(i)] = i < M - 1 ? std::max(suffix_max[size_t(i + 1)], d[size_t(i)]) : d[size_t(i)];
  std::vector<KdeValley> out;
  for (int i = 1; i + 1 < M;) {
    int k = i;
    while (k + 1 < M && d[size_t(k + 1)] == d[size_t(i)]) ++k;
    if (k + 1 < M && d[size_t(i - 1)] > d[size_t(i)] && d[size_t(k + 1)] > d[size_t(k)]) {
      KdeValley v;
      v.index = i;
      v.x = double(i) / double(M - 1);
      v.density = d[size_t(i)];
      v.depth = std::min(prefix_max[size_t(i - 1)], suffix_max[size_t(k + 1)]) - d[size_t(i)];
      out.push_back(v);
    }
    i = k + 1;
  }
  return out;
}

std::vector<KdeValley> kde_select_cuts(std::vector<KdeValley> valleys, int n_clusters) {
  std::stable_sort(valleys.begin(), valleys.end(), [](const KdeValley& a, const KdeValley& b) {
    return a.depth != b.depth ? a.depth > b.depth : a.index < b.index;
  });
  std::vector<KdeValley> cuts;
  for (const auto& v : valleys)
    if (int(cuts.size()) < n_clusters - 1 && v.depth > 0) cuts.push_back(v);
  std::sort(cuts.begin(), cuts.end(), [](const KdeValley& a, const KdeValley& b) { return a.index < b.index; });
  return cuts;
}

int kde_cluster_of(double e, const std::vector<KdeValley>& cuts) {
  int k = 0;
  for (const auto& c : cuts) k += e > c.x ? 1 : 0;
  return k;
}

int curriculum_group_size(int base, double alpha, double mean, int max_generations) {
  if (std::isnan(mean)) return base;
  int g = int(std::floor(double(base) * (1.0 + alpha * (1.0 - mean)) + 0.5));
  if (max_generations > 0) g = std::min(g, max_generations);
  return std::max(g, 1);
}

Result<KdeCurriculum> KdeCurriculum::make(const CurriculumOptions& opt, std::vector<std::string> ids) {
  if (ids.empty()) return error_status("curriculum: the train split is empty");
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = seen.emplace(ids[i], i);
    if (!fresh)
      return error_status("curriculum: train examples " + std::to_string(it->second) + " and " + std::to_string(i) +
                          " share the id '" + ids[i] +
                          "'; the curriculum keys its state by problem id, so ids must be unique (fix the dataset's "
                          "id field or set curriculum.type = \"none\")");
  }
  KdeCurriculum c;
  c.opt_ = opt;
  c.ids_ = std::move(ids);
  c.ema_.assign(c.ids_.size(), opt.ema_init);
  c.seen_.assign(c.ids_.size(), 0);
  c.recluster();
  return c;
}

void KdeCurriculum::recluster() {
  density_ = kde_grid_density(ema_, opt_.bandwidth, opt_.grid_points);
  cuts_ = kde_select_cuts(kde_find_valleys(density_, opt_.grid_points), opt_.n_clusters);
  clusters_.assign(cuts_.size() + 1, CurriculumCluster{});
  std::vector<double> sum(clusters_.size(), 0.0);
  for (double e : ema_) {
    const int k = kde_cluster_of(e, cuts_);
    ++clusters_[size_t(k)].size;
    sum[size_t(k)] += e;
  }
  for (size_t k = 0; k < clusters_.size(); ++k) {
    CurriculumCluster& c = clusters_[k];
    c.lo = k == 0 ? 0.0 : cuts_[k - 1].x;
    c.hi = k == cuts_.size() ? 1.0 : cuts_[k].x;
    c.mean = c.size > 0 ? sum[k] / double(c.size) : std::numeric_limits<double>::quiet_NaN();
    c.group_size = curriculum_group_size(opt_.base, opt_.alpha, c.mean, opt_.max_generations);
  }
}

int KdeCurriculum::group_size(size_t index) const {
  GRPO_CHECK(index < ema_.size());
  return clusters_[size_t(kde_cluster_of(ema_[index], cuts_))].group_size;
}

void KdeCurriculum::update(const std::vector<size_t>& indices, const std::vector<double>& rewards) {
  GRPO_CHECK(indices.size() == rewards.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    GRPO_CHECK(indices[i] < ema_.size());
    double& e = ema_[indices[i]];
    e = std::clamp(opt_.ema_decay * e + (1.0 - opt_.ema_decay) * rewards[i], 0.0, 1.0);
    seen_[indices[i]] = 1;
  }
  ++n_updates_;
  recluster();
}

nlohmann::json KdeCurriculum::to_json() const {
  nlohmann::json j;
  j["format"] = "grpo.cpp kde_valley curriculum v1";
  j["n_updates"] = n_updates_;
  nlohmann::json ema = nlohmann::json::array();
  for (size_t i = 0; i < ids_.size(); ++i)
    if (seen_[i]) ema.push_back({ids_[i], ema_[i]});
  j["ema"] = std::move(ema);
  return j;
}

Status KdeCurriculum::restore(const nlohmann::json& j, const std::string& src) {
  const std::string where = src + ": curriculum state";
  if (!j.is_object() || !j.contains("n_updates") || !j["n_updates"].is_number_integer() || !j.contains("ema") ||
      !j["ema"].is_array())
    return error_status(where + " lacks \"n_updates\" or \"ema\"; the checkpoint is corrupt or from another version");
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < ids_.size(); ++i) index.emplace(ids_[i], i);
  std::vector<double> ema(ids_.size(), opt_.ema_init);
  std::vector<uint8_t> seen(ids_.size(), 0);
  for (const auto& e : j["ema"]) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      return error_status(where + ": an \"ema\" entry is not [id, value]: " + e.dump());
    auto it = index.find(e[0].get<std::string>());
    if (it == index.end())
      return error_status(where + " names problem '" + e[0].get<std::string>() +
                          "', which is not in the train split: the data changed since the checkpoint; resume with the "
                          "same data, or start a new run");
    const double v = e[1].get<double>();
    if (!(v >= 0.0 && v <= 1.0)) return error_status(where + ": EMA " + e.dump() + " is outside [0, 1]");
    ema[it->second] = v;
    seen[it->second] = 1;
  }
  ema_ = std::move(ema);
  seen_ = std::move(seen);
  n_updates_ = j["n_updates"].get<int64_t>();
  recluster();
  return ok_status();
}

nlohmann::json KdeCurriculum::report(int64_t step) const {
  nlohmann::json j;
  j["step"] = step;
  j["n_updates"] = n_updates_;
  j["n_problems"] = ids_.size();
  int64_t n_seen = 0;
  for (uint8_t s : seen_) n_seen += s;
  j["n_sampled"] = n_seen;
  j["options"] = {{"ema_init", opt_.ema_init},     {"ema_decay", opt_.ema_decay},   {"bandwidth", opt_.bandwidth},
                  {"grid_points", opt_.grid_points}, {"n_clusters", opt_.n_clusters}, {"alpha", opt_.alpha},
                  {"base", opt_.base},             {"max_generations", opt_.max_generations}};
  j["density"] = density_;
  nlohmann::json cuts = nlohmann::json::array();
  for (const auto& v : cuts_) cuts.push_back({{"index", v.index}, {"x", v.x}, {"density", v.density}, {"depth", v.depth}});
  j["valleys"] = std::move(cuts);
  nlohmann::json cl = nlohmann::json::array();
  for (const auto& c : clusters_) {
    nlohmann::json o = {{"lo", c.lo}, {"hi", c.hi}, {"size", c.size}, {"group_size", c.group_size}};
    o["mean_reward"] = std::isnan(c.mean) ? nlohmann::json(nullptr) : nlohmann::json(c.mean);
    cl.push_back(std::move(o));
  }
  j["clusters"] = std::move(cl);
  return j;
}

}  // namespace grpo
