// Invariant checks that abort with expression, file and line. For bugs, not
// for user input: user input is validated at the boundary and returns Status.
#pragma once
#include <cstdio>
#include <cstdlib>

namespace grpo {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* msg);
}

#define GRPO_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) ::grpo::check_failed(#cond, __FILE__, __LINE__, nullptr); \
  } while (0)
#define GRPO_CHECK_MSG(cond, msg)                                      \
  do {                                                                 \
    if (!(cond)) ::grpo::check_failed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
