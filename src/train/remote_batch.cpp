// Samples from posted groups (see remote_batch.h).
#include "train/remote_batch.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "env/trajectory_store.h"

namespace grpo {

using json = nlohmann::json;

namespace {

int64_t version_in(const json& obj) {
  if (!obj.is_object()) return -1;
  auto it = obj.find("policy_version");
  if (it == obj.end() || !it->is_number_integer()) return -1;
  return it->get<int64_t>();
}

double unbiased_std(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  double m = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

struct GroupOut {
  std::vector<GrpoSample> samples;
  std::vector<char> has_roll, has_ref;
  std::vector<float> rewards;
  std::vector<double> centred;   // score − group mean, per kept sequence (before scaling)
  std::vector<char> posted_adv;  // advantage already final (posted or zeroed by override)
  double group_std = 0;
};

}  // namespace

int64_t remote_policy_version(const json& g, size_t i) {
  const json& ov = g["overrides"];
  if (ov.is_array() && i < ov.size()) {
    const int64_t v = version_in(ov[i]);
    if (v >= 0) return v;
  }
  const int64_t v = version_in(g["group_overrides"]);
  if (v >= 0) return v;
  return version_in(g["generation_params"]);
}

Result<RemoteBatch> remote_batch_build(const json& batch, const RemoteBatchOptions& o) {
  if (!batch.is_array()) return error_status("a batch must be a list of scored groups, got " + std::string(batch.type_name()));
  RemoteBatch out;
  int64_t n_groups = 0, n_dropped = 0, n_stale_dropped = 0, n_stale_weighted = 0, n_untagged = 0, n_zero_std = 0;
  int64_t n_untrained = 0, n_completion_tokens = 0;
  double staleness_sum = 0, staleness_max = 0;
  std::vector<double> all_scores;
  std::map<int64_t, std::pair<double, int64_t>> env_reward;  // env id → (sum, count)
  std::vector<GroupOut> groups;
  for (size_t gi = 0; gi < batch.size(); ++gi) {
    auto drop = [&](const std::string& why) {
      ++n_dropped;
      out.warnings.push_back("group " + std::to_string(gi) + " dropped: " + why);
    };
    auto norm = scored_data_normalize(batch[gi]);
    if (!norm.ok()) {
      drop(norm.status().message());
      continue;
    }
    const json& g = norm.value();
    const json& tokens = g["tokens"];
    const size_t G = tokens.size();
    // Staleness from the oldest sequence of the group: the group is one unit.
    int64_t version = -1;
    bool tagged = false;
    for (size_t i = 0; i < G; ++i) {
      const int64_t v = remote_policy_version(g, i);
      if (v >= 0) {
        version = tagged ? std::min(version, v) : v;
        tagged = true;
      }
    }
    const int64_t staleness = tagged ? std::max<int64_t>(0, o.current_version - version) : 0;
    if (!tagged) ++n_untagged;
    float weight = 1.f;
    if (o.max_staleness >= 0 && staleness > o.max_staleness) {
      if (o.stale_drop) {
        ++n_stale_dropped;
        continue;
      }
      weight = float(std::pow(o.stale_weight, double(staleness - o.max_staleness)));
      ++n_stale_weighted;
    }
    std::string bad;
    for (size_t i = 0; i < G && bad.empty(); ++i) {
      if (o.max_seq_len > 0 && int64_t(tokens[i].size()) > o.max_seq_len)
        bad = "tokens[" + std::to_string(i) + "] has " + std::to_string(tokens[i].size()) +
              " tokens, more than the model's context (" + std::to_string(o.max_seq_len) + ")";
      for (const auto& t : tokens[i]) {
        const int64_t id = t.get<int64_t>();
        if (id < 0 || (o.vocab_size > 0 && id >= o.vocab_size)) {
          bad = "tokens[" + std::to_string(i) + "] holds id " + std::to_string(id) + ", outside the model's vocabulary (" +
                std::to_string(o.vocab_size) + ")";
          break;
        }
      }
    }
    if (!bad.empty()) {
      drop(bad);
      continue;
    }
    const json& adv = g["advantages"];
    const json& inf = g["inference_logprobs"];
    const json& ref = g["ref_logprobs"];
    const json& ov = g["overrides"];
    std::vector<double> scores;
    for (size_t i = 0; i < G; ++i) scores.push_back(g["scores"][i].get<double>());
    double mean = 0;
    for (double s : scores) mean += s;
    mean /= double(G);
    GroupOut go;
    go.group_std = unbiased_std(scores);
    for (size_t i = 0; i < G && bad.empty(); ++i) {
      const json& tk = tokens[i];
      const json& mk = g["masks"][i];
      const size_t T = tk.size();
      size_t first = T;
      for (size_t t = 1; t < T; ++t)
        if (mk[t].get<int64_t>() != -100) {
          first = t;
          break;
        }
      if (first == T) {
        ++n_untrained;  // nothing to train; its score still shaped the group's statistics
        continue;
      }
      GrpoSample s;
      for (size_t t = 0; t < first; ++t) s.prompt.push_back(int32_t(tk[t].get<int64_t>()));
      for (size_t t = first; t < T; ++t) {
        s.completion.push_back(int32_t(tk[t].get<int64_t>()));
        s.mask.push_back(mk[t].get<int64_t>() == -100 ? 0.f : 1.f);
      }
      bool posted = false;
      if (adv.is_array()) {
        double a0 = NAN;
        for (size_t t = first; t < T; ++t) {
          if (mk[t].get<int64_t>() == -100) continue;
          const double a = adv[i][t].get<double>();
          if (std::isnan(a0)) a0 = a;
          else if (std::abs(a - a0) > 1e-6 * std::max(1.0, std::abs(a0))) {
            bad = "advantages[" + std::to_string(i) + "] varies across the trained tokens (" + std::to_string(a0) +
                  " vs " + std::to_string(a) + "); the loss takes one advantage per sequence";
            break;
          }
        }
        s.advantage = float(a0);
        posted = true;
      }
      if (ov.is_array() && i < ov.size() && ov[i].value("set_advantage_to_zero", false)) {
        s.advantage = 0.f;
        posted = true;
      }
      const bool has_roll = inf.is_array();
      if (has_roll)
        for (size_t t = first; t < T; ++t) s.rollout_logp.push_back(inf[i][t].get<float>());
      const bool has_ref = ref.is_array();
      if (has_ref)
        for (size_t t = first; t < T; ++t) s.ref_logp.push_back(ref[i][t].get<float>());
      if (weight != 1.f) s.weights.assign(s.completion.size(), weight);
      go.samples.push_back(std::move(s));
      go.has_roll.push_back(has_roll);
      go.has_ref.push_back(has_ref);
      go.rewards.push_back(float(scores[i]));
      go.centred.push_back(scores[i] - mean);
      go.posted_adv.push_back(posted);
    }
    if (!bad.empty()) {
      drop(bad);
      continue;
    }
    ++n_groups;
    if (go.group_std < 1e-6 && G > 1) ++n_zero_std;
    staleness_sum += double(staleness);
    staleness_max = std::max(staleness_max, double(staleness));
    const int64_t env = g["env_id"].is_number_integer() ? g["env_id"].get<int64_t>() : -1;
    for (double s : scores) {
      all_scores.push_back(s);
      env_reward[env].first += s;
      env_reward[env].second += 1;
    }
    groups.push_back(std::move(go));
  }
  const double batch_std = unbiased_std(all_scores);
  for (auto& go : groups) {
    for (size_t k = 0; k < go.samples.size(); ++k) {
      GrpoSample& s = go.samples[k];
      if (!go.posted_adv[k]) {
        double a = go.centred[k];
        if (o.scale == ScaleRewards::group) a /= go.group_std + 1e-4;
        else if (o.scale == ScaleRewards::batch) a /= batch_std + 1e-4;
        s.advantage = float(a);
      }
      n_completion_tokens += int64_t(s.completion.size());
      out.samples.push_back(std::move(s));
      out.has_rollout_logp.push_back(go.has_roll[k]);
      out.has_ref_logp.push_back(go.has_ref[k]);
      out.rewards.push_back(go.rewards[k]);
    }
  }
  double mean = 0;
  for (double s : all_scores) mean += s;
  if (!all_scores.empty()) mean /= double(all_scores.size());
  MetricList& m = out.metrics;
  m.emplace_back("reward/mean", mean);
  m.emplace_back("reward/std", batch_std);
  m.emplace_back("frac_reward_zero_std", n_groups > 0 ? double(n_zero_std) / double(n_groups) : 0.0);
  m.emplace_back("completion/mean_length",
                 out.samples.empty() ? 0.0 : double(n_completion_tokens) / double(out.samples.size()));
  m.emplace_back("tokens/trained", double(n_completion_tokens));
  m.emplace_back("remote/groups", double(n_groups));
  m.emplace_back("remote/sequences", double(out.samples.size()));
  m.emplace_back("remote/dropped_groups", double(n_dropped));
  m.emplace_back("remote/stale_dropped_groups", double(n_stale_dropped));
  m.emplace_back("remote/stale_downweighted_groups", double(n_stale_weighted));
  m.emplace_back("remote/untagged_groups", double(n_untagged));
  m.emplace_back("remote/untrained_sequences", double(n_untrained));
  m.emplace_back("remote/staleness_mean", n_groups > 0 ? staleness_sum / double(n_groups) : 0.0);
  m.emplace_back("remote/staleness_max", staleness_max);
  for (const auto& [env, sc] : env_reward)
    if (env >= 0) m.emplace_back("reward/env_" + std::to_string(env), sc.first / double(sc.second));
  return out;
}

}  // namespace grpo
