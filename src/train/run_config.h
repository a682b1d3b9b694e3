// Run configuration of `grpo train CONFIG.toml [--set key=value ...]`.
//
// Plain structs with defaults; validate() checks values and names the key;
// run_config_load() parses TOML strictly: an unknown section or key is an
// error naming it and listing the valid ones, a wrong type or bad value is an
// error naming key and value. Keys are dotted paths "section.key" (nested
// table: "data.arithmetic.difficulty"); reward functions are an array of
// tables [[reward]] with name, weight and the function's own parameters
// (rewards.h). Relative paths are relative to the current directory, like
// paths on the command line; run_config_resolve_paths() checks them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/enum_table.h"
#include "core/log.h"
#include "core/status.h"
#include "engine/engine_config.h"
#include "engine/tandem.h"
#include "env/arithmetic.h"
#include "env/environment.h"
#include "env/jsonl.h"
#include "env/rewards.h"
#include "train/advantages.h"
#include "train/grpo_loss.h"
#include "train/lr_schedule.h"

namespace grpo {

enum class ProgressSetting { automatic, bar, plain, off };
enum class CurriculumType { none, kde_valley };
enum class EnvKind { gsm8k, arithmetic, jsonl, remote };
enum class StalePolicy { drop, down_weight };
enum class EarlyStoppingMetric { accuracy, reward };
enum class OnPolicy { standard, bitwise };  // train.on_policy: default | bitwise
enum class ServerOnFailure { error, local };  // rollout.server_on_failure

// model.device: "cpu", "cuda" (the current device) or "cuda:N".
struct DeviceSpec {
  Device kind = Device::cuda;
  int index = -1;  // cuda:N; -1 = "cuda"
  bool operator==(const DeviceSpec&) const = default;
};
inline constexpr const char* kDeviceSpecAllowed = "cpu, cuda, cuda:N";
std::optional<DeviceSpec> device_spec_parse(std::string_view s);  // nullopt: not one of kDeviceSpecAllowed
std::string device_spec_name(DeviceSpec d);                       // the spelling device_spec_parse reads

// The one name table of each enum-like config value (parsing, messages, --list-keys).
std::span<const EnumName<ArithmeticStyle>> arithmetic_style_names();  // compact, verbose, expression
std::span<const EnumName<BadLinePolicy>> bad_line_names();             // fail, skip
std::span<const EnumName<LrScheduleType>> lr_schedule_names();         // constant, linear, cosine
std::span<const EnumName<ProgressSetting>> progress_names();           // auto, bar, plain, off
std::span<const EnumName<LogLevel>> log_level_names();                 // debug, info, warn, error, quiet
std::span<const EnumName<CurriculumType>> curriculum_type_names();     // none, kde_valley
std::span<const EnumName<DType>> model_dtype_names();                  // bf16, f16, f32
std::span<const EnumName<EnvKind>> env_kind_names();                   // gsm8k, arithmetic, jsonl, remote
std::span<const EnumName<Split>> eval_split_names();                   // test, train
std::span<const EnumName<StalePolicy>> stale_policy_names();           // drop, down_weight
std::span<const EnumName<OnPolicy>> on_policy_names();                  // default, bitwise
std::span<const EnumName<ServerOnFailure>> server_on_failure_names();  // error, local
std::span<const EnumName<EarlyStoppingMetric>> early_stopping_metric_names();  // eval/accuracy, eval/reward
// train.loss_type, train.importance_sampling(_level): loss_type_names(), is_mode_names(),
// is_level_names() (train/grpo_loss.h); train.scale_rewards: scale_rewards_names() (train/advantages.h).

struct RunSection {
  std::string output_dir = "runs/default";  // metrics, checkpoints, resolved config go here
  std::string name;                         // free label for the run (defaults to the directory name)
  bool deterministic = false;               // batch-invariant kernels (reductions in a fixed order)
};

struct ModelSection {
  std::string path;           // HF checkpoint dir (config.json, *.safetensors); empty: the built-in demo model
  std::string tokenizer;      // tokenizer.json or its dir; empty: from `path`
  DType dtype = DType::bf16;  // bf16 | f16 | f32 (weights the engine reads; master weights stay f32)
  DeviceSpec device;          // cpu | cuda | cuda:N
};

struct ArithmeticSection {  // used when data.env = "arithmetic" (see env/arithmetic.h)
  int64_t difficulty = 1;   // 0..3
  ArithmeticStyle style = ArithmeticStyle::compact;
  int64_t train_size = 100000;
  int64_t test_size = 500;
  int64_t test_permille = 100;
};

struct DataSection {
  EnvKind env = EnvKind::arithmetic;  // gsm8k | arithmetic | jsonl | remote (groups posted by outside environments: [remote])
  std::string train_path;          // jsonl: required; gsm8k: empty = data/gsm8k/train.jsonl
  std::string eval_path;           // jsonl: optional; gsm8k: empty = data/gsm8k/test.jsonl
  std::string prompt_field = "question";
  std::string answer_field = "answer";
  bool answer_is_solution = false;  // jsonl: answer field is a "... #### N" solution
  std::string prompt_template = "{question}";  // placeholders {question} {answer} {id}
  bool use_chat_template = false;   // wrap in the tokenizer's chat template (system + user turn)
  std::string system_prompt;
  Split eval_split = Split::test;    // test | train
  int64_t eval_size = 0;            // prompts in the eval set; 0 = the whole split
  BadLinePolicy on_bad_line = BadLinePolicy::fail;  // skip: bad lines are counted and reported
  bool shuffle = true;
  int64_t seed = 1;                 // data order and generated problems
  ArithmeticSection arithmetic;
};

struct RolloutSection {
  int64_t num_generations = 8;   // G: completions per prompt
  int64_t prompts_per_step = 8;  // B: prompts per generation batch
  int64_t max_new_tokens = 256;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;             // 0 = off
  double min_p = 0.0;            // 0 = off
  int64_t seed = 1;
  std::vector<std::string> stop; // stop strings (EOS always stops)
  bool ignore_eos = false;       // keep sampling after EOS (forced lengths for benchmarks)
  int64_t min_new_tokens = 0;    // EOS / stop ids are banned before this many tokens
  // Rollouts from a separate `grpo serve` (TRL's vllm_mode = "server"; docs/serve.md): its base
  // URL, http://HOST:PORT; "" = the in-process engine. Evals stay on the in-process engine.
  std::string server_url;
  double server_timeout_s = 600;         // per HTTP request (a request that takes longer is an error)
  int64_t server_max_concurrency = 64;   // HTTP requests in flight at once (one per prompt)
  // A server lost mid-run (connection refused, timeout, HTTP error, malformed answer): "error"
  // stops the run; "local" samples on with the in-process engine (whose KV pool is then sized
  // for the rollout batch, as without a server) and returns to the server when it answers again.
  ServerOnFailure server_on_failure = ServerOnFailure::error;
};

struct TrainSection {
  int64_t steps = 100;                 // optimizer steps
  double lr = 1e-6;
  LrScheduleType lr_schedule = LrScheduleType::constant;  // after warmup
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  bool weight_decay_all = false;       // also decay norms and biases (HF decays only matrices/embeddings)
  double adam_beta1 = 0.9, adam_beta2 = 0.99, adam_eps = 1e-8;
  double max_grad_norm = 1.0;          // 0 = no clipping
  int64_t micro_batch = 8;             // sequences per forward/backward
  int64_t micro_batch_tokens = 8192;   // packed tokens per forward/backward at most (a longer sequence gets its own)
  bool activation_recompute = false;   // keep only each layer's input; backward re-runs the layer (less memory)
  int64_t grad_accum = 1;              // micro-batch groups accumulated per optimizer step
  int64_t steps_per_generation = 1;    // optimizer steps per generation batch
  int64_t num_iterations = 1;          // mu: passes over each generation batch
  LossType loss_type = LossType::dapo;  // grpo | bnpo | dr_grpo | dapo | cispo (as in TRL)
  // Importance ratio per token, or one per sequence from the mean log-ratio of its tokens
  // (GSPO; TRL's importance_sampling_level): token | sequence.
  IsLevel importance_sampling_level = IsLevel::token;
  double beta = 0.0;                   // KL coefficient; 0 = no reference model
  double epsilon = 0.2;                // clip low
  // Clip high; 0 = same as epsilon (DAPO uses 0.28). cispo: the cap of its detached
  // importance weight min(ratio, epsilon_high) itself (TRL's ε_max; ScaleRL uses 5.0), >= 1.
  double epsilon_high = 0.0;
  ScaleRewards scale_rewards = ScaleRewards::group;  // std used to scale advantages
  // Correction for the rollout engine's sampling logprobs differing from the trainer's
  // (TRL's vllm_importance_sampling_mode): none | token_truncate | token_mask | sequence_truncate | sequence_mask
  IsMode importance_sampling = IsMode::none;
  double importance_sampling_cap = 2.0;      // C of truncated/masked IS, >= 1
  bool importance_sampling_geomean = false;  // sequence_* modes: geometric mean of the token ratios, not their product
  bool mask_truncated_completions = false;
  // How the rollout's logprobs relate to the trainer's (docs/bitwise.md): default | bitwise.
  // bitwise: the engine reports, for every sampled token, the trainer's own LM-head
  // logprob over batch-invariant kernels, equal bit for bit to the trainer's forward
  // (logprob_mismatch/* = 0). Implies run.deterministic. CPU backend only for now.
  OnPolicy on_policy = OnPolicy::standard;
  // Optimizer steps skipped in a row (non-finite gradient norm) before the run
  // ends with an error; 0 = never. There is no loss scaler whose warm-up skips
  // steps by design, so one skip is an outlier batch and ten in a row, over
  // fresh rollouts, mean broken weights or data.
  int64_t max_consecutive_skipped_steps = 10;
};

// Tandem training (docs/tandem.md): a frozen partner writes part of every rollout.
struct TandemSection {
  bool enabled = false;
  std::string partner;            // HF checkpoint dir with the same vocabulary; empty: a frozen copy of the initial policy
  TandemStrategy strategy = TandemStrategy::word;  // token | chunk | word (who writes the next token; see engine/tandem.h)
  double p_trained = 0.5;         // probability that a draw picks the trained model
  int64_t chunk_size = 16;        // k of strategy "chunk"
  double partner_weight = 0.2;    // loss weight of partner tokens: w = mask + (1 - mask) * partner_weight
  int64_t seed = 0;               // mixed with each sample's key: a seed reproduces the masks
  bool eval_tandem = true;        // eval also runs in tandem (eval/tandem/*) besides solo (eval/*)
};

struct EvalSection {
  int64_t every = 0;            // steps between evals; 0 = off
  bool at_start = true;         // also evaluate before the first step
  bool greedy = true;
  double temperature = 1.0;     // when greedy = false
  int64_t n_prompts = 0;        // 0 = data.eval_size / whole split
  int64_t max_new_tokens = 0;   // 0 = rollout.max_new_tokens
  int64_t early_stopping_patience = 0;  // evals without improvement before stopping; 0 = off
  EarlyStoppingMetric early_stopping_metric = EarlyStoppingMetric::accuracy;  // the metric's name; higher is better
  double early_stopping_min_delta = 0.0;
};

struct CheckpointSection {
  int64_t every = 0;      // steps; 0 = only the final one (if save_final)
  int64_t keep_last = 3;  // 0 = keep all
  bool save_final = true;
};

// Rollouts per prompt from the KDE valley curriculum (train/curriculum.h, docs/curriculum.md).
struct CurriculumSection {
  CurriculumType type = CurriculumType::none;  // none | kde_valley
  double ema_init = 0.5;       // EMA of a problem never sampled
  double ema_decay = 0.7;      // ema <- decay * ema + (1 - decay) * reward, clipped to [0, 1]
  double bandwidth = 0.05;     // Gaussian KDE bandwidth on [0, 1]
  int64_t grid_points = 512;   // KDE grid on [0, 1]
  int64_t n_clusters = 3;      // split at the n - 1 deepest valleys
  double alpha = 1.0;          // G = round(num_generations * (1 + alpha * (1 - cluster mean)))
  int64_t max_generations = 0; // cap on G per prompt; 0 = none
  int64_t report_every = 10;   // steps between cluster reports (curriculum/report-<step>.json); 0 = only at the end
};

struct LogSection {
  bool jsonl = true;         // <output_dir>/metrics.jsonl
  bool tensorboard = false;  // <output_dir>/tb/events.out.tfevents.*
  bool plot = true;          // <output_dir>/plot.html at the end
  std::vector<std::string> plot_metrics;  // empty = plot_default_metrics()
  int64_t every = 1;         // steps between metric records
  ProgressSetting progress = ProgressSetting::automatic;
  LogLevel level = LogLevel::info;
};

// [server]: serve the live policy over HTTP while training (docs/serve.md). Outside
// requests share the engine with the loop's rollouts; they are admitted while the
// loop generates and wait (queued) while it trains.
struct ServerSection {
  bool enabled = false;
  std::string host = "127.0.0.1";
  int64_t port = 8000;                    // 0 = any free port (printed)
  std::string api_key;                    // "" = no key; note: the resolved config.toml keeps it
  std::string served_model_name;          // "" = the model directory's name
  int64_t max_body_bytes = int64_t(4) << 20;
  int64_t max_prompt_tokens = 0;          // 0 = the context length
  int64_t max_tokens_limit = 4096;
  int64_t max_n = 16;
  int64_t max_queued_requests = 256;
  // Weight bridge to a separate `grpo serve` (docs/serve.md, "Weight bridges"): "none";
  // "ipc": export the GPU weight arena through CUDA IPC under the run directory and
  // publish the policy version after each optimizer step (grpo serve --attach); "nccl":
  // broadcast the weights (LoRA: the adapters) after each step to bridge_servers
  // `grpo serve --receive bridge_addr` processes. Works with or without `enabled`.
  std::string bridge = "none";
  std::string bridge_addr = "127.0.0.1:29650";  // nccl: the trainer's rendezvous address
  int64_t bridge_servers = 1;                    // nccl: server processes to wait for
  int64_t bridge_bucket_mib = 64;                // nccl: largest broadcast
  std::string bridge_on_failure = "error";       // nccl: error (stop) | continue (train on without servers)
  double bridge_timeout_s = 600;                 // nccl: rendezvous and per-collective limit
};

// [remote]: data.env = "remote" trains from scored groups that environment
// processes post to an Atropos-compatible trajectory API (docs/environments.md).
// Sequences per step = rollout.prompts_per_step × rollout.num_generations.
struct RemoteSection {
  std::string url;                     // "" = host the API here (host:port); else pull from this Atropos API server
  std::string host = "127.0.0.1";
  int64_t port = 8000;                 // 0 = any free port (printed)
  int64_t max_queued_sequences = 0;    // hosted queue bound (posts beyond it get 503 + Retry-After); 0 = 16 steps' worth
  int64_t max_staleness = -1;          // steps a group's policy_version may lag; < 0 = no limit
  StalePolicy stale = StalePolicy::drop;  // drop | down_weight (loss weight stale_weight^(lag - max_staleness))
  double stale_weight = 0.5;
  double poll_interval = 0.2;          // seconds between GET /batch polls while waiting
  double wait_log_every = 30;          // seconds between "waiting for groups" lines
  double max_wait = 0;                 // seconds without a batch before the run fails; 0 = wait forever
  std::string wandb_group, wandb_project;  // passed on in POST /register
};

// Data-parallel runs (docs/distributed.md); the rank layout comes from the launcher.
struct DistSection {
  int64_t zero_stage = 0;   // 0: replicated optimizer; 1: fp32 master + AdamW moments sharded over ranks
  double bucket_mb = 25;    // gradient all-reduce bucket (MiB of f32 gradients)
  double timeout_s = 300;   // NCCL watchdog and rendezvous limit: a silent peer ends the run after this
  bool overlap_backward = true;  // all-reduce gradient buckets during the backward, as layers finish
};

// [lora]: train LoRA adapters on a frozen base instead of every weight (docs/lora.md).
struct LoraSection {
  bool enabled = false;
  int64_t r = 8;
  double alpha = 16;      // scaling = alpha / r (alpha / √r with use_rslora)
  double dropout = 0;     // must be 0 for training (see docs/lora.md)
  bool use_rslora = false;
  // q, k, v, o, gate, up, down or PEFT's q_proj, ..., down_proj
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  int64_t seed = 0;       // initialisation of A
  std::string init_from;  // a PEFT adapter directory to start from instead (its r, alpha, targets must match)
};

// [async]: rollouts generated while the trainer steps (docs/async.md). 0 = the synchronous loop.
struct AsyncSection {
  int64_t max_staleness = 0;   // k: the batch of generation g is sampled from the weights after step g − k
  int64_t engine_threads = 0;  // CPU: threads of the rollout side (the trainer keeps the rest); 0 = half
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  RolloutSection rollout;
  // Rollout engine: batching, KV pool and its memory budget, CUDA graphs, KV dtype
  // (engine/engine_config.h). engine.kv_cache_dtype = fp8 rollouts are scored by a
  // trainer that reads unquantised K/V: see train.importance_sampling.
  EngineConfig engine;
  TrainSection train;
  std::vector<RewardSpec> reward = {{"correct", 1.0}};  // [[reward]] entries replace this default
  EvalSection eval;
  TandemSection tandem;
  CheckpointSection checkpoint;
  LogSection log;
  CurriculumSection curriculum;
  ServerSection server;
  RemoteSection remote;
  DistSection dist;
  LoraSection lora;
  AsyncSection async;

