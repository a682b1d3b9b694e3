// `grpo version`: build information.
#include <cstdio>

#include "cli/command.h"
#include "core/tensor.h"

namespace {
grpo::cli::CommandRegistrar reg("version", "Print the version and the backends this build has", [](CLI::App*) {
  return []() {
#ifdef GRPO_HAVE_CUDA
    const char* cuda = "cuda";
#else
    const char* cuda = "no cuda";
#endif
    std::printf("grpo.cpp 0.1.0 (cpu, %s; cuda device visible: %s)\n", cuda, grpo::cuda_available() ? "yes" : "no");
    return 0;
  };
});
}  // namespace
