// Reward functions and composition. Definitions and defaults in rewards.h.
#include "env/rewards.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/check.h"
#include "core/timer.h"
#include "env/gsm8k.h"
#include "env/remote_reward.h"

namespace grpo {

namespace {

using json = nlohmann::json;
constexpr std::string_view kTags[] = {"<think>", "</think>", "<answer>", "</answer>"};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

bool has_any_tag(std::string_view s) {
  for (auto t : kTags)
    if (s.find(t) != std::string_view::npos) return true;
  return false;
}

size_t count_of(std::string_view s, std::string_view t) {
  size_t n = 0;
  for (size_t p = s.find(t); p != std::string_view::npos; p = s.find(t, p + t.size())) ++n;
  return n;
}

// Completion text with "<think>" prepended when the prompt already opened it.
std::string with_think(std::string_view c, bool think_in_prompt) {
  return think_in_prompt ? "<think>" + std::string(c) : std::string(c);
}

double length_of(std::string_view completion, const Telemetry& tel, bool tokens) {
  return tokens ? static_cast<double>(tel.n_tokens) : static_cast<double>(completion.size());
}

class CorrectReward : public RewardFunction {
 public:
  CorrectReward(std::string n, double w) : RewardFunction(std::move(n), w) {}
  float compute(std::string_view, std::string_view c, const Example& ex, const Telemetry&) const override {
    return gsm8k_is_correct(c, ex.answer) ? 1.0f : 0.0f;
  }
};

class FormatReward : public RewardFunction {
 public:
  FormatReward(std::string n, double w, bool strict, bool tip)
      : RewardFunction(std::move(n), w), strict_(strict), think_in_prompt_(tip) {}
  float compute(std::string_view, std::string_view c, const Example&, const Telemetry&) const override {
    return strict_ ? (format_strict_match(c, think_in_prompt_) ? 1.0f : 0.0f)
                   : format_soft_score(c, think_in_prompt_);
  }

 private:
  bool strict_, think_in_prompt_;
};

class LengthLinearReward : public RewardFunction {
 public:
  LengthLinearReward(std::string n, double w, const json& p)
      : RewardFunction(std::move(n), w), target_(p["target"]), scale_(p["scale"]),
        max_penalty_(p["max_penalty"]), tokens_(reward_param_enum(p, "unit", length_unit_names()) == LengthUnit::tokens) {}
  float compute(std::string_view, std::string_view c, const Example&, const Telemetry& t) const override {
    double over = length_of(c, t, tokens_) - target_;
    return over <= 0 ? 0.0f : static_cast<float>(-std::min(max_penalty_, over / scale_));
  }

 private:
  double target_, scale_, max_penalty_;
  bool tokens_;
};

class OverlongReward : public RewardFunction {
 public:
  OverlongReward(std::string n, double w, const json& p)
      : RewardFunction(std::move(n), w), max_len_(p["max_len"]), cache_len_(p["cache_len"]),
        tokens_(reward_param_enum(p, "unit", length_unit_names()) == LengthUnit::tokens) {}
  float compute(std::string_view, std::string_view c, const Example&, const Telemetry& t) const override {
    double len = length_of(c, t, tokens_), free_len = max_len_ - cache_len_;
    if (len <= free_len) return 0.0f;
    if (len > max_len_) return -1.0f;
    return static_cast<float>((free_len - len) / cache_len_);
  }