  // Value checks; the message names the key and value ("train.lr = -1: must be > 0").
  Status validate() const;
};

// Parses TOML text (source_name labels messages), applies `overrides`
// ("a.b=value", parsed with the key's declared type) and validates. No file
// system checks.
Result<RunConfig> run_config_parse(const std::string& toml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides = {});
// Reads `path`, then as run_config_parse, then checks files (run_config_resolve_paths).
Result<RunConfig> run_config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies one "a.b=value" override (reward entries: "reward.<name>.<param>=v";
// a name not configured yet adds that function with weight 1).
Status run_config_set(RunConfig* cfg, const std::string& assignment);

// Paths derived from a config; the config itself is never rewritten.
struct RunPaths {
  std::string model, tokenizer, train_data, eval_data, output_dir;
  std::string tandem_partner;  // tandem.enabled: tandem.partner, or model when empty
};
// Fills defaults (gsm8k -> data/gsm8k/*.jsonl under data_root, default ".")
// and checks that every input exists: an error names the key and the path.
Result<RunPaths> run_config_resolve_paths(const RunConfig& cfg, const std::string& data_root = ".");

// Builds the environment named by data.env from a validated config and its
// resolved paths (gsm8k / jsonl load their files; arithmetic generates).
// Bad lines skipped under data.on_bad_line = "skip" are logged as a warning
// with their count and first location.
Result<std::unique_ptr<Environment>> run_config_make_env(const RunConfig& cfg, const RunPaths& paths);

// Resolved config for the run directory. The TOML parses back to an equal config.
std::string run_config_to_toml(const RunConfig& cfg);
nlohmann::ordered_json run_config_to_json(const RunConfig& cfg);
// Every settable key ("train.lr", ...), in declaration order.
std::vector<std::string> run_config_keys();
// The allowed values of an enum-like key ("auto, on, off"), "" for other keys.
std::string run_config_key_values(const std::string& key);

}  // namespace grpo
