// KDE valley curriculum ([curriculum] type = "kde_valley"): more rollouts for
// the problems the policy finds hard.
//
// Per train problem an EMA of its reward: starts at ema_init (0.5); after a
// generation that sampled the problem, with r = the mean weighted reward of its
// group,  ema <- clip(decay * ema + (1 - decay) * r, 0, 1)  — decay (0.7) is
// the weight kept on the history. Problems never sampled keep ema_init.
//
// Clusters: a Gaussian KDE of all problems' EMAs on the grid x_i = i / (M - 1),
// i = 0..M-1 (M = grid_points, 512),
//   f(x) = 1 / (n h sqrt(2 pi)) * sum_j exp(-((x - e_j) / h)^2 / 2)   (h = bandwidth, 0.05).
// A valley is a run of equal grid values d[i..k] (1 <= i <= k <= M-2) with
// d[i-1] > d[i] and d[k+1] > d[k]; its position is i. Its depth is
//   min(max d[0..i-1], max d[k+1..M-1]) - d[i]
// (the lower of the highest peaks on either side, minus the floor). The
// n_clusters - 1 deepest valleys (ties: lower index first; depth must be > 0)
// cut [0, 1] into clusters at x_i = i / (M - 1); problem j is in cluster
// #{cut x : e_j > x} (a problem exactly on a cut goes left). Fewer valleys
// give fewer clusters. Cluster mean = mean EMA of its members.
//
// Allocation: a problem of cluster k gets
//   G = floor(base * (1 + alpha * (1 - mean_k)) + 0.5)   (round half up; base = rollout.num_generations)
// capped at max_generations when that is > 0, at least 1; an empty cluster's
// G is base. Clusters are recomputed after every EMA update, so a problem's G
// comes from the EMAs of every generation before it.
//
// State (EMA per problem id) goes into the checkpoint as JSON; doubles round-
// trip exactly, and the clusters are a pure function of the EMAs, so a resumed
// run allocates exactly as an uninterrupted one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace grpo {

struct KdeValley {
  int index = 0;       // grid index of the valley floor's first point
  double x = 0;        // index / (M - 1)
  double density = 0;  // f at the floor
  double depth = 0;    // see the file comment
};

// f on the M-point grid (M >= 2, h > 0, xs non-empty).
std::vector<double> kde_grid_density(const std::vector<double>& xs, double bandwidth, int grid_points);
// Every valley of `d`, by position.
std::vector<KdeValley> kde_find_valleys(const std::vector<double>& d, int grid_points);
// The n_clusters - 1 deepest valleys of positive depth, by position.
std::vector<KdeValley> kde_select_cuts(std::vector<KdeValley> valleys, int n_clusters);
// Cluster of value e given cuts sorted by position.
int kde_cluster_of(double e, const std::vector<KdeValley>& cuts);
// Rollouts of a cluster with mean `mean` (NaN = empty cluster -> base).
int curriculum_group_size(int base, double alpha, double mean, int max_generations);

struct CurriculumOptions {
  double ema_init = 0.5;
  double ema_decay = 0.7;
  double bandwidth = 0.05;
  int grid_points = 512;
  int n_clusters = 3;
  double alpha = 1.0;
  int base = 8;             // rollout.num_generations
  int max_generations = 0;  // 0 = no cap
};

struct CurriculumCluster {
  double lo = 0, hi = 1;  // EMA range (lo, hi]; the first cluster includes 0
  int64_t size = 0;
  double mean = 0;        // NaN when empty
  int group_size = 0;
};

class KdeCurriculum {
 public:
  // ids: the train split's problem ids, by example index (must be unique).
  static Result<KdeCurriculum> make(const CurriculumOptions& opt, std::vector<std::string> ids);
  // Rollouts for example `index` under the current clusters.
  int group_size(size_t index) const;
  // EMA update after one generation: the mean reward of each sampled example's group.
  void update(const std::vector<size_t>& indices, const std::vector<double>& group_mean_rewards);
  double ema(size_t index) const { return ema_[index]; }
  const std::vector<CurriculumCluster>& clusters() const { return clusters_; }
  const std::vector<KdeValley>& cuts() const { return cuts_; }
  const std::vector<double>& density() const { return density_; }
  int64_t n_updates() const { return n_updates_; }

  // Checkpoint state: {"format", "n_updates", "ema": [[id, value], ...] for sampled problems}.
  nlohmann::json to_json() const;
  // Restores a state written by to_json; errors name the unknown id or bad field.
  Status restore(const nlohmann::json& j, const std::string& source);
  // Cluster report: options, grid density, cuts, clusters (for report files and the plot).
  nlohmann::json report(int64_t step) const;

 private:
  void recluster();
  CurriculumOptions opt_;
  std::vector<std::string> ids_;
  std::vector<double> ema_;
  std::vector<uint8_t> seen_;
  int64_t n_updates_ = 0;
  std::vector<double> density_;
  std::vector<KdeValley> cuts_;
  std::vector<CurriculumCluster> clusters_;
};

}  // namespace grpo
