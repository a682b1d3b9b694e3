// Reward functions and their weighted composition.
//
// Each function maps (prompt, completion, example, telemetry) to a float; the
// composer returns the weighted total AND every function's unweighted value so
// that each can be logged on its own ("rewards/<label>/mean").
//
// Functions (name: params, defaults):
//   correct (alias gsm8k_correct): 1 if the extracted final answer equals the
//       gold answer numerically (gsm8k.h), else 0.
//   format_strict: think_in_prompt=false. 1 iff the WHOLE completion is
//       <think>T</think><answer>A</answer>, where whitespace (space, tab, CR,
//       LF) is allowed only before <think>, between </think> and <answer>,
//       and after </answer>; T and A contain none of the four tags; A is not
//       blank (T may be). think_in_prompt=true: the prompt already ends with
//       "<think>", so the completion starts inside the think block.
//   format_soft: think_in_prompt=false. 1 if "<think>..</think>" followed
//       (after optional whitespace) by "<answer>..</answer>" occurs anywhere;
//       else 0.125 for each of the four tags that occurs exactly once (<= 0.5).
//   length_linear: target=256, scale=256, max_penalty=1, unit="tokens".
//       -min(max_penalty, (n - target) / scale) for n > target, else 0.
//   length_overlong (DAPO soft overlong punishment): max_len=1024,
//       cache_len=256, unit="tokens". With L_max=max_len, L_c=cache_len:
//       0 for n <= L_max - L_c; ((L_max - L_c) - n) / L_c up to n = L_max
//       (linear from 0 to -1); -1 beyond L_max.
//   inference_aware: alpha_latency=0.01, beta_tokens=0, gamma_kv_mb=0,
//       delta_accept=0, epsilon_reuse=0, latency="modelled",
//       latency_step_s=0.02, latency_prefill_token_s=0.0001.
//       task - alpha*latency - beta*n_tokens - gamma*KV_MiB
//            + delta*accept + epsilon*reuse, with
//       task = correct (0/1); KV_MiB = kv_peak_bytes / 2^20;
//       accept = spec_accepted / spec_proposed, 0 when nothing was drafted
//         (so delta only pays where a draft ran);
//       reuse = prefix_hit_tokens / prompt_tokens, 0 when prompt_tokens is 0;
//       latency (seconds): "modelled" = latency_step_s * engine_steps
//         + latency_prefill_token_s * (prompt_tokens - prefix_hit_tokens),
//         a pure function of the request's telemetry (same rollouts, same
//         reward; speculative decoding lowers engine_steps per token);
//         "wall" = the measured admitted -> finished time (not reproducible).
//       Terms (unweighted, logged as reward/<label>/<term>): task, latency,
//       tokens, kv_mb, accept, reuse.
// "unit" is "tokens" (Telemetry::n_tokens, which the caller must fill) or
// "chars" (bytes of the completion text).
//
// Remote functions (remote_reward.h, docs/rewards.md) score outside C++:
//   http: POSTs completions to a URL and reads their scores back.
//   command: a long-lived subprocess speaking JSON lines on stdin/stdout.
// They can fail (network, a dead process), so they are scored through
// RewardComposer::compute_batch, which runs each remote function over the
// whole batch concurrently with the local ones and returns their errors.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/enum_table.h"
#include "core/status.h"
#include "env/dataset.h"
#include "env/telemetry.h"