 private:
  double max_len_, cache_len_;
  bool tokens_;
};

class InferenceAwareReward : public RewardFunction {
 public:
  InferenceAwareReward(std::string n, double w, const json& p)
      : RewardFunction(std::move(n), w), a_(p["alpha_latency"]), b_(p["beta_tokens"]), g_(p["gamma_kv_mb"]),
        d_(p["delta_accept"]), e_(p["epsilon_reuse"]), wall_(reward_param_enum(p, "latency", latency_source_names()) == LatencySource::wall), step_s_(p["latency_step_s"]),
        prefill_s_(p["latency_prefill_token_s"]) {}
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"task", "latency", "tokens", "kv_mb", "accept", "reuse"};
    return names;
  }
  float compute(std::string_view p, std::string_view c, const Example& ex, const Telemetry& t) const override {
    double terms[6];
    return compute_terms(p, c, ex, t, terms);
  }
  float compute_terms(std::string_view, std::string_view c, const Example& ex, const Telemetry& t,
                      double* terms) const override {
    const double task = gsm8k_is_correct(c, ex.answer) ? 1.0 : 0.0;
    const double prefilled = double(std::max<int64_t>(0, t.prompt_tokens - t.prefix_hit_tokens));
    const double latency = wall_ ? t.latency_s : step_s_ * double(t.engine_steps) + prefill_s_ * prefilled;
    const double tokens = double(t.n_tokens);
    const double kv_mib = double(t.kv_peak_bytes) / (1024.0 * 1024.0);
    const double accept = t.spec_proposed > 0 ? double(t.spec_accepted) / double(t.spec_proposed) : 0.0;
    const double reuse = t.prompt_tokens > 0 ? double(t.prefix_hit_tokens) / double(t.prompt_tokens) : 0.0;
    terms[0] = task, terms[1] = latency, terms[2] = tokens, terms[3] = kv_mib, terms[4] = accept, terms[5] = reuse;
    return static_cast<float>(task - a_ * latency - b_ * tokens - g_ * kv_mib + d_ * accept + e_ * reuse);
  }

 private:
  double a_, b_, g_, d_, e_;
  bool wall_;
  double step_s_, prefill_s_;
};

bool type_ok(const json& v, RewardParamType t) {
  switch (t) {
    case RewardParamType::number: return v.is_number();
    case RewardParamType::integer: return v.is_number_integer();
    case RewardParamType::boolean: return v.is_boolean();
    case RewardParamType::string: return v.is_string();
    case RewardParamType::string_list:
      if (!v.is_array()) return false;
      for (const auto& e : v)
        if (!e.is_string()) return false;
      return true;
    case RewardParamType::string_table:
      if (!v.is_object()) return false;
      for (const auto& e : v)
        if (!e.is_string()) return false;
      return true;
  }
  return false;
}

const char* type_name(RewardParamType t) {
  switch (t) {
    case RewardParamType::number: return "a number";
    case RewardParamType::integer: return "an integer";
    case RewardParamType::boolean: return "a boolean";
    case RewardParamType::string: return "a string";
    case RewardParamType::string_list: return "an array of strings";
    case RewardParamType::string_table: return "a table of strings";
  }
  return "?";
}

// Checks the value ranges of a function whose params are complete and typed.
Status check_ranges(const std::string& fn, const json& p) {
  auto bad = [&](const char* key, const std::string& why) {
    return error_status("reward '" + fn + "': " + key + " = " + p[key].dump() + ": " + why);
  };
  for (const char* k : {"latency_step_s", "latency_prefill_token_s"})
    if (p.contains(k) && p[k].get<double>() < 0) return bad(k, "must be >= 0 (seconds)");
  if (fn == "length_linear") {
    if (p["target"].get<double>() < 0) return bad("target", "must be >= 0");
    if (p["scale"].get<double>() <= 0) return bad("scale", "must be > 0");
    if (p["max_penalty"].get<double>() < 0) return bad("max_penalty", "must be >= 0");
  }
  if (fn == "length_overlong") {
    if (p["max_len"].get<int64_t>() <= 0) return bad("max_len", "must be > 0");
    if (p["cache_len"].get<int64_t>() <= 0 || p["cache_len"].get<int64_t>() > p["max_len"].get<int64_t>())
      return bad("cache_len", "must be in 1..max_len");
  }
  if (fn == "http" || fn == "command") return remote_reward_check(fn, p);
  return ok_status();
}

}  // namespace

const std::vector<std::string>& RewardFunction::term_names() const {
  static const std::vector<std::string> none;
  return none;
}

std::span<const EnumName<LengthUnit>> length_unit_names() {
  static constexpr EnumName<LengthUnit> n[] = {{"tokens", LengthUnit::tokens}, {"chars", LengthUnit::chars}};
  return n;
}
std::span<const EnumName<LatencySource>> latency_source_names() {
  static constexpr EnumName<LatencySource> n[] = {{"modelled", LatencySource::modelled}, {"wall", LatencySource::wall}};
  return n;
}
std::span<const EnumName<RemoteMode>> remote_mode_names() {
  static constexpr EnumName<RemoteMode> n[] = {{"batch", RemoteMode::batch}, {"single", RemoteMode::single}};
  return n;
}
std::span<const EnumName<OnFailure>> on_failure_names() {
  static constexpr EnumName<OnFailure> n[] = {{"error", OnFailure::error}, {"zero", OnFailure::zero}};
  return n;
}

