// Minimal leveled logging to stderr. The CLI sets the level; library code logs
// sparingly (warnings that a user must see, progress at info).
#pragma once
#include <cstdarg>

namespace grpo {
enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, quiet = 4 };
void log_set_level(LogLevel l);
LogLevel log_level();
void log_msg(LogLevel l, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
}  // namespace grpo

#define GRPO_LOG_INFO(...) ::grpo::log_msg(::grpo::LogLevel::info, __VA_ARGS__)
#define GRPO_LOG_WARN(...) ::grpo::log_msg(::grpo::LogLevel::warn, __VA_ARGS__)
#define GRPO_LOG_DEBUG(...) ::grpo::log_msg(::grpo::LogLevel::debug, __VA_ARGS__)
