// Setup of a `grpo train` run: everything is loaded and checked here, before
// the first rollout, so that a bad config, a missing file or a model/tokenizer
// mismatch fails fast. Also restores a checkpoint when resuming and writes the
// resolved config and run_info.json into the run directory.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/ipc_bridge.h"
#include "dist/weight_broadcast.h"
#include "engine/engine.h"
#include "env/environment.h"
#include "env/rewards.h"
#include "train/checkpoint_state.h"
#include "train/curriculum.h"
#include "train/loop_options.h"
#include "train/loop_data.h"
#include "train/loop_rollout.h"
#include "train/loop_train.h"
#include "train/metrics_progress.h"

namespace grpo {

struct DataParallel;  // train/data_parallel.h

struct LoopRun {
  RunConfig cfg;                        // with run.output_dir = the directory in use
  RunPaths paths;
  std::string out_dir;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ModelWeights> weights;  // shared by engine and trainer
  std::unique_ptr<IpcExporter> ipc;       // server.bridge = "ipc" (rank 0): published after each optimizer step
  std::unique_ptr<Communicator> bridge_comm;      // server.bridge = "nccl" (rank 0): trainer + servers
  std::unique_ptr<WeightBroadcaster> broadcaster;  // sends after each optimizer step
  std::unique_ptr<BridgeRejoin> rejoin;            // the bridge is down (on_failure = "continue"): servers may come back
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Environment> env;
  std::unique_ptr<RewardComposer> rewards;
  std::unique_ptr<ModelWeights> partner;  // tandem.enabled: the frozen partner (outlives the engine)
  std::unique_ptr<ModelWeights> draft;    // engine.speculative.method = "draft": the draft model (outlives the engine)
  // [async] max_staleness > 0 (train/loop_async.h): the engine's own context and copy of
  // the weights, and the model that scores old logprobs on that context; else null.
  std::unique_ptr<Context> engine_ctx;
  std::unique_ptr<ModelWeights> snapshot;
  TrainModel engine_model;
  std::unique_ptr<Engine> engine;
  PolicyTrainer trainer;
  PromptFormat format;
  RolloutConfig rollout_cfg;
  SamplingParams eval_params;
  std::vector<PreparedPrompt> eval_prompts;
  std::unique_ptr<DataCursor> cursor;
  std::unique_ptr<KdeCurriculum> curriculum;  // null unless curriculum.type = "kde_valley"
  TrainerState state;
  bool resumed = false;
  std::string resumed_from;
  CheckpointSaveOptions ckpt_opts;
  std::unique_ptr<ProgressBar> progress;
  // rollout.server_url: the client (owned by grpo_train) is r.rollout_cfg.server, and with
  // rollout.server_on_failure = "local" its state r.rollout_cfg.failover; whether the
  // "server does not follow the trainer" warning was given.
  bool server_lag_warned = false;
};

Result<std::unique_ptr<LoopRun>> loop_setup(const RunConfig& cfg, const TrainLoopOptions& opt);

// Data parallel over `comm` for a set-up run: ZeRO-1 shard bounds (the optimizer
// was created sharded when opt.comm was given to loop_setup), the overlapped
// gradient all-reduce ([dist]), and this rank's first rollout request slot.
// `dp` must outlive the run's use of r.trainer.
void loop_setup_data_parallel(LoopRun& r, Communicator& comm, DataParallel& dp, int64_t request_offset);

// The loop's SamplingParams from the config. Rollouts ([rollout]): num_generations samples,
// temperature and filters, lengths, stop strings, and the logprobs mode the trainer recomputes
// (raw at temperature 1, else processed). Evals (eval = true): one sample, greedy unless
// eval.greedy = false, eval.max_new_tokens or else [rollout]'s, [rollout]'s stop strings.
// Validated against vocab_size; errors name the section.
// The NCCL weight bridge after optimizer step `version` (rank 0, r.broadcaster set):
// sends the weights; once the bridge is down (server.bridge_on_failure =
// "continue") listens for restarted servers instead and, when all have connected,
// rebuilds the bridge and sends them this version.
Status loop_bridge_publish(LoopRun& r, int64_t version);

Result<SamplingParams> loop_sampling_params(const RunConfig& cfg, bool eval, int vocab_size);

// rollout.server_url: the oldest policy version the server may answer a batch launched at
// trainer version `version` from: `version` while a weight bridge (server.bridge) follows the
// trainer and is up, else -1 (no check).
int64_t loop_server_min_version(const LoopRun& r, int64_t version);
// Warns once when a server without a bridge answers from another version than `version`
// (the weights the trainer had when it sent the batch): its rollouts are off-policy.
void loop_note_server_version(LoopRun& r, int64_t got, int64_t version);

// Curves of the end-of-run plot present in the history, in a fixed order.
std::vector<std::string> loop_plot_metrics(const MetricHistory& h);

}  // namespace grpo
