#include "train/advantages.h"

#include <cmath>

namespace grpo {

std::span<const EnumName<ScaleRewards>> scale_rewards_names() {
  static constexpr EnumName<ScaleRewards> n[] = {
      {"group", ScaleRewards::group}, {"batch", ScaleRewards::batch}, {"none", ScaleRewards::none}};
  return n;
}

Result<ScaleRewards> scale_rewards_from_string(const std::string& s) {
  if (auto v = enum_parse(scale_rewards_names(), s)) return *v;
  return error_status("scale_rewards = \"" + s + "\": must be one of " + enum_allowed(scale_rewards_names()));
}

const char* scale_rewards_name(ScaleRewards s) { return enum_name(scale_rewards_names(), s); }

namespace {
// Mean and unbiased std of x[begin, end) in double.
void mean_std(const std::vector<float>& x, size_t begin, size_t end, double* mean, double* std) {
  const size_t n = end - begin;
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += x[i];
  *mean = s / double(n);
  double ss = 0;
  for (size_t i = begin; i < end; ++i) ss += (x[i] - *mean) * (x[i] - *mean);
  *std = n > 1 ? std::sqrt(ss / double(n - 1)) : 0.0;
}
}  // namespace

Result<std::vector<float>> compute_advantages(const std::vector<float>& rewards, int group_size,
                                              ScaleRewards scale, AdvantageStats* stats) {
  if (group_size < 1) return error_status("compute_advantages: group_size must be >= 1");
  if (rewards.empty() || rewards.size() % size_t(group_size) != 0)
    return error_status("compute_advantages: " + std::to_string(rewards.size()) +
                        " rewards is not a positive multiple of the group size " + std::to_string(group_size));
  for (size_t i = 0; i < rewards.size(); ++i)
    if (!std::isfinite(rewards[i]))
      return error_status("compute_advantages: reward " + std::to_string(i) + " is not finite");
  const size_t B = rewards.size(), G = size_t(group_size);
  double bmean, bstd;
  mean_std(rewards, 0, B, &bmean, &bstd);
  std::vector<float> adv(B);
  size_t n_zero = 0;
  for (size_t g0 = 0; g0 < B; g0 += G) {
    double gmean, gstd;
    mean_std(rewards, g0, g0 + G, &gmean, &gstd);
    if (std::fabs(gstd) < 1e-8) ++n_zero;  // torch.isclose(std, 0) with its default atol
    const double div = scale == ScaleRewards::group ? gstd + 1e-4 : scale == ScaleRewards::batch ? bstd + 1e-4 : 1.0;
    for (size_t i = g0; i < g0 + G; ++i) adv[i] = float((rewards[i] - gmean) / div);
  }
  if (stats) {
    stats->reward_mean = bmean;
    stats->reward_std = bstd;
    stats->frac_zero_std = double(n_zero) / double(B / G);
  }
  return adv;
}

Result<std::vector<float>> compute_advantages_grouped(const std::vector<float>& rewards,
                                                      const std::vector<int>& group_sizes, ScaleRewards scale,
                                                      AdvantageStats* stats) {
  size_t total = 0;
  for (size_t k = 0; k < group_sizes.size(); ++k) {
    if (group_sizes[k] < 1)
      return error_status("compute_advantages: group " + std::to_string(k) + " has size " +
                          std::to_string(group_sizes[k]) + "; every group needs >= 1 reward");
    total += size_t(group_sizes[k]);
  }
  if (rewards.empty() || total != rewards.size())
    return error_status("compute_advantages: the group sizes add up to " + std::to_string(total) + " but there are " +
                        std::to_string(rewards.size()) + " rewards");
  for (size_t i = 0; i < rewards.size(); ++i)
    if (!std::isfinite(rewards[i]))
      return error_status("compute_advantages: reward " + std::to_string(i) + " is not finite");
  double bmean, bstd;
  mean_std(rewards, 0, rewards.size(), &bmean, &bstd);
  std::vector<float> adv(rewards.size());
  size_t n_zero = 0, g0 = 0;
  for (int gs : group_sizes) {
    const size_t g1 = g0 + size_t(gs);
    double gmean, gstd;
    mean_std(rewards, g0, g1, &gmean, &gstd);
    if (std::fabs(gstd) < 1e-8) ++n_zero;
    const double div = scale == ScaleRewards::group ? gstd + 1e-4 : scale == ScaleRewards::batch ? bstd + 1e-4 : 1.0;
    for (size_t i = g0; i < g1; ++i) adv[i] = float((rewards[i] - gmean) / div);
    g0 = g1;
  }
  if (stats) {
    stats->reward_mean = bmean;
    stats->reward_std = bstd;
    stats->frac_zero_std = double(n_zero) / double(group_sizes.size());
  }
  return adv;
}

}  // namespace grpo
