// Wall-clock timing helpers.
#pragma once
#include <chrono>

namespace grpo {
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace grpo
