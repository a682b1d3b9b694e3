// RunConfig value checks and path resolution. Parsing/dumping: run_config_io.cpp.
#include "train/run_config.h"
#include "train/lora_setup.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/log.h"
#include "dist/weight_broadcast.h"
#include "engine/speculative.h"
#include "kernels/validate.h"
#include "env/arithmetic.h"
#include "env/dataset.h"
#include "env/gsm8k.h"
#include "env/remote_reward.h"

namespace grpo {

namespace {

std::string show(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
std::string show(int64_t v) { return std::to_string(v); }
std::string show(const std::string& v) { return "\"" + v + "\""; }

// Collects the first failure; each check names its key and value.
class Checker {
 public:
  template <class T>
  void require(bool ok, const char* key, const T& value, const std::string& why) {
    if (!ok && status_.ok()) status_ = error_status(std::string(key) + " = " + show(value) + ": " + why);
  }
  // For values set in code: a value outside the key's table (e.g. model.dtype = i32).
  template <class E>
  void in_table(const char* key, E v, std::span<const EnumName<E>> table) {
    require(enum_parse(table, enum_name(table, v)) == v, key, std::string(enum_name(table, v)),
            "must be one of " + enum_allowed(table));
  }
  void check(const Status& s) {  // a sub-struct's own validate(), whose message names its keys
    if (!s.ok() && status_.ok()) status_ = s;
  }
  void finite(const char* key, double v) { require(std::isfinite(v), key, v, "must be a finite number"); }
  Status status() const { return status_; }

 private:
  Status status_;
};

}  // namespace

std::optional<DeviceSpec> device_spec_parse(std::string_view s) {
  if (s == "cpu") return DeviceSpec{Device::cpu, -1};
  if (s == "cuda") return DeviceSpec{Device::cuda, -1};
  if (!s.starts_with("cuda:")) return std::nullopt;
  const std::string_view n = s.substr(5);
  // Canonical digits only (no sign, no leading zero), so the name prints back as written.
  if (n.empty() || n.size() > 4 || (n.size() > 1 && n[0] == '0')) return std::nullopt;
  int index = 0;
  for (char ch : n) {
    if (ch < '0' || ch > '9') return std::nullopt;
    index = index * 10 + (ch - '0');
  }
  return DeviceSpec{Device::cuda, index};
}

std::string device_spec_name(DeviceSpec d) {
  if (d.kind == Device::cpu) return "cpu";
  return d.index < 0 ? "cuda" : "cuda:" + std::to_string(d.index);
}

std::span<const EnumName<ArithmeticStyle>> arithmetic_style_names() {
  static constexpr EnumName<ArithmeticStyle> n[] = {
      {"compact", ArithmeticStyle::compact}, {"verbose", ArithmeticStyle::verbose}, {"expression", ArithmeticStyle::expression}};
  return n;
}
std::span<const EnumName<BadLinePolicy>> bad_line_names() {
  static constexpr EnumName<BadLinePolicy> n[] = {{"fail", BadLinePolicy::fail}, {"skip", BadLinePolicy::skip}};
  return n;
}
std::span<const EnumName<LrScheduleType>> lr_schedule_names() {
  static constexpr EnumName<LrScheduleType> n[] = {
      {"constant", LrScheduleType::constant}, {"linear", LrScheduleType::linear}, {"cosine", LrScheduleType::cosine}};
  return n;
}
std::span<const EnumName<ProgressSetting>> progress_names() {
  static constexpr EnumName<ProgressSetting> n[] = {{"auto", ProgressSetting::automatic}, {"bar", ProgressSetting::bar},
                                                    {"plain", ProgressSetting::plain}, {"off", ProgressSetting::off}};
  return n;
}
std::span<const EnumName<LogLevel>> log_level_names() {
  static constexpr EnumName<LogLevel> n[] = {{"debug", LogLevel::debug}, {"info", LogLevel::info},
                                             {"warn", LogLevel::warn}, {"error", LogLevel::error},
                                             {"quiet", LogLevel::quiet}};
  return n;
}

std::span<const EnumName<CurriculumType>> curriculum_type_names() {
  static constexpr EnumName<CurriculumType> n[] = {{"none", CurriculumType::none}, {"kde_valley", CurriculumType::kde_valley}};
  return n;
}

std::span<const EnumName<DType>> model_dtype_names() {
  static constexpr EnumName<DType> n[] = {{"bf16", DType::bf16}, {"f16", DType::f16}, {"f32", DType::f32}};
  return n;
}
std::span<const EnumName<OnPolicy>> on_policy_names() {
  static constexpr EnumName<OnPolicy> n[] = {{"default", OnPolicy::standard}, {"bitwise", OnPolicy::bitwise}};
  return n;
}
std::span<const EnumName<ServerOnFailure>> server_on_failure_names() {
  static constexpr EnumName<ServerOnFailure> n[] = {{"error", ServerOnFailure::error}, {"local", ServerOnFailure::local}};
  return n;
}
std::span<const EnumName<EnvKind>> env_kind_names() {
  static constexpr EnumName<EnvKind> n[] = {{"gsm8k", EnvKind::gsm8k}, {"arithmetic", EnvKind::arithmetic},
                                            {"jsonl", EnvKind::jsonl}, {"remote", EnvKind::remote}};
  return n;
}
std::span<const EnumName<Split>> eval_split_names() {
  static constexpr EnumName<Split> n[] = {{"test", Split::test}, {"train", Split::train}};
  return n;
}
std::span<const EnumName<EarlyStoppingMetric>> early_stopping_metric_names() {
  static constexpr EnumName<EarlyStoppingMetric> n[] = {{"eval/accuracy", EarlyStoppingMetric::accuracy},
                                                        {"eval/reward", EarlyStoppingMetric::reward}};
  return n;
}
std::span<const EnumName<StalePolicy>> stale_policy_names() {
  static constexpr EnumName<StalePolicy> n[] = {{"drop", StalePolicy::drop}, {"down_weight", StalePolicy::down_weight}};
  return n;
}

Status RunConfig::validate() const {
  Checker c;
  c.require(!run.output_dir.empty(), "run.output_dir", run.output_dir, "must not be empty");
  c.in_table("model.dtype", model.dtype, model_dtype_names());
  c.require(device_spec_parse(device_spec_name(model.device)) == model.device, "model.device",
            device_spec_name(model.device), std::string("must be one of ") + kDeviceSpecAllowed);
  {
    const Device dev = model.device.kind;
    c.require(backend_runs_dtype(dev, model.dtype), "model.dtype", std::string(enum_name(model_dtype_names(), model.dtype)),
              dev == Device::cpu ? "the CPU backend runs f32 only; set model.dtype = \"f32\" (or model.device = \"cuda\")"
                                 : "the CUDA backend runs bf16 or f32; set model.dtype = \"bf16\"");
  }

  c.require(data.env != EnvKind::jsonl || !data.train_path.empty(), "data.train_path", data.train_path,
            "required when data.env = \"jsonl\"");
  c.require(!data.prompt_field.empty(), "data.prompt_field", data.prompt_field, "must not be empty");
  c.require(!data.answer_field.empty(), "data.answer_field", data.answer_field, "must not be empty");
  auto rendered = prompt_render(data.prompt_template, Example{});
  c.require(rendered.ok(), "data.prompt_template", data.prompt_template, rendered.status().message());
  c.require(data.prompt_template.find("{question}") != std::string::npos, "data.prompt_template",
            data.prompt_template, "must contain {question}");
  c.require(!(data.env == EnvKind::jsonl && data.eval_split == Split::test && data.eval_path.empty() && eval.every > 0),
            "data.eval_path", data.eval_path, "required for eval.every > 0 on the test split of a jsonl dataset");
  c.require(data.eval_size >= 0, "data.eval_size", data.eval_size, "must be >= 0 (0 = whole split)");
  c.require(data.seed >= 0, "data.seed", data.seed, "must be >= 0");
  const ArithmeticSection& a = data.arithmetic;
  c.require(a.difficulty >= 0 && a.difficulty <= 3, "data.arithmetic.difficulty", a.difficulty, "must be 0..3");
  c.require(a.train_size > 0, "data.arithmetic.train_size", a.train_size, "must be > 0");
  c.require(a.test_size > 0, "data.arithmetic.test_size", a.test_size, "must be > 0");
  c.require(a.test_permille >= 1 && a.test_permille <= 900, "data.arithmetic.test_permille", a.test_permille, "must be 1..900");

  const RolloutSection& r = rollout;
  c.require(r.num_generations >= 2, "rollout.num_generations", r.num_generations,
            "must be >= 2 (GRPO compares completions within a group)");
  c.require(r.prompts_per_step >= 1, "rollout.prompts_per_step", r.prompts_per_step, "must be >= 1");
  c.require(r.max_new_tokens >= 1, "rollout.max_new_tokens", r.max_new_tokens, "must be >= 1");
  c.finite("rollout.temperature", r.temperature);
  c.require(r.temperature > 0, "rollout.temperature", r.temperature,
            "must be > 0 (GRPO needs sampling; greedy decoding is for eval.greedy)");
  c.require(r.top_p > 0 && r.top_p <= 1, "rollout.top_p", r.top_p, "must be in (0, 1]");
  c.require(r.top_k >= 0, "rollout.top_k", r.top_k, "must be >= 0 (0 = off)");
  c.require(r.min_p >= 0 && r.min_p < 1, "rollout.min_p", r.min_p, "must be in [0, 1)");
  c.require(r.seed >= 0, "rollout.seed", r.seed, "must be >= 0");
  for (const auto& s : r.stop) c.require(!s.empty(), "rollout.stop", s, "stop strings must not be empty");
  c.require(r.min_new_tokens >= 0 && r.min_new_tokens <= r.max_new_tokens, "rollout.min_new_tokens", r.min_new_tokens,
            "must be in 0..rollout.max_new_tokens");
  if (!r.server_url.empty()) {
    // The base URL only: the loop adds /health and /v1/completions itself.
    const char* k = "rollout.server_url";
    const std::string how = "must be the base URL of a grpo serve (or vLLM-compatible) server, http://HOST:PORT, e.g. "
                            "\"http://127.0.0.1:8001\" (\"\" = sample with the in-process engine)";
    auto u = http_url_parse(r.server_url);
    c.require(u.ok(), k, r.server_url, u.ok() ? how : u.status().message() + "; " + how);
    if (u.ok()) {
      c.require(!u.value().https, k, r.server_url, "https is not supported for rollouts; " + how);
      c.require(u.value().path == "/" || u.value().path.empty(), k, r.server_url,
                "has a path ('" + u.value().path + "'); give the server's base URL without /v1 or an endpoint: " + how);
      c.require(u.value().host.find_first_of(" \t?#@") == std::string::npos, k, r.server_url, how);
    }
    c.require(!tandem.enabled, k, r.server_url,
              "rollouts from a server cannot be written in tandem (tandem.enabled = true needs the in-process engine); "
              "set tandem.enabled = false or rollout.server_url = \"\"");
    c.require(!engine.speculative.options().enabled(), k, r.server_url,
              "engine.speculative configures the in-process engine, which does not sample the rollouts then; set "
              "engine.speculative.method = \"off\"");
    c.require(train.on_policy != OnPolicy::bitwise, k, r.server_url,
              "train.on_policy = \"bitwise\" needs the in-process engine's trainer-kernel logprobs; set "
              "train.on_policy = \"default\" (and train.importance_sampling) or rollout.server_url = \"\"");
    c.require(!server.enabled, k, r.server_url,
              "server.enabled = true serves the in-process engine while it samples the rollouts, which it no longer "
              "does (outside requests would wait for the next eval); send them to the rollout server instead and set "
              "server.enabled = false (server.bridge works without it)");
    c.require(data.env != EnvKind::remote, k, r.server_url,
              "has no effect with data.env = \"remote\" (outside environments sample their own groups); set "
              "rollout.server_url = \"\"");
  }
  c.finite("rollout.server_timeout_s", r.server_timeout_s);
  c.require(r.server_timeout_s > 0 && r.server_timeout_s <= 86400, "rollout.server_timeout_s", r.server_timeout_s,
            "must be in (0, 86400] seconds (the longest one rollout request may take)");
  c.require(r.server_max_concurrency >= 1 && r.server_max_concurrency <= 4096, "rollout.server_max_concurrency",
            r.server_max_concurrency, "must be in [1, 4096] (HTTP requests in flight at once)");
  c.in_table("rollout.server_on_failure", r.server_on_failure, server_on_failure_names());
  if (r.server_on_failure == ServerOnFailure::local) {
    const char* k = "rollout.server_on_failure";
    const std::string v = "local";
    c.require(!r.server_url.empty(), k, v,
              "says what to do when the rollout server is lost, but rollout.server_url is empty (the in-process "
              "engine samples already); set rollout.server_url, or leave rollout.server_on_failure = \"error\"");
    // The bridge sends after each step, before the next rollout: a lost server fails it first.
    c.require(server.bridge != "nccl" || server.bridge_on_failure == "continue", k, v,
              "with server.bridge = \"nccl\" a lost server takes the weight bridge down first, and "
              "server.bridge_on_failure = \"" + server.bridge_on_failure +
                  "\" stops the run there; set server.bridge_on_failure = \"continue\" (the bridge waits for the "
                  "restarted server while the in-process engine samples)");
  }
  c.check(engine.validate());

  const TrainSection& t = train;
  c.require(t.steps >= 1, "train.steps", t.steps, "must be >= 1");
  c.finite("train.lr", t.lr);
  c.require(t.lr > 0, "train.lr", t.lr, "must be > 0");
  c.require(t.warmup_steps >= 0 && t.warmup_steps <= t.steps, "train.warmup_steps", t.warmup_steps, "must be in 0..train.steps");
  c.require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0");
  c.require(t.adam_beta1 >= 0 && t.adam_beta1 < 1, "train.adam_beta1", t.adam_beta1, "must be in [0, 1)");
  c.require(t.adam_beta2 >= 0 && t.adam_beta2 < 1, "train.adam_beta2", t.adam_beta2, "must be in [0, 1)");
  c.require(t.adam_eps > 0, "train.adam_eps", t.adam_eps, "must be > 0");
  c.require(t.max_grad_norm >= 0, "train.max_grad_norm", t.max_grad_norm, "must be >= 0 (0 = no clipping)");
  c.require(t.micro_batch >= 1, "train.micro_batch", t.micro_batch, "must be >= 1");
  c.require(t.micro_batch_tokens >= 1, "train.micro_batch_tokens", t.micro_batch_tokens, "must be >= 1");
  c.require(t.grad_accum >= 1, "train.grad_accum", t.grad_accum, "must be >= 1");
  c.require(t.steps_per_generation >= 1, "train.steps_per_generation", t.steps_per_generation, "must be >= 1");
  c.require(t.num_iterations >= 1, "train.num_iterations", t.num_iterations, "must be >= 1");
  c.require(t.loss_type != LossType::cispo || t.epsilon_high >= 1, "train.epsilon_high", t.epsilon_high,
            "loss_type \"cispo\" caps its importance weight at epsilon_high itself (TRL's epsilon_max), so below 1 "
            "it scales down every on-policy token; set train.epsilon_high >= 1 (ScaleRL uses 5.0)");
  c.require(t.beta >= 0, "train.beta", t.beta, "must be >= 0");
  c.require(t.epsilon > 0 && t.epsilon < 1, "train.epsilon", t.epsilon, "must be in (0, 1)");
  c.require(t.epsilon_high == 0 || t.epsilon_high >= t.epsilon, "train.epsilon_high", t.epsilon_high,
            "must be 0 (= epsilon) or >= train.epsilon");
  c.require(t.importance_sampling_cap >= 1, "train.importance_sampling_cap", t.importance_sampling_cap, "must be >= 1");
  if (t.on_policy == OnPolicy::bitwise) {
    const char* k = "train.on_policy";
    const std::string v = "bitwise";
    if (model.device.kind == Device::cuda) {
      c.require(model.dtype == DType::bf16, k, v,
                "needs model.dtype = \"bf16\" on CUDA: the batch-invariant GEMM both sides share is the bf16 wgmma "
                "kernel (docs/bitwise.md); or run on model.device = \"cpu\"");
      c.require(!lora.enabled, k, v,
                "does not support LoRA adapters on CUDA yet (their rank-r products are below the batch-invariant "
                "GEMM's smallest K of 64); set lora.enabled = false, or run on model.device = \"cpu\"");
    }
    c.require(engine.kv_cache_dtype == KvCacheDtype::automatic, k, v,
              "needs engine.kv_cache_dtype = \"auto\": the trainer attends over unquantised K/V, so rollouts over an "
              "FP8 cache cannot match it bit for bit");
    c.require(!engine.speculative.options().enabled(), k, v,
              "does not support speculative decoding yet; set engine.speculative.method = \"off\"");
    c.require(!tandem.enabled, k, v, "does not support tandem training yet; set tandem.enabled = false");
    c.require(async.max_staleness == 0, k, v,
              "compares the rollout with the trainer at the same weights, but [async] samples from older ones; "
              "set async.max_staleness = 0");
    c.require(data.env != EnvKind::remote, k, v,
              "has no effect on trajectories posted by outside environments (data.env = \"remote\"), whose logprobs "
              "come from their own engine");
    c.require(rollout.top_k == 0 && rollout.top_p >= 1.0 && rollout.min_p <= 0.0, k, v,
              "needs rollout.top_k = 0, top_p = 1 and min_p = 0: the trainer scores the full-vocabulary "
              "distribution at the sampling temperature, so rollouts must sample from it");
  }
  c.require(t.max_consecutive_skipped_steps >= 0, "train.max_consecutive_skipped_steps",
            t.max_consecutive_skipped_steps, "must be >= 0 (0 = never stop)");

  c.require(!reward.empty(), "reward", std::string("[]"), "configure at least one [[reward]] function");
  for (size_t i = 0; i < reward.size(); ++i) {
    auto fn = reward_make(reward[i]);
    if (!fn.ok()) c.require(false, ("reward[" + std::to_string(i) + "]").c_str(), reward[i].name, fn.status().message());
  }

  c.require(eval.every >= 0, "eval.every", eval.every, "must be >= 0 (0 = off)");
  c.require(eval.temperature >= 0, "eval.temperature", eval.temperature, "must be >= 0");
  c.require(eval.n_prompts >= 0, "eval.n_prompts", eval.n_prompts, "must be >= 0");
  c.require(eval.max_new_tokens >= 0, "eval.max_new_tokens", eval.max_new_tokens, "must be >= 0");
  c.require(eval.early_stopping_patience >= 0, "eval.early_stopping_patience", eval.early_stopping_patience, "must be >= 0");
  c.require(eval.early_stopping_patience == 0 || eval.every > 0, "eval.early_stopping_patience",
            eval.early_stopping_patience, "needs eval.every > 0");
  c.in_table("eval.early_stopping_metric", eval.early_stopping_metric, early_stopping_metric_names());
  c.require(eval.early_stopping_min_delta >= 0, "eval.early_stopping_min_delta", eval.early_stopping_min_delta, "must be >= 0");

  c.require(tandem.p_trained >= 0 && tandem.p_trained <= 1, "tandem.p_trained", tandem.p_trained, "must be in [0, 1]");
  c.require(tandem.chunk_size >= 1, "tandem.chunk_size", tandem.chunk_size, "must be >= 1");
  c.require(tandem.partner_weight >= 0, "tandem.partner_weight", tandem.partner_weight,
            "must be >= 0 (0: partner tokens carry no loss; 1: as much as the trained model's)");
  c.require(tandem.seed >= 0, "tandem.seed", tandem.seed, "must be >= 0");
  c.require(!tandem.enabled || engine.speculative.method == SpecMethod::off, "engine.speculative.method",
            std::string(spec_method_name(engine.speculative.method)),
            "speculative decoding cannot be combined with tandem decoding (tandem.enabled = true); set it to \"off\"");

  c.require(dist.zero_stage == 0 || dist.zero_stage == 1, "dist.zero_stage", dist.zero_stage,
            "must be 0 (replicated optimizer) or 1 (ZeRO-1: sharded optimizer state)");
  c.require(dist.bucket_mb > 0, "dist.bucket_mb", dist.bucket_mb, "must be > 0");
  c.require(dist.timeout_s > 0, "dist.timeout_s", dist.timeout_s, "must be > 0 seconds");
  c.require(async.max_staleness >= 0 && async.max_staleness <= 64, "async.max_staleness", async.max_staleness,
            "must be in [0, 64] (0 = synchronous rollouts)");
  c.require(async.engine_threads >= 0 && async.engine_threads <= 4096, "async.engine_threads", async.engine_threads,
            "must be >= 0 (0 = half of the CPU threads)");
  c.require(checkpoint.every >= 0, "checkpoint.every", checkpoint.every, "must be >= 0");
  c.require(checkpoint.keep_last >= 0, "checkpoint.keep_last", checkpoint.keep_last, "must be >= 0 (0 = keep all)");
  c.require(log.every >= 1, "log.every", log.every, "must be >= 1");

  const auto& cu = curriculum;
  c.require(cu.ema_init >= 0 && cu.ema_init <= 1, "curriculum.ema_init", cu.ema_init, "must be in [0, 1]");
  c.require(cu.ema_decay >= 0 && cu.ema_decay < 1, "curriculum.ema_decay", cu.ema_decay,
            "must be in [0, 1) (the weight kept on the old EMA)");
  c.require(cu.bandwidth > 0, "curriculum.bandwidth", cu.bandwidth, "must be > 0");
  c.require(cu.grid_points >= 3 && cu.grid_points <= 100000, "curriculum.grid_points", cu.grid_points, "must be in 3..100000");
  c.require(cu.n_clusters >= 1 && cu.n_clusters <= 64, "curriculum.n_clusters", cu.n_clusters, "must be in 1..64");
  c.require(cu.alpha >= 0, "curriculum.alpha", cu.alpha, "must be >= 0 (harder clusters get more rollouts)");
  c.require(cu.max_generations >= 0, "curriculum.max_generations", cu.max_generations, "must be >= 0 (0 = no cap)");
  c.require(cu.report_every >= 0, "curriculum.report_every", cu.report_every, "must be >= 0");
  c.require(!server.host.empty(), "server.host", server.host, "must not be empty (127.0.0.1, or 0.0.0.0 for every interface)");
  c.require(server.port >= 0 && server.port <= 65535, "server.port", server.port, "must be in [0, 65535] (0 = any free port)");
  c.require(server.max_body_bytes >= 1024, "server.max_body_bytes", server.max_body_bytes, "must be >= 1024");
  c.require(server.max_prompt_tokens >= 0, "server.max_prompt_tokens", server.max_prompt_tokens, "must be >= 0 (0 = the context length)");
  c.require(server.max_tokens_limit >= 1 && server.max_tokens_limit <= (int64_t(1) << 30), "server.max_tokens_limit", server.max_tokens_limit, "must be >= 1");
  c.require(server.max_n >= 1 && server.max_n <= 1024, "server.max_n", server.max_n, "must be in [1, 1024]");
  c.require(server.max_queued_requests >= 1 && server.max_queued_requests <= 1000000, "server.max_queued_requests",
            server.max_queued_requests, "must be in [1, 1000000]");
  c.require(server.bridge == "none" || server.bridge == "ipc" || server.bridge == "nccl", "server.bridge", server.bridge,
            "must be \"none\", \"ipc\" (CUDA IPC to grpo serve --attach) or \"nccl\" (broadcast to grpo serve "
            "--receive); checkpoint reloads need no key: grpo serve --watch");
  c.require(server.bridge_servers >= 1 && server.bridge_servers <= 1024, "server.bridge_servers", server.bridge_servers,
            "must be in [1, 1024]");
  c.require(server.bridge_bucket_mib >= 1 && server.bridge_bucket_mib <= 4096, "server.bridge_bucket_mib",
            server.bridge_bucket_mib, "must be in [1, 4096]");
  c.require(server.bridge_on_failure == "error" || server.bridge_on_failure == "continue", "server.bridge_on_failure",
            server.bridge_on_failure, "must be \"error\" (stop training) or \"continue\" (train on without the servers)");
  {
    std::string host;
    int port = 0;
    c.require(server.bridge != "nccl" || bridge_parse_addr(server.bridge_addr, "server.bridge_addr", &host, &port).ok(),
              "server.bridge_addr", server.bridge_addr, "must be HOST:PORT with a port in 1..65535, e.g. 127.0.0.1:29650");
  }
  c.require(server.bridge_timeout_s > 0, "server.bridge_timeout_s", server.bridge_timeout_s, "must be > 0 seconds");
  const RemoteSection& rm = remote;
  c.require(rm.url.empty() || rm.url.rfind("http://", 0) == 0, "remote.url", rm.url,
            "must start with http:// (e.g. http://127.0.0.1:8000), or be empty to host the API in this process");
  c.require(!rm.host.empty(), "remote.host", rm.host, "must not be empty (127.0.0.1, or 0.0.0.0 for every interface)");
  c.require(rm.port >= 0 && rm.port <= 65535, "remote.port", rm.port, "must be in [0, 65535] (0 = any free port)");
  c.require(rm.max_queued_sequences >= 0, "remote.max_queued_sequences", rm.max_queued_sequences, "must be >= 0 (0 = 16 steps' worth)");
  c.finite("remote.stale_weight", rm.stale_weight);
  c.require(rm.stale_weight > 0 && rm.stale_weight <= 1, "remote.stale_weight", rm.stale_weight, "must be in (0, 1]");
  c.finite("remote.poll_interval", rm.poll_interval);
  c.require(rm.poll_interval > 0 && rm.poll_interval <= 60, "remote.poll_interval", rm.poll_interval, "must be in (0, 60] seconds");
  c.finite("remote.wait_log_every", rm.wait_log_every);
  c.require(rm.wait_log_every > 0, "remote.wait_log_every", rm.wait_log_every, "must be > 0 seconds");
  c.finite("remote.max_wait", rm.max_wait);
  c.require(rm.max_wait >= 0, "remote.max_wait", rm.max_wait, "must be >= 0 seconds (0 = wait forever)");
  if (data.env == EnvKind::remote) {
    c.require(train.num_iterations == 1, "train.num_iterations", train.num_iterations,
              "must be 1 with data.env = \"remote\" (each posted batch feeds one optimizer step)");
    c.require(train.steps_per_generation == 1, "train.steps_per_generation", train.steps_per_generation,
              "must be 1 with data.env = \"remote\" (each posted batch feeds one optimizer step)");
    c.require(eval.every == 0, "eval.every", eval.every,
              "must be 0 with data.env = \"remote\" (there is no local dataset to evaluate on; evaluate in the environment)");
    c.require(curriculum.type == CurriculumType::none, "curriculum.type", enum_name(curriculum_type_names(), curriculum.type),
              "must be \"none\" with data.env = \"remote\" (the environment picks the problems and group sizes)");
  }
  // Checked with LoRA off too, so that a typo does not wait for the run that turns it on.
  for (const auto& m : lora.target_modules)
    if (auto t = lora_target_parse(m); !t.ok()) c.check(t.status().with_context("lora.target_modules"));
  if (c.status().ok() && lora.enabled) return lora_config_from(lora, "").status();
  return c.status();
}

Result<RunPaths> run_config_resolve_paths(const RunConfig& cfg, const std::string& data_root) {
  namespace fs = std::filesystem;
  RunPaths p;
  p.output_dir = cfg.run.output_dir;
  auto need = [](const std::string& key, const std::string& path) -> Status {
    if (!fs::exists(path)) return error_status(key + " = \"" + path + "\": no such file or directory");
    return ok_status();
  };
  if (!cfg.model.path.empty()) {
    GRPO_TRY(need("model.path", cfg.model.path));
    if (fs::is_directory(cfg.model.path) && !fs::exists(fs::path(cfg.model.path) / "config.json"))
      return error_status("model.path = \"" + cfg.model.path + "\": directory has no config.json (point it at a Hugging Face checkpoint)");
    p.model = cfg.model.path;
  }
  p.tokenizer = cfg.model.tokenizer.empty() ? cfg.model.path : cfg.model.tokenizer;
  if (!cfg.model.tokenizer.empty()) GRPO_TRY(need("model.tokenizer", cfg.model.tokenizer));
  if (cfg.tandem.enabled) {
    if (!cfg.tandem.partner.empty()) {
      GRPO_TRY(need("tandem.partner", cfg.tandem.partner));
      if (!fs::exists(fs::path(cfg.tandem.partner) / "config.json"))
        return error_status("tandem.partner = \"" + cfg.tandem.partner +
                            "\": no config.json there (point it at a Hugging Face checkpoint directory)");
    }
    p.tandem_partner = cfg.tandem.partner.empty() ? p.model : cfg.tandem.partner;
  }
  if (cfg.data.env == EnvKind::gsm8k) {
    p.train_data = cfg.data.train_path.empty() ? (fs::path(data_root) / "data/gsm8k/train.jsonl").string() : cfg.data.train_path;
    p.eval_data = cfg.data.eval_path.empty() ? (fs::path(data_root) / "data/gsm8k/test.jsonl").string() : cfg.data.eval_path;
  } else if (cfg.data.env == EnvKind::jsonl) {
    p.train_data = cfg.data.train_path;
    p.eval_data = cfg.data.eval_path;
  }
  auto need_file = [&](const std::string& key, const std::string& path) -> Status {
    GRPO_TRY(need(key, path));
    if (fs::is_directory(path))
      return error_status(key + " = \"" + path + "\": is a directory; point it at a JSONL file (one JSON object per line)");
    return ok_status();
  };
  if (!p.train_data.empty()) GRPO_TRY(need_file("data.train_path", p.train_data));
  if (!p.eval_data.empty()) GRPO_TRY(need_file("data.eval_path", p.eval_data));
  return p;
}

namespace {

void warn_skipped(const Dataset& d) {
  if (d.report.n_bad > 0) GRPO_LOG_WARN("%s", jsonl_report_summary(d.name, d.report).c_str());
}

std::string skipped_note(const Dataset& d) {
  return d.report.n_bad > 0 ? " (" + std::to_string(d.report.n_bad) + " bad lines skipped)" : " (the file is empty)";
}

// An empty train set, or an empty eval set while evals are on, is a config error:
// evals are off only when eval.every = 0 says so.
Status check_example_counts(const RunConfig& cfg, const RunPaths& paths, const Environment& env,
                            const Dataset* train, const Dataset* test) {
  const bool arith = cfg.data.env == EnvKind::arithmetic;
  if (env.size(Split::train) == 0)
    return error_status(arith ? "data.arithmetic.train_size = 0: no training examples"
                              : "data.train_path = \"" + paths.train_data + "\": no examples" +
                                    (train ? skipped_note(*train) : std::string()));
  if (cfg.eval.every > 0 && cfg.data.eval_split == Split::test && env.size(Split::test) == 0) {
    const std::string what = arith ? "data.arithmetic.test_size gives no test examples"
                                   : "data.eval_path = \"" + paths.eval_data + "\": no examples" +
                                         (test ? skipped_note(*test) : std::string());
    return error_status(what + ", but eval.every = " + std::to_string(cfg.eval.every) +
                        " asks for evals; give an eval set, or set eval.every = 0 to train without evals");
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Environment>> run_config_make_env(const RunConfig& cfg, const RunPaths& paths) {
  const DataSection& d = cfg.data;
  JsonlOptions jo;
  jo.on_bad_line = d.on_bad_line;
  if (d.env == EnvKind::arithmetic) {
    ArithmeticConfig ac;
    ac.seed = static_cast<uint64_t>(d.seed);
    ac.difficulty = static_cast<int>(d.arithmetic.difficulty);
    ac.style = d.arithmetic.style;
    ac.train_size = static_cast<size_t>(d.arithmetic.train_size);
    ac.test_size = static_cast<size_t>(d.arithmetic.test_size);
    ac.test_permille = static_cast<int>(d.arithmetic.test_permille);
    GRPO_TRY(ac.validate());
    auto env = std::make_unique<ArithmeticEnv>(ac);
    GRPO_TRY(check_example_counts(cfg, paths, *env, nullptr, nullptr));
    return std::unique_ptr<Environment>(std::move(env));
  }
  if (d.env == EnvKind::remote) {  // groups come from outside environments (train/loop_remote.h): no local examples
    Dataset none_train, none_test;
    none_train.name = "train";
    none_test.name = "test";
    return std::unique_ptr<Environment>(std::make_unique<NumericQaEnv>(enum_name(env_kind_names(), d.env), std::move(none_train), std::move(none_test)));
  }
  if (d.env == EnvKind::gsm8k) {
    GRPO_ASSIGN_OR_RETURN(auto env, gsm8k_env_load({paths.train_data, paths.eval_data}, jo));
    warn_skipped(env->dataset(Split::train));
    warn_skipped(env->dataset(Split::test));
    GRPO_TRY(check_example_counts(cfg, paths, *env, &env->dataset(Split::train), &env->dataset(Split::test)));
    return std::unique_ptr<Environment>(std::move(env));
  }
  FieldMap map;
  map.prompt_field = d.prompt_field;
  map.answer_field = d.answer_field;
  map.answer_is_solution = d.answer_is_solution;
  GRPO_ASSIGN_OR_RETURN(Dataset train, dataset_load_jsonl(paths.train_data, "train", map, jo));
  Dataset test;
  test.name = "test";
  if (!paths.eval_data.empty()) {
    GRPO_ASSIGN_OR_RETURN(test, dataset_load_jsonl(paths.eval_data, "test", map, jo));
  }
  warn_skipped(train);
  warn_skipped(test);
  auto env = std::make_unique<NumericQaEnv>(enum_name(env_kind_names(), d.env), std::move(train), std::move(test));
  GRPO_TRY(check_example_counts(cfg, paths, *env, &env->dataset(Split::train), &env->dataset(Split::test)));
  return std::unique_ptr<Environment>(std::move(env));
}

}  // namespace grpo
