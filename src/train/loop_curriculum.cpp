// The KDE curriculum inside the GRPO loop (see loop_curriculum.h).
#include "train/loop_curriculum.h"

#include <filesystem>

#include "core/check.h"
#include "model/safetensors.h"

namespace grpo {

std::vector<int> curriculum_group_sizes(const KdeCurriculum& c, const std::vector<size_t>& indices) {
  std::vector<int> g;
  g.reserve(indices.size());
  for (size_t i : indices) g.push_back(c.group_size(i));
  return g;
}

MetricList curriculum_after_rollout(KdeCurriculum& c, const std::vector<size_t>& indices, const RolloutBatch& b) {
  // Several ranks: the global batch's rewards (every rank updates the same state).
  const bool global = !b.global_group_sizes.empty();
  const std::vector<int>& sizes = global ? b.global_group_sizes : b.group_sizes;
  GRPO_CHECK(indices.size() == sizes.size());
  std::vector<double> means(indices.size());
  double g_sum = 0;
  for (size_t k = 0, i = 0; k < indices.size(); ++k) {
    double s = 0;
    for (int j = 0; j < sizes[k]; ++j, ++i) s += double(global ? b.global_rewards[i] : b.completions[i].reward);
    means[k] = s / double(sizes[k]);
    g_sum += sizes[k];
  }
  c.update(indices, means);
  double ema_sum = 0;
  for (size_t i : indices) ema_sum += c.ema(i);
  const double n = double(std::max<size_t>(indices.size(), 1));
  MetricList m;
  m.emplace_back("curriculum/n_clusters", double(c.clusters().size()));
  m.emplace_back("curriculum/group_size_mean", g_sum / n);
  m.emplace_back("curriculum/ema_mean", ema_sum / n);
  for (size_t k = 0; k < c.clusters().size(); ++k) {
    const auto& cl = c.clusters()[k];
    const std::string p = "curriculum/cluster" + std::to_string(k);
    m.emplace_back(p + "/size", double(cl.size));
    if (cl.size > 0) m.emplace_back(p + "/mean_reward", cl.mean);
  }
  return m;
}

Status curriculum_write_report(const KdeCurriculum& c, const std::string& out_dir, int64_t step) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(out_dir) / "curriculum";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error_status("cannot create " + dir.string() + ": " + ec.message());
  const std::string text = c.report(step).dump() + "\n";
  GRPO_TRY(write_file_atomic((dir / ("report-" + std::to_string(step) + ".json")).string(), text));
  return write_file_atomic((dir / "latest.json").string(), text);
}

}  // namespace grpo
