// Environment switches of the CUDA backend: how a kernel file reads a GRPO_* variable.
// Every switch is read once per process (into a function-local static) and documented with
// the measurement that keeps it in src/kernels/cuda/README.md; add none without one.
#pragma once
#include <cstdlib>

namespace grpo::cuda {

// env_off is true when the variable is set to something starting with '0'; env_long is its
// value when set and within [lo, hi], else def (an out-of-range value keeps the default).
inline bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '0';
}
inline long env_long(const char* name, long def, long lo, long hi) {
  const char* e = std::getenv(name);
  if (!e) return def;
  const long v = std::atol(e);
  return v >= lo && v <= hi ? v : def;
}

}  // namespace grpo::cuda
