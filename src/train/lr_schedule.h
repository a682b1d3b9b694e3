// Learning-rate schedules with linear warmup, with the formulas of Hugging
// Face transformers' get_{constant,linear,cosine}_schedule_with_warmup
// (LambdaLR multipliers). `step` is the number of optimizer steps already
// taken (0 for the first step: the HF scheduler is stepped after the
// optimizer, so step k uses the multiplier at k, and with warmup the very
// first update has lr 0, as in HF).
//   warmup (step < W):  step / max(1, W)
//   constant:           1
//   linear:             max(0, (N − step) / max(1, N − W))
//   cosine:             max(0, 0.5·(1 + cos(π · 2·cycles · p))),  p = (step − W) / max(1, N − W), cycles = 0.5
// constant without warmup is get_constant_schedule (W = 0).
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace grpo {

enum class LrScheduleType { constant, linear, cosine };
Result<LrScheduleType> lr_schedule_from_string(const std::string& s);  // "constant", "linear", "cosine"
const char* lr_schedule_name(LrScheduleType t);

struct LrSchedule {
  LrScheduleType type = LrScheduleType::linear;  // HF TrainingArguments default
  double lr = 1e-6;          // peak learning rate
  int64_t warmup_steps = 0;  // W
  int64_t total_steps = 1;   // N (num_training_steps)
  double num_cycles = 0.5;   // cosine only
  Status validate() const;
};

// Multiplier at `step` (see above) and the learning rate lr · multiplier.
double lr_multiplier(const LrSchedule& s, int64_t step);
double lr_at(const LrSchedule& s, int64_t step);
// HF's warmup_ratio: ceil(ratio · total_steps).
int64_t warmup_steps_from_ratio(double ratio, int64_t total_steps);

}  // namespace grpo
