// Training-state checkpoints of `grpo train`: DIR/checkpoint-<step>/ holds
//   config.json, model.safetensors, tokenizer files  (model_save: an HF model)
//   optimizer.safetensors  fp32 master weights, AdamW m and v: flat (n) f32
//                          tensors "master", "exp_avg", "exp_avg_sq" in the
//                          weights' arena order (model/weights.h)
//   trainer_state.json     TrainerState (below) as JSON
// In LoRA training (Optimizer::adapters) the model files are replaced by the
// adapter in PEFT's format (adapter_config.json, adapter_model.safetensors) and
// optimizer.safetensors covers the adapters' arena (model/lora.h); the frozen
// base comes from model.path on resume.
// A checkpoint is built in DIR/checkpoint-<step>.partial-<pid>/ and renamed
// into place after every file is fsynced, so a run killed mid-write leaves the
// previous checkpoints intact; resume only looks at names "checkpoint-<digits>"
// that hold a trainer_state.json, and the next save removes stale partials.
//
// There is no hidden RNG state to save: rollout sampling is keyed by
// (rollout seed, generation index, prompt slot) and the data order by
// (data seed, epoch), so the counters below restore every random stream.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "train/optimizer.h"

namespace grpo {

struct TrainerState {
  int64_t step = 0;             // optimizer steps completed
  int64_t generation = 0;       // generation batches produced (rollout RNG key)
  int64_t data_epoch = 0;       // passes over the train split started
  int64_t data_index = 0;       // next position in the epoch's order
  uint64_t data_seed = 0, rollout_seed = 0;  // checked against the config on resume
  // Early stopping on the eval metric (higher is better).
  bool has_best = false;
  double best_metric = 0;
  int64_t best_step = -1;
  int64_t evals_without_improvement = 0;
  bool stopped_early = false;
  // Scheduler: the learning rate is a pure function of these and `step`.
  std::string lr_schedule;
  double lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;
  double last_lr = 0;
  bool mid_generation = false;  // saved between the optimizer steps of one generation batch
  // Curriculum state (KdeCurriculum::to_json); null when no curriculum runs.
  nlohmann::json curriculum;
  // The hosted trajectory API's queue (TrajectoryStore::snapshot) of data.env =
  // "remote"; null otherwise.
  nlohmann::json trajectory_queue;
};

nlohmann::ordered_json trainer_state_to_json(const TrainerState& s);
Result<TrainerState> trainer_state_from_json(const nlohmann::json& j, const std::string& source);

// "checkpoint-<step>" under out_dir.
std::string checkpoint_dir_name(int64_t step);
// Complete checkpoints under out_dir, ascending by step (partials and other names ignored).
std::vector<std::pair<int64_t, std::string>> checkpoint_list(const std::string& out_dir);
// Path of the newest complete checkpoint, or "" when there is none.
std::string checkpoint_latest(const std::string& out_dir);

struct CheckpointSaveOptions {
  SaveOptions model;      // dtype and tokenizer files of the HF model
  int64_t keep_last = 0;  // > 0: delete older complete checkpoints beyond this many
};

// Writes out_dir/checkpoint-<state.step> atomically (see the file comment) and
// prunes. Returns the checkpoint path.
Result<std::string> checkpoint_save(Context& ctx, const std::string& out_dir, const ModelWeights& w,
                                    const Optimizer& opt, const TrainerState& state,
                                    const CheckpointSaveOptions& o);

// Restores master weights, m, v and the step counter into `opt`, writes the
// compute-dtype parameters `w` from the master weights, and returns the state.
// Errors name the file and what does not match (e.g. a different model).
Result<TrainerState> checkpoint_load(Context& ctx, const std::string& ckpt_dir, ModelWeights& w, Optimizer& opt);

}  // namespace grpo
