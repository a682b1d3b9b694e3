// Rollout side of the GRPO loop: B prompts × G samples through the Engine,
// rewards per completion (total and per function), group advantages and the
// batch's metrics; and the greedy eval over a held-out split.
//
// Sampling keys: request k of generation g samples with seed
// rollout_seed_for(seed, g, k), so a generation depends only on the weights,
// the prompts and these counters — not on engine request ids or on how the
// run was split by resumes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_service.h"
#include "env/environment.h"
#include "env/rewards.h"
#include "train/advantages.h"
#include "train/loop_data.h"
#include "train/metrics_writer.h"

namespace grpo {

class Communicator;
class RolloutFailover;
class RolloutServer;

struct Completion {
  RequestOutput out;             // prompt ids, completion ids, text, logprobs, telemetry
  bool truncated = false;        // stopped by max_tokens (no EOS / stop)
  float reward = 0;              // weighted total over the reward functions
  std::vector<float> reward_values;  // unweighted, composer order
  float score = 0;               // the environment's task score in [0, 1]
  // Per-token loss weights, one per completion token; empty = all ones. The hook
  // for schemes that weigh tokens differently (tandem training fills it).
  std::vector<float> loss_weights;
};

struct RolloutBatch {
  std::vector<PreparedPrompt> prompts;  // B
  int group_size = 0;                   // G (rollout.num_generations)
  // Samples of each prompt (B); all G unless a curriculum chose per prompt.
  // Completions are prompt-major: prompt k owns the group_sizes[k] after those of prompts < k.
  std::vector<int> group_sizes;
  std::vector<Completion> completions;  // sum of group_sizes
  std::vector<float> advantages;        // B·G
  // B·G: the trainer's logprobs of each completion under the weights that
  // generated the batch (TRL's old_per_token_logps); filled by the trainer
  // before its first step on the batch, when the ratio needs them.
  std::vector<std::vector<float>> old_logp;
  // Data parallel (several ranks): the weighted rewards and group sizes of the global
  // batch, every rank's prompts in order (the curriculum updates from them); empty on one rank.
  std::vector<float> global_rewards;
  std::vector<int> global_group_sizes;
  int64_t n_completion_tokens = 0;
  // The version of the weights (optimizer steps taken) that sampled every group of the
  // batch; set by asynchronous rollouts (train/loop_async.h) and by rollouts from a server
  // (the oldest answer's policy_version), else -1 (the current one).
  int64_t policy_version = -1;
  // rollout.server_url: the server sampled the batch (false: the in-process engine, after the
  // server was lost under rollout.server_on_failure = "local").
  bool from_server = false;
  // reward/*, accuracy, completion/*, rollout/*, time/rollout, time/reward; tandem rollouts
  // add tandem/trained_token_frac, tandem/switches_per_completion, tandem/partner_tokens
  // (reward/* and accuracy are then the tandem rollouts' rewards).
  MetricList metrics;
};

uint64_t rollout_seed_for(uint64_t seed, int64_t generation, int64_t request);

// Adds every prompt with `params` (params.n samples each; prompt k seeded with
// seeds[k] when seeds is non-empty), runs the engine until all are done and
// returns the outputs ordered prompt-major, sample-minor. n_per_prompt, when
// non-empty, gives prompt k n_per_prompt[k] samples instead of params.n. With `svc`
// (the loop serves its live policy, [server]) the prompts go through the service's
// queue and share the batch with outside requests: the service runs for the call and
// is paused (drained) again before it returns, so nothing else touches the engine
// while the loop trains.
Result<std::vector<RequestOutput>> engine_run_prompts(Engine& engine, const std::vector<PreparedPrompt>& prompts,
                                                      const SamplingParams& params,
                                                      const std::vector<uint64_t>& seeds,
                                                      EngineService* svc = nullptr,
                                                      const std::vector<int>& n_per_prompt = {});

// Telemetry for the reward functions from an engine output.
Telemetry telemetry_of(const RequestOutput& o);

struct RolloutConfig {
  SamplingParams params;       // n = G; seed set per prompt
  uint64_t seed = 0;           // rollout.seed
  ScaleRewards scale = ScaleRewards::group;
  // Data parallel: this rank's first prompt within the global batch (sampling keys
  // stay those of a one-rank run), and the ranks, to gather rewards so that
  // advantages and reward statistics are those of the global batch.
  int64_t request_offset = 0;
  Communicator* comm = nullptr;
  // Tandem rollouts (outputs with a model mask): each completion's loss_weights are
  // tandem_loss_weights(model mask, tandem_partner_weight).
  float tandem_partner_weight = 0.2f;
  // rollout.server_url: the batch is sampled by this server instead of the engine
  // (train/rollout_server.h); the batch's policy_version is then the oldest answer's and
  // rollout/server_policy_version records it. server_min_version >= 0 (a weight bridge
  // follows the trainer): answers from older versions are asked again.
  RolloutServer* server = nullptr;
  int64_t server_min_version = -1;
  // rollout.server_on_failure = "local" (train/rollout_failover.h): a failed generate() marks the
  // server lost and the engine samples the batch instead; while it is lost the engine samples
  // without asking it. Null: a failed generate() is the call's error.
  RolloutFailover* failover = nullptr;
  // false on the asynchronous producer thread, which must not run the engine while the trainer
  // steps: a lost server then fails the call (marked lost) and the caller samples it again.
  bool engine_may_sample = true;
};

// One generation batch: samples, rewards, advantages and metrics. group_sizes,
// when non-empty, gives each prompt its own number of samples (>= 1 each); with
// several ranks (rc.comm) every rank's group sizes are gathered so that advantages
// and reward statistics are those of the global batch.
Result<RolloutBatch> rollout_generate(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                      std::vector<PreparedPrompt> prompts, const RolloutConfig& rc,
                                      int64_t generation, EngineService* svc = nullptr,
                                      const std::vector<int>& group_sizes = {});

// Greedy (or sampled) eval: "eval/accuracy" (mean task score), "eval/reward"
// (mean weighted reward), "eval/completion_length", "eval/n", "eval/time"; outputs
// written in tandem add "eval/trained_token_frac".
Result<MetricList> rollout_eval(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                const std::vector<PreparedPrompt>& prompts, const SamplingParams& params,
                                uint64_t seed, EngineService* svc = nullptr, int64_t first_index = 0);

// Eval of a tandem engine: solo first (the trained model alone, the eval/* metrics of
// rollout_eval), then, with `tandem`, the same prompts written in tandem as
// eval/tandem/* (accuracy, reward, completion_length, n, trained_token_frac, time).
// Leaves tandem decoding on. Without a tandem engine this is rollout_eval. svc and
// first_index as rollout_eval (the service must be paused: switching needs an idle engine).
Result<MetricList> rollout_eval_solo_tandem(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                            const std::vector<PreparedPrompt>& prompts, const SamplingParams& params,
                                            uint64_t seed, bool tandem, EngineService* svc = nullptr,
                                            int64_t first_index = 0);

// Tandem rollouts: the per-token loss weights w_t = m_t + (1 − m_t)·partner_weight of a
// completion's model mask (1 = trained model's token).
std::vector<float> tandem_loss_weights(const std::vector<uint8_t>& model_mask, float partner_weight);

}  // namespace grpo
