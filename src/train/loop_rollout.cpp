// Rollouts, rewards, advantages and eval for the GRPO loop (see loop_rollout.h).
#include "train/loop_rollout.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "dist/communicator.h"
#include "train/rollout_failover.h"
#include "train/rollout_server.h"

namespace grpo {

uint64_t rollout_seed_for(uint64_t seed, int64_t generation, int64_t request) {
  uint64_t s = seed ^ (uint64_t(generation) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(request) * 0xD1B54A32D192ED03ull);
  splitmix64_next(&s);
  return splitmix64_next(&s);
}

Result<std::vector<RequestOutput>> engine_run_prompts(Engine& engine, const std::vector<PreparedPrompt>& prompts,
                                                      const SamplingParams& params,
                                                      const std::vector<uint64_t>& seeds, EngineService* svc,
                                                      const std::vector<int>& n_per_prompt) {
  GRPO_CHECK(seeds.empty() || seeds.size() == prompts.size());
  GRPO_CHECK(n_per_prompt.empty() || n_per_prompt.size() == prompts.size());
  std::vector<std::vector<int32_t>> ids;
  std::vector<SamplingParams> ps(prompts.size(), params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(prompts[i].ids);
    if (!seeds.empty()) ps[i].seed = seeds[i];
    if (!n_per_prompt.empty()) ps[i].n = n_per_prompt[i];
  }
  if (!svc) return engine.generate(ids, ps);
  svc->resume();
  auto out = svc->generate(ids, ps);
  svc->pause_and_drain();
  return out;
}

Telemetry telemetry_of(const RequestOutput& o) {
  Telemetry t;
  t.latency_s = o.telemetry.e2e_s;
  t.ttft_s = o.telemetry.ttft_s;
  t.n_tokens = int64_t(o.completion_ids.size());
  t.kv_peak_bytes = int64_t(o.telemetry.peak_kv_bytes);
  t.prefix_hit_tokens = o.telemetry.prefix_hit_tokens;
  t.prompt_tokens = o.telemetry.prompt_tokens;
  t.truncated = o.finish_reason == FinishReason::length;
  t.spec_proposed = o.telemetry.spec_proposed;
  t.spec_accepted = o.telemetry.spec_accepted;
  t.spec_accept_rate = t.spec_proposed > 0 ? double(t.spec_accepted) / double(t.spec_proposed) : 0.0;
  t.engine_steps = o.telemetry.engine_steps;
  return t;
}

Result<RolloutBatch> rollout_generate(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                      std::vector<PreparedPrompt> prompts, const RolloutConfig& rc,
                                      int64_t generation, EngineService* svc, const std::vector<int>& group_sizes) {
  RolloutBatch b;
  b.group_size = rc.params.n;
  b.prompts = std::move(prompts);
  GRPO_CHECK(group_sizes.empty() || group_sizes.size() == b.prompts.size());
  b.group_sizes = group_sizes.empty() ? std::vector<int>(b.prompts.size(), b.group_size) : group_sizes;
  std::vector<uint64_t> seeds(b.prompts.size());
  for (size_t k = 0; k < seeds.size(); ++k) seeds[k] = rollout_seed_for(rc.seed, generation, rc.request_offset + int64_t(k));

  const double t0 = now_seconds();
  std::vector<RequestOutput> outs;
  RemoteGeneration remote;
  if (rc.server && !(rc.failover && rc.failover->down())) {
    std::vector<std::vector<int32_t>> ids(b.prompts.size());
    std::vector<SamplingParams> ps(b.prompts.size(), rc.params);
    for (size_t k = 0; k < ids.size(); ++k) {
      ids[k] = b.prompts[k].ids;
      ps[k].seed = seeds[k];
      ps[k].n = b.group_sizes[k];
    }
    auto g = rc.server->generate(ids, ps, rc.server_min_version);
    if (g.ok()) {
      remote = std::move(g).value();
      outs = std::move(remote.outs);
      b.policy_version = remote.policy_version_min;
      b.from_server = true;
    } else if (!rc.failover) {
      return error_status(g.status().message() + "; to train on with the in-process engine when the server is lost, "
                                                 "set rollout.server_on_failure = \"local\"");
    } else {
      rc.failover->lost(g.status(), generation);
    }
  }
  if (!b.from_server) {
    // The prompts, seeds and group sizes the server was sent: the same samples as a run without one.
    if (!rc.engine_may_sample) {
      GRPO_CHECK(rc.server != nullptr);
      return error_status("the rollout server " + rc.server->url() + " is lost");
    }
    GRPO_ASSIGN_OR_RETURN(outs, engine_run_prompts(engine, b.prompts, rc.params, seeds, svc, b.group_sizes));
  }
  const double t1 = now_seconds();

  const size_t N = outs.size();
  std::vector<size_t> prompt_of(N);
  for (size_t k = 0, i = 0; k < b.group_sizes.size(); ++k)
    for (int j = 0; j < b.group_sizes[k]; ++j) prompt_of[i++] = k;
  b.completions.resize(N);
  std::vector<float> totals(N);
  std::vector<double> fn_sum(rewards.size(), 0.0), term_sum(rewards.n_terms(), 0.0);
  double score_sum = 0, len_sum = 0, len_max = 0, n_trunc = 0, prefix_hits = 0, prompt_toks = 0;
  double spec_proposed = 0, spec_accepted = 0, engine_steps = 0;
  double tandem_trained = 0, tandem_tokens = 0, tandem_switches = 0;
  bool tandem = false;
  std::vector<Telemetry> tels(N);
  std::vector<RewardInput> inputs(N);
  for (size_t i = 0; i < N; ++i) {
    b.completions[i].out = std::move(outs[i]);
    const PreparedPrompt& pp = b.prompts[prompt_of[i]];
    tels[i] = telemetry_of(b.completions[i].out);
    inputs[i] = {pp.text, b.completions[i].out.text, &pp.example, &tels[i]};
  }
  GRPO_ASSIGN_OR_RETURN(RewardBatchResult scored, rewards.compute_batch(inputs));
  for (size_t i = 0; i < N; ++i) {
    Completion& c = b.completions[i];
    const PreparedPrompt& pp = b.prompts[prompt_of[i]];
    const Telemetry& tel = tels[i];
    c.truncated = tel.truncated;
    RewardValues& rv = scored.values[i];
    c.reward = float(rv.total);
    c.reward_values = std::move(rv.values);
    c.score = env.score(pp.example, c.out.text);
    totals[i] = c.reward;
    for (size_t f = 0; f < fn_sum.size(); ++f) fn_sum[f] += c.reward_values[f];
    for (size_t k = 0; k < term_sum.size(); ++k) term_sum[k] += rv.terms[k];
    score_sum += c.score;
    const double len = double(c.out.completion_ids.size());
    len_sum += len;
    len_max = std::max(len_max, len);
    n_trunc += c.truncated ? 1 : 0;
    prefix_hits += c.out.telemetry.prefix_hit_tokens;
    prompt_toks += c.out.telemetry.prompt_tokens;
    spec_proposed += tel.spec_proposed;
    spec_accepted += tel.spec_accepted;
    engine_steps += double(tel.engine_steps);
    b.n_completion_tokens += int64_t(len);
    const auto& mm = c.out.model_mask;
    if (!mm.empty()) {
      tandem = true;
      for (size_t t = 0; t < mm.size(); ++t) {
        tandem_trained += mm[t];
        tandem_switches += t > 0 && mm[t] != mm[t - 1];
      }
      tandem_tokens += double(mm.size());
      c.loss_weights = tandem_loss_weights(mm, rc.tandem_partner_weight);
    }
  }
  AdvantageStats st;
  if (rc.comm && rc.comm->size() > 1) {
    // Groups never straddle ranks, but "batch" scaling and the reward statistics
    // are over the global batch: compute them from every rank's rewards (and group
    // sizes, which a curriculum sets per prompt).
    GRPO_ASSIGN_OR_RETURN(std::vector<float> all, rc.comm->all_gather_host(totals));
    const std::vector<float> mine_gs(b.group_sizes.begin(), b.group_sizes.end());
    GRPO_ASSIGN_OR_RETURN(std::vector<float> all_gs, rc.comm->all_gather_host(mine_gs));
    b.global_group_sizes.assign(all_gs.begin(), all_gs.end());
    GRPO_ASSIGN_OR_RETURN(std::vector<float> adv, compute_advantages_grouped(all, b.global_group_sizes, rc.scale, &st));
    GRPO_CHECK(rc.request_offset >= 0 && size_t(rc.request_offset) <= b.global_group_sizes.size());
    size_t first = 0;
    for (int64_t k = 0; k < rc.request_offset; ++k) first += size_t(b.global_group_sizes[size_t(k)]);
    GRPO_CHECK(first + N <= adv.size());
    b.advantages.assign(adv.begin() + long(first), adv.begin() + long(first + N));
    b.global_rewards = std::move(all);
  } else {
    GRPO_ASSIGN_OR_RETURN(b.advantages, compute_advantages_grouped(totals, b.group_sizes, rc.scale, &st));
  }
  const double t2 = now_seconds();

  const double dn = double(std::max<size_t>(N, 1));
  MetricList& m = b.metrics;
  m.emplace_back("reward/mean", st.reward_mean);
  m.emplace_back("reward/std", st.reward_std);
  for (size_t f = 0; f < fn_sum.size(); ++f) m.emplace_back("reward/" + rewards.label(f) + "/mean", fn_sum[f] / dn);
  for (size_t k = 0; k < term_sum.size(); ++k) m.emplace_back("reward/" + rewards.term_label(k), term_sum[k] / dn);
  for (size_t f = 0; f < fn_sum.size(); ++f)
    if (rewards.function(f).is_remote()) {
      m.emplace_back("reward/" + rewards.label(f) + "/failed", double(scored.n_failed[f]));
      m.emplace_back("time/reward/" + rewards.label(f), scored.seconds[f]);
    }
  m.emplace_back("reward/frac_zero_std", st.frac_zero_std);
  m.emplace_back("accuracy", score_sum / dn);
  m.emplace_back("completion/mean_length", len_sum / dn);
  m.emplace_back("completion/max_length", len_max);
  m.emplace_back("completion/truncated_frac", n_trunc / dn);
  m.emplace_back("time/rollout", t1 - t0);
  m.emplace_back("time/reward", t2 - t1);
  m.emplace_back("rollout/tokens_per_s", t1 > t0 ? len_sum / (t1 - t0) : 0.0);
  // Prompt tokens the prefix cache served, summed over the batch's samples (engine telemetry).
  m.emplace_back("rollout/prefix_hit_tokens", prefix_hits);
  m.emplace_back("rollout/prefix_hit_frac", prompt_toks > 0 ? prefix_hits / prompt_toks : 0.0);
  // Speculative decoding over the batch: accepted / proposed draft tokens (0 when nothing drafted).
  m.emplace_back("rollout/spec_accept_rate", spec_proposed > 0 ? spec_accepted / spec_proposed : 0.0);
  m.emplace_back("rollout/engine_steps_mean", engine_steps / dn);
  if (rc.server) {  // also for a batch of the engine, so that every data-parallel rank has the same keys
    m.emplace_back("rollout/server_policy_version", b.from_server ? double(remote.policy_version_min) : -1.0);
    m.emplace_back("rollout/server_resent", double(remote.n_resent));
  }
  if (tandem) {
    m.emplace_back("tandem/trained_token_frac", tandem_tokens > 0 ? tandem_trained / tandem_tokens : 0.0);
    m.emplace_back("tandem/switches_per_completion", tandem_switches / dn);
    m.emplace_back("tandem/partner_tokens", tandem_tokens - tandem_trained);
  }
  return b;
}

std::vector<float> tandem_loss_weights(const std::vector<uint8_t>& model_mask, float partner_weight) {
  std::vector<float> w(model_mask.size());
  for (size_t t = 0; t < w.size(); ++t) w[t] = model_mask[t] ? 1.f : partner_weight;
  return w;
}

Result<MetricList> rollout_eval(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                const std::vector<PreparedPrompt>& prompts, const SamplingParams& params,
                                uint64_t seed, EngineService* svc, int64_t first_index) {
  const double t0 = now_seconds();
  std::vector<uint64_t> seeds(prompts.size());
  for (size_t k = 0; k < seeds.size(); ++k) seeds[k] = rollout_seed_for(seed, -1, first_index + int64_t(k));
  GRPO_ASSIGN_OR_RETURN(std::vector<RequestOutput> outs, engine_run_prompts(engine, prompts, params, seeds, svc));
  const size_t n = size_t(params.n);
  double score = 0, reward = 0, len = 0, trained = 0;
  bool tandem = false;
  std::vector<Telemetry> tels(outs.size());
  std::vector<RewardInput> inputs(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    tels[i] = telemetry_of(outs[i]);
    inputs[i] = {prompts[i / n].text, outs[i].text, &prompts[i / n].example, &tels[i]};
  }
  GRPO_ASSIGN_OR_RETURN(RewardBatchResult scored, rewards.compute_batch(inputs));
  for (size_t i = 0; i < outs.size(); ++i) {
    const PreparedPrompt& pp = prompts[i / n];
    score += env.score(pp.example, outs[i].text);
    reward += scored.values[i].total;
    len += double(outs[i].completion_ids.size());
    tandem |= !outs[i].model_mask.empty();
    for (uint8_t x : outs[i].model_mask) trained += x;
  }
  const double dn = double(std::max<size_t>(outs.size(), 1));
  MetricList m;
  m.emplace_back("eval/accuracy", score / dn);
  m.emplace_back("eval/reward", reward / dn);
  m.emplace_back("eval/completion_length", len / dn);
  m.emplace_back("eval/n", double(outs.size()));
  if (tandem) m.emplace_back("eval/trained_token_frac", len > 0 ? trained / len : 0.0);
  m.emplace_back("eval/time", now_seconds() - t0);
  return m;
}

Result<MetricList> rollout_eval_solo_tandem(Engine& engine, const Environment& env, const RewardComposer& rewards,
                                            const std::vector<PreparedPrompt>& prompts, const SamplingParams& params,
                                            uint64_t seed, bool tandem, EngineService* svc, int64_t first_index) {
  if (!engine.has_tandem()) return rollout_eval(engine, env, rewards, prompts, params, seed, svc, first_index);
  GRPO_TRY(engine.set_tandem_active(false));
  auto solo = rollout_eval(engine, env, rewards, prompts, params, seed, svc, first_index);
  GRPO_TRY(engine.set_tandem_active(true));
  if (!solo.ok() || !tandem) return solo;
  MetricList m = std::move(solo).value();
  GRPO_ASSIGN_OR_RETURN(MetricList both, rollout_eval(engine, env, rewards, prompts, params, seed, svc, first_index));
  for (auto& [k, v] : both) m.emplace_back("eval/tandem/" + k.substr(k.find('/') + 1), v);
  return m;
}

}  // namespace grpo
