// Group-relative advantages from per-completion rewards, as in TRL's
// GRPOTrainer. Completions come in groups of G consecutive samples of one
// prompt (B = n_groups · G):
//   A_i = r_i − mean_{j in group(i)} r_j
//   scale_rewards = group: A_i /= (std_{group(i)}(r) + 1e-4)
//                   batch: A_i /= (std over all B rewards + 1e-4)
//                   none : unscaled
// std is the unbiased (N−1) estimator, as torch.std. A group (or batch) of a
// single reward has std 0 here (torch would give NaN). `rewards` is the
// already-weighted sum over reward functions. For data-parallel training the
// "batch" std must be over the global batch: pass the gathered rewards.
#pragma once
#include <string>
#include <vector>

#include "core/enum_table.h"
#include "core/status.h"

namespace grpo {

enum class ScaleRewards { group, batch, none };
std::span<const EnumName<ScaleRewards>> scale_rewards_names();  // group, batch, none (the one name table)
Result<ScaleRewards> scale_rewards_from_string(const std::string& s);
const char* scale_rewards_name(ScaleRewards s);

struct AdvantageStats {
  double reward_mean = 0, reward_std = 0;  // over the batch (unbiased std)
  double frac_zero_std = 0;                // fraction of groups whose std is ~0 (no learning signal)
};

// rewards (B), B divisible by group_size. Returns A (B). Errors name the bad argument.
Result<std::vector<float>> compute_advantages(const std::vector<float>& rewards, int group_size,
                                              ScaleRewards scale, AdvantageStats* stats = nullptr);

// Groups of unequal size (a curriculum gives prompts different G): group k is
// the next group_sizes[k] rewards. Same formulas; uniform sizes give results
// identical to compute_advantages.
Result<std::vector<float>> compute_advantages_grouped(const std::vector<float>& rewards,
                                                      const std::vector<int>& group_sizes, ScaleRewards scale,
                                                      AdvantageStats* stats = nullptr);

}  // namespace grpo
