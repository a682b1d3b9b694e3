// The KDE curriculum inside the GRPO loop: per-prompt rollouts before a
// generation, the EMA update after it (group mean of the weighted reward), its
// metrics, and the cluster report files under <run dir>/curriculum/.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/curriculum.h"
#include "train/loop_rollout.h"
#include "train/metrics_writer.h"

namespace grpo {

// Rollouts for each example index under the current clusters.
std::vector<int> curriculum_group_sizes(const KdeCurriculum& c, const std::vector<size_t>& indices);

// EMA update from the batch generated for `indices` (prompt k <-> indices[k]; with
// several ranks, the global batch: b.global_rewards / b.global_group_sizes).
// Returns "curriculum/n_clusters", "curriculum/group_size_mean" (this batch),
// "curriculum/ema_mean" (of the batch's problems after the update) and
// "curriculum/cluster<k>/size", "curriculum/cluster<k>/mean_reward" per cluster.
MetricList curriculum_after_rollout(KdeCurriculum& c, const std::vector<size_t>& indices, const RolloutBatch& b);

// Writes <out_dir>/curriculum/report-<step>.json and latest.json (atomically).
Status curriculum_write_report(const KdeCurriculum& c, const std::string& out_dir, int64_t step);

}  // namespace grpo
