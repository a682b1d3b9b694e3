#include "core/log.h"

#include <atomic>
#include <cstdio>

namespace grpo {
static std::atomic<int> g_level{int(LogLevel::info)};
void log_set_level(LogLevel l) { g_level = int(l); }
LogLevel log_level() { return LogLevel(g_level.load()); }
void log_msg(LogLevel l, const char* fmt, ...) {
  if (int(l) < g_level.load()) return;
  static const char* names[] = {"debug", "info", "warning", "error"};
  flockfile(stderr);  // one line per message when worker threads (remote rewards) log at once
  std::fprintf(stderr, "[grpo %s] ", names[int(l)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  funlockfile(stderr);
}
}  // namespace grpo