const std::vector<RewardInfo>& reward_catalog() {
  using T = RewardParamType;
  const auto unit = enum_names(length_unit_names());
  const char* unit_hint = "tokens: Telemetry::n_tokens; chars: bytes of the completion text";
  const auto on_failure = enum_names(on_failure_names());
  const char* on_failure_hint = "error: stop with the reason; zero: score 0 and count it";
  static const std::vector<RewardInfo> cat = {
      {"correct", {}},
      {"format_strict", {{"think_in_prompt", T::boolean, false}}},
      {"format_soft", {{"think_in_prompt", T::boolean, false}}},
      {"length_linear", {{"target", T::number, 256}, {"scale", T::number, 256}, {"max_penalty", T::number, 1.0},
                         {"unit", T::string, "tokens", unit, unit_hint}}},
      {"length_overlong", {{"max_len", T::integer, 1024}, {"cache_len", T::integer, 256},
                           {"unit", T::string, "tokens", unit, unit_hint}}},
      {"inference_aware", {{"alpha_latency", T::number, 0.01}, {"beta_tokens", T::number, 0.0}, {"gamma_kv_mb", T::number, 0.0},
                           {"delta_accept", T::number, 0.0}, {"epsilon_reuse", T::number, 0.0},
                           {"latency", T::string, "modelled", enum_names(latency_source_names()),
                            "modelled: engine steps x a cost model, reproducible; wall: measured seconds"}, {"latency_step_s", T::number, 0.02},
                           {"latency_prefill_token_s", T::number, 0.0001}}},
      {"http", {{"url", T::string, ""}, {"mode", T::string, "batch", enum_names(remote_mode_names()),
                 "batch: {\"items\": [...]} -> {\"scores\": [...]}; single: one item -> {\"score\": x}"}, {"batch_size", T::integer, 16},
                {"max_concurrency", T::integer, 4}, {"timeout", T::number, 30.0}, {"retries", T::integer, 2},
                {"backoff", T::number, 0.5}, {"headers", T::string_table, json::object()},
                {"api_key_env", T::string, ""},
                {"on_failure", T::string, "error", on_failure, on_failure_hint}}},
      {"command", {{"command", T::string_list, json::array()}, {"timeout", T::number, 60.0},
                   {"restart", T::boolean, true}, {"max_in_flight", T::integer, 64},
                   {"on_failure", T::string, "error", on_failure, on_failure_hint}}},
  };
  return cat;
}

const RewardInfo* reward_find(const std::string& name) {
  const std::string n = name == "gsm8k_correct" ? "correct" : name;
  for (const auto& r : reward_catalog())
    if (r.name == n) return &r;
  return nullptr;
}

