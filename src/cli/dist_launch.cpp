// Launcher environment -> DistLaunch (see dist_launch.h).
#include "cli/dist_launch.h"

#include <cstdlib>

namespace grpo::cli {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Result<int> env_int(const char* name, int dflt) {
  const char* v = env(name);
  if (!v) return dflt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1000000)
    return error_status(std::string(name) + "=" + v + ": expected a non-negative integer, as launchers set it");
  return int(x);
}

}  // namespace

Result<DistLaunch> dist_launch_from_env() {
  DistLaunch l;
  if (env("OMPI_COMM_WORLD_SIZE") || env("PMI_SIZE") || env("PMIX_RANK")) {
    l.kind = LaunchKind::mpi;
    GRPO_ASSIGN_OR_RETURN(l.local_rank, env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    GRPO_ASSIGN_OR_RETURN(l.world_size, env_int("OMPI_COMM_WORLD_SIZE", 1));
    return l;
  }
  if (!env("WORLD_SIZE") && !env("RANK")) return l;
  if (!env("WORLD_SIZE") || !env("RANK"))
    return error_status("RANK and WORLD_SIZE must be set together (torchrun-style launch); unset both for one rank");
  l.kind = LaunchKind::env;
  GRPO_ASSIGN_OR_RETURN(l.rank, env_int("RANK", 0));
  GRPO_ASSIGN_OR_RETURN(l.world_size, env_int("WORLD_SIZE", 1));
  GRPO_ASSIGN_OR_RETURN(l.local_rank, env_int("LOCAL_RANK", l.rank));
  if (const char* a = env("MASTER_ADDR")) l.master_addr = a;
  GRPO_ASSIGN_OR_RETURN(l.master_port, env_int("MASTER_PORT", 0));
  return l;
}

void dist_pin_local_gpu(const DistLaunch& l) {
  if (l.world_size > 1 && !env("CUDA_VISIBLE_DEVICES"))
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(l.local_rank).c_str(), 1);
}

}  // namespace grpo::cli
