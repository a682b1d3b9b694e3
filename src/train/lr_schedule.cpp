#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace grpo {

Result<LrScheduleType> lr_schedule_from_string(const std::string& s) {
  if (s == "constant" || s == "constant_with_warmup") return LrScheduleType::constant;
  if (s == "linear") return LrScheduleType::linear;
  if (s == "cosine") return LrScheduleType::cosine;
  return error_status("lr_scheduler_type: unknown value '" + s + "' (use constant, linear or cosine)");
}

const char* lr_schedule_name(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::constant: return "constant";
    case LrScheduleType::linear: return "linear";
    case LrScheduleType::cosine: return "cosine";
  }
  return "?";
}

Status LrSchedule::validate() const {
  if (!(lr >= 0)) return error_status("learning_rate must be >= 0");
  if (warmup_steps < 0) return error_status("warmup_steps must be >= 0");
  if (total_steps < 1) return error_status("total steps must be >= 1");
  return ok_status();
}

double lr_multiplier(const LrSchedule& s, int64_t step) {
  const double W = double(s.warmup_steps), N = double(s.total_steps), k = double(step);
  if (step < s.warmup_steps) return k / std::max(1.0, W);
  switch (s.type) {
    case LrScheduleType::constant: return 1.0;
    case LrScheduleType::linear: return std::max(0.0, (N - k) / std::max(1.0, N - W));
    case LrScheduleType::cosine: {
      const double p = (k - W) / std::max(1.0, N - W);
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * s.num_cycles * 2.0 * p)));
    }
  }
  return 1.0;
}

double lr_at(const LrSchedule& s, int64_t step) { return s.lr * lr_multiplier(s, step); }

int64_t warmup_steps_from_ratio(double ratio, int64_t total_steps) {
  return int64_t(std::ceil(ratio * double(total_steps)));
}

}  // namespace grpo