Result<std::unique_ptr<RewardFunction>> reward_make(const RewardSpec& spec) {
  const RewardInfo* info = reward_find(spec.name);
  if (!info) {
    std::string names;
    for (const auto& r : reward_catalog()) names += (names.empty() ? "" : ", ") + r.name;
    return error_status("unknown reward function '" + spec.name + "'; valid: " + names + ", gsm8k_correct");
  }
  if (!std::isfinite(spec.weight)) return error_status("reward '" + spec.name + "': weight must be finite");
  if (!spec.params.is_object()) return error_status("reward '" + spec.name + "': params must be a table");
  json p = json::object();
  for (const auto& pi : info->params) p[pi.name] = pi.default_value;
  for (auto it = spec.params.begin(); it != spec.params.end(); ++it) {
    const RewardParamInfo* pi = nullptr;
    for (const auto& x : info->params)
      if (x.name == it.key()) pi = &x;
    if (!pi) {
      std::string valid;
      for (const auto& x : info->params) valid += (valid.empty() ? "" : ", ") + x.name;
      return error_status("reward '" + spec.name + "': unknown parameter '" + it.key() + "'; valid: " +
                          (valid.empty() ? "(none besides name, weight)" : valid));
    }
    if (!type_ok(it.value(), pi->type))
      return error_status("reward '" + spec.name + "': " + it.key() + " = " + it.value().dump() + ": expected " + type_name(pi->type));
    if (!pi->choices.empty() &&
        std::find(pi->choices.begin(), pi->choices.end(), it.value().get<std::string>()) == pi->choices.end()) {
      std::string list;
      for (const auto& c : pi->choices) list += (list.empty() ? "" : ", ") + c;
      return error_status("reward '" + spec.name + "': " + it.key() + " = " + it.value().dump() + ": must be one of " +
                          list + " (" + pi->hint + ")");
    }
    p[it.key()] = it.value();
  }
  GRPO_TRY(check_ranges(info->name, p));
  const std::string& n = info->name;
  std::unique_ptr<RewardFunction> fn;
  if (n == "correct") fn = std::make_unique<CorrectReward>(n, spec.weight);
  else if (n == "format_strict") fn = std::make_unique<FormatReward>(n, spec.weight, true, p["think_in_prompt"].get<bool>());
  else if (n == "format_soft") fn = std::make_unique<FormatReward>(n, spec.weight, false, p["think_in_prompt"].get<bool>());
  else if (n == "length_linear") fn = std::make_unique<LengthLinearReward>(n, spec.weight, p);
  else if (n == "length_overlong") fn = std::make_unique<OverlongReward>(n, spec.weight, p);
  else if (n == "inference_aware") fn = std::make_unique<InferenceAwareReward>(n, spec.weight, p);
  else {
    GRPO_ASSIGN_OR_RETURN(fn, remote_reward_make(n, spec.weight, p));
  }
  return fn;
}

bool format_strict_match(std::string_view completion, bool think_in_prompt) {
  std::string s = with_think(completion, think_in_prompt);
  std::string_view v(s);
  size_t i = skip_ws(v, 0);
  if (v.substr(i, 7) != "<think>") return false;
  size_t t_end = v.find("</think>", i + 7);
  if (t_end == std::string_view::npos || has_any_tag(v.substr(i + 7, t_end - i - 7))) return false;
  size_t a = skip_ws(v, t_end + 8);
  if (v.substr(a, 8) != "<answer>") return false;
  size_t a_end = v.find("</answer>", a + 8);
  if (a_end == std::string_view::npos) return false;
  std::string_view ans = v.substr(a + 8, a_end - a - 8);
  if (has_any_tag(ans) || skip_ws(ans, 0) == ans.size()) return false;
  return skip_ws(v, a_end + 9) == v.size();
}

float format_soft_score(std::string_view completion, bool think_in_prompt) {
  std::string s = with_think(completion, think_in_prompt);
  std::string_view v(s);
  for (size_t t = v.find("<think>"); t != std::string_view::npos; t = v.find("<think>", t + 1)) {
    size_t te = v.find("</think>", t + 7);
    if (te == std::string_view::npos) break;
    size_t a = skip_ws(v, te + 8);
    if (v.substr(a, 8) == "<answer>" && v.find("</answer>", a + 8) != std::string_view::npos) return 1.0f;
  }
  float score = 0;
  for (auto tag : kTags)
    if (count_of(v, tag) == 1) score += 0.125f;
  return score;
}

Status RewardFunction::compute_batch(const std::vector<RewardInput>& in, std::vector<float>* out, int64_t*) const {
  out->resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    (*out)[i] = compute(in[i].prompt, in[i].completion, *in[i].example, *in[i].telemetry);
  return ok_status();
}

Result<RewardComposer> RewardComposer::make(const std::vector<RewardSpec>& specs) {
  if (specs.empty()) return error_status("no reward functions configured: add at least one [[reward]] entry");
  RewardComposer c;
  for (const auto& s : specs) {
    GRPO_ASSIGN_OR_RETURN(auto fn, reward_make(s));
    std::string label = fn->name();
    int repeat = 1;
    for (const auto& f : c.fns_)
      if (f->name() == label) ++repeat;
    if (repeat > 1) {
      label += '_';
      label += std::to_string(repeat);
    }
    for (const auto& t : fn->term_names()) c.term_labels_.push_back(label + "/" + t);
    GRPO_TRY(fn->start());
    c.labels_.push_back(label);
    c.fns_.push_back(std::move(fn));
  }
  return c;
}

