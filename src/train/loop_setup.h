// Setup of a `grpo train` run: everything is loaded and checked here, before
// the first rollout, so that a bad config, a missing file or a model/tokenizer
// mismatch fails fast. Also restores a checkpoint when resuming and writes the
// resolved config and run_info.json into the run directory.
#pragma once
#include <memory>
#include <string>
#include <vector>

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

struct LoopRun {
  RunConfig cfg;                        // with run.output_dir = the directory in use
  RunPaths paths;
  std::string out_dir;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ModelWeights> weights;  // shared by engine and trainer
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Environment> env;
  std::unique_ptr<RewardComposer> rewards;
  std::unique_ptr<ModelWeights> partner;  // tandem.enabled: the frozen partner (outlives the engine)
  std::unique_ptr<ModelWeights> draft;    // engine.speculative.method = "draft": the draft model (outlives the engine)
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
};

Result<std::unique_ptr<LoopRun>> loop_setup(const RunConfig& cfg, const TrainLoopOptions& opt);

// The loop's SamplingParams from the config. Rollouts ([rollout]): num_generations samples,
// temperature and filters, lengths, stop strings, and the logprobs mode the trainer recomputes
// (raw at temperature 1, else processed). Evals (eval = true): one sample, greedy unless
// eval.greedy = false, eval.max_new_tokens or else [rollout]'s, [rollout]'s stop strings.
// Validated against vocab_size; errors name the section.
Result<SamplingParams> loop_sampling_params(const RunConfig& cfg, bool eval, int vocab_size);

// Curves of the end-of-run plot present in the history, in a fixed order.
std::vector<std::string> loop_plot_metrics(const MetricHistory& h);

}  // namespace grpo
