// Training samples from a batch of groups posted by outside environments
// (Atropos's GET /batch value; env/trajectory_store.h), for data.env = "remote".
//
// Per sequence: tokens split at the first trained position (masks[t] != -100;
// the first token is always context, it has no logprob) into prompt and
// completion; completion positions with mask -100 (e.g. tool output in a
// multi-turn trajectory) get loss mask 0. inference_logprobs and ref_logprobs
// are aligned with tokens (Atropos's convention: placeholders at prompt
// positions), so their completion slices become the rollout logprobs (the IS
// correction) and the reference logprobs (the KL term).
//
// Advantages: the posted per-token advantages when a group has them (one value
// per sequence: the trained positions of a sequence must agree, else the group
// is dropped and counted, since the loss takes one advantage per sequence);
// otherwise the group's scores, normalised as train.scale_rewards says (TRL:
// group → (r − mean_g)/(std_g + 1e-4), batch → the batch std, none → centred
// only; std unbiased). A group whose scores are all equal gets zero advantages
// and still counts in the loss normalisers (TRL), reported as
// frac_reward_zero_std. overrides[i].set_advantage_to_zero zeroes a sequence's
// advantage, as Atropos's example trainer does.
//
// Policy version (staleness): the optimizer step of the weights that sampled a
// sequence, read from overrides[i].policy_version, else
// group_overrides.policy_version, else generation_params.policy_version (the
// number `grpo serve` returns as policy_version / X-Policy-Version). Untagged
// groups count as fresh (remote/untagged_groups). With max_staleness >= 0, a
// group older than that many steps is dropped (stale = "drop") or its loss
// weights are multiplied by stale_weight^(staleness − max_staleness)
// (stale = "down_weight").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/advantages.h"
#include "train/metrics_writer.h"
#include "train/train_step.h"

namespace grpo {

struct RemoteBatchOptions {
  ScaleRewards scale = ScaleRewards::group;
  int64_t current_version = 0;   // the trainer's optimizer step now
  int64_t max_staleness = -1;    // < 0: no limit
  bool stale_drop = true;        // false: down-weight
  double stale_weight = 0.5;
  int64_t vocab_size = 0;        // > 0: token ids must be below it
  int64_t max_seq_len = 0;       // > 0: longer sequences are dropped
};

struct RemoteBatch {
  std::vector<GrpoSample> samples;
  std::vector<char> has_rollout_logp;  // per sample: inference_logprobs were posted
  std::vector<char> has_ref_logp;      // per sample: ref_logprobs were posted
  std::vector<float> rewards;          // per sample: the posted score
  MetricList metrics;                  // reward/*, remote/*, completion/mean_length, frac_reward_zero_std
  std::vector<std::string> warnings;   // one line per dropped group, naming why
};

// Never fails on a bad group (it is dropped, counted in remote/dropped_groups
// and explained in warnings); fails only when `batch` is not a list.
Result<RemoteBatch> remote_batch_build(const nlohmann::json& batch, const RemoteBatchOptions& o);

// The policy version of sequence i of a normalized group, or -1 when untagged.
int64_t remote_policy_version(const nlohmann::json& group, size_t i);

}  // namespace grpo
