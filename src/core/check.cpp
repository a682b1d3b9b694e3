#include "core/check.h"

namespace grpo {
void check_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "grpo: internal check failed: %s at %s:%d%s%s\n", expr, file, line,
               msg ? ": " : "", msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}
}  // namespace grpo