namespace grpo {

// string_list: an array of strings (a command's argv); string_table: a table
// of string values (HTTP headers).
enum class RewardParamType { number, integer, boolean, string, string_list, string_table };

// A parameter's allowed values when it is enum-like (empty: any value of its type).
// Each comes from the value's one name table; the hint explains the choice in errors.
struct RewardParamInfo {
  std::string name;
  RewardParamType type;
  nlohmann::json default_value;
  std::vector<std::string> choices = {};
  const char* hint = "";
};

// Enum-like string parameters (their spellings are the TOML values).
enum class LengthUnit { tokens, chars };        // length_linear, length_overlong: unit
enum class LatencySource { modelled, wall };    // inference_aware: latency
enum class RemoteMode { batch, single };        // http: mode
enum class OnFailure { error, zero };           // http, command: on_failure
std::span<const EnumName<LengthUnit>> length_unit_names();
std::span<const EnumName<LatencySource>> latency_source_names();
std::span<const EnumName<RemoteMode>> remote_mode_names();
std::span<const EnumName<OnFailure>> on_failure_names();

// The enum of a choice parameter of params that reward_make has completed and
// checked (precondition: p[key] is one of the table's names).
template <class E>
E reward_param_enum(const nlohmann::json& p, const char* key, std::span<const EnumName<E>> table) {
  return *enum_parse(table, p.at(key).template get<std::string>());
}

struct RewardInfo {
  std::string name;
  std::vector<RewardParamInfo> params;
};

// All known functions with their parameters (for config validation and help).
const std::vector<RewardInfo>& reward_catalog();
// nullptr if unknown; resolves the alias gsm8k_correct -> correct.
const RewardInfo* reward_find(const std::string& name);

struct RewardSpec {
  std::string name;
  double weight = 1.0;
  nlohmann::json params = nlohmann::json::object();  // only keys listed in the catalog
};

// One completion to score; the pointed-to data outlives the call.
struct RewardInput {
  std::string_view prompt;
  std::string_view completion;
  const Example* example = nullptr;
  const Telemetry* telemetry = nullptr;
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  const std::string& name() const { return name_; }
  double weight() const { return weight_; }
  // Local functions only: remote ones abort here (they need compute_batch,
  // which can report their errors).
  virtual float compute(std::string_view prompt, std::string_view completion, const Example& ex,
                        const Telemetry& tel) const = 0;
  // Sub-terms a composite function reports next to its value; empty for most.
  virtual const std::vector<std::string>& term_names() const;
  // compute(), also writing term_names().size() unweighted term values to `terms`.
  virtual float compute_terms(std::string_view prompt, std::string_view completion, const Example& ex,
                              const Telemetry& tel, double* terms) const {
    (void)terms;
    return compute(prompt, completion, ex, tel);
  }
  // Scores every input into (*out)[i]. A remote function configured with
  // on_failure = "zero" scores what it could not get 0 and adds the count to
  // *n_failed; with "error" it returns a status naming the function and the
  // reason. The default calls compute() per input.
  virtual Status compute_batch(const std::vector<RewardInput>& in, std::vector<float>* out, int64_t* n_failed) const;
  // True for functions that leave the process (their failures and timing are logged).
  virtual bool is_remote() const { return false; }
  // Acquires what scoring needs (a subprocess). Called by RewardComposer::make,
  // not by reward_make, so that validating a config starts nothing.
  virtual Status start() { return ok_status(); }

 protected:
  RewardFunction(std::string name, double weight) : name_(std::move(name)), weight_(weight) {}

 private:
  std::string name_;
  double weight_;
};

// Builds a function; errors name the function and the bad parameter
// (unknown parameter, wrong type, out-of-range value).
Result<std::unique_ptr<RewardFunction>> reward_make(const RewardSpec& spec);

struct RewardValues {
  double total = 0;           // sum_i weight_i * values[i]
  std::vector<float> values;  // unweighted, in composer order
  std::vector<double> terms;  // every function's sub-terms, in composer order (RewardComposer::term_label)
};

// What compute_batch returns: values[i] for input i, and per function (composer
// order) the number of inputs a remote function failed to score and its wall time.
struct RewardBatchResult {
  std::vector<RewardValues> values;
  std::vector<int64_t> n_failed;
  std::vector<double> seconds;
};

class RewardComposer {
 public:
  static Result<RewardComposer> make(const std::vector<RewardSpec>& specs);
  size_t size() const { return fns_.size(); }
  // Logging label of function i: its name, or "name_2", "name_3" for repeats.
  const std::string& label(size_t i) const { return labels_[i]; }
  const RewardFunction& function(size_t i) const { return *fns_[i]; }
  // Sub-terms over all functions: RewardValues::terms[k] is "<label>/<term>".
  size_t n_terms() const { return term_labels_.size(); }
  const std::string& term_label(size_t k) const { return term_labels_[k]; }
  bool has_remote() const;
  // One completion through local functions only (aborts if a remote one is configured).
  RewardValues compute(std::string_view prompt, std::string_view completion, const Example& ex,
                       const Telemetry& tel) const;
  // A whole batch: every remote function runs on its own thread (each scoring
  // its inputs concurrently up to its own limit) while the local ones run on
  // the caller's thread. Errors come from remote functions with on_failure = "error".
  Result<RewardBatchResult> compute_batch(const std::vector<RewardInput>& in) const;
  // Batch summary: "reward/mean", "reward/std" (population) of totals, and
  // "rewards/<label>/mean" for each function. Empty batch: empty list.
  std::vector<std::pair<std::string, double>> summarize(const std::vector<RewardValues>& batch) const;

 private:
  std::vector<std::unique_ptr<RewardFunction>> fns_;
  std::vector<std::string> labels_;
  std::vector<std::string> term_labels_;
};

// Format checks used by the format rewards (exposed for tests).
bool format_strict_match(std::string_view completion, bool think_in_prompt);
float format_soft_score(std::string_view completion, bool think_in_prompt);

}  // namespace grpo