bool RewardComposer::has_remote() const {
  for (const auto& f : fns_)
    if (f->is_remote()) return true;
  return false;
}

RewardValues RewardComposer::compute(std::string_view prompt, std::string_view completion, const Example& ex,
                                     const Telemetry& tel) const {
  GRPO_CHECK_MSG(!has_remote(), "remote rewards are scored through RewardComposer::compute_batch");
  RewardValues r;
  r.values.reserve(fns_.size());
  r.terms.resize(term_labels_.size());
  size_t k = 0;
  for (const auto& f : fns_) {
    float v = f->compute_terms(prompt, completion, ex, tel, r.terms.data() + k);
    k += f->term_names().size();
    r.values.push_back(v);
    r.total += f->weight() * static_cast<double>(v);
  }
  return r;
}

Result<RewardBatchResult> RewardComposer::compute_batch(const std::vector<RewardInput>& in) const {
  const size_t F = fns_.size();
  std::vector<std::vector<float>> scores(F);
  std::vector<Status> status(F);
  RewardBatchResult r;
  r.n_failed.assign(F, 0);
  r.seconds.assign(F, 0.0);
  // Sub-terms of function f, input i: terms[f][i * n_terms(f) + t] (local functions only).
  std::vector<std::vector<double>> terms(F);
  auto run = [&](size_t f) {
    const double t0 = now_seconds();
    const size_t nt = fns_[f]->term_names().size();
    if (nt > 0) {
      GRPO_CHECK_MSG(!fns_[f]->is_remote(), "a remote reward function cannot report sub-terms");
      scores[f].resize(in.size());
      terms[f].resize(in.size() * nt);
      for (size_t i = 0; i < in.size(); ++i)
        scores[f][i] = fns_[f]->compute_terms(in[i].prompt, in[i].completion, *in[i].example, *in[i].telemetry,
                                              terms[f].data() + i * nt);
    } else {
      status[f] = fns_[f]->compute_batch(in, &scores[f], &r.n_failed[f]);
    }
    r.seconds[f] = now_seconds() - t0;
  };
  std::vector<std::thread> remote;
  for (size_t f = 0; f < F; ++f)
    if (fns_[f]->is_remote()) remote.emplace_back(run, f);
  for (size_t f = 0; f < F; ++f)
    if (!fns_[f]->is_remote()) run(f);
  for (auto& t : remote) t.join();
  for (size_t f = 0; f < F; ++f) {
    if (!status[f].ok()) return status[f];
    GRPO_CHECK_MSG(scores[f].size() == in.size(), "a reward function returned the wrong number of scores");
  }
  r.values.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    RewardValues& v = r.values[i];
    v.values.resize(F);
    v.terms.reserve(term_labels_.size());
    for (size_t f = 0; f < F; ++f) {
      v.values[f] = scores[f][i];
      v.total += fns_[f]->weight() * double(scores[f][i]);
      const size_t nt = fns_[f]->term_names().size();
      v.terms.insert(v.terms.end(), terms[f].begin() + long(i * nt), terms[f].begin() + long((i + 1) * nt));
    }
  }
  return r;
}

std::vector<std::pair<std::string, double>> RewardComposer::summarize(const std::vector<RewardValues>& batch) const {
  std::vector<std::pair<std::string, double>> out;
  if (batch.empty()) return out;
  double n = static_cast<double>(batch.size()), mean = 0, var = 0;
  for (const auto& r : batch) mean += r.total;
  mean /= n;
  for (const auto& r : batch) var += (r.total - mean) * (r.total - mean);
  out.push_back({"reward/mean", mean});
  out.push_back({"reward/std", std::sqrt(var / n)});
  for (size_t i = 0; i < fns_.size(); ++i) {
    double m = 0;
    for (const auto& r : batch) m += r.values[i];
    out.push_back({"rewards/" + labels_[i] + "/mean", m / n});
  }
  for (size_t k = 0; k < term_labels_.size(); ++k) {
    double m = 0;
    for (const auto& r : batch) m += r.terms[k];
    out.push_back({"rewards/" + term_labels_[k], m / n});
  }
  return out;
}

}  // namespace grpo
