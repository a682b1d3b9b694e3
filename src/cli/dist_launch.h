// Reads the launcher's environment into grpo::DistLaunch (dist/bootstrap.h):
// OpenMPI's OMPI_COMM_WORLD_* (mpirun) or PMI/PMIx ranks (srun --mpi) mean an
// MPI launch; RANK and WORLD_SIZE (torchrun, Slurm scripts) an env launch with
// MASTER_ADDR / MASTER_PORT / LOCAL_RANK; neither, one rank.
#pragma once
#include <string>

#include "core/status.h"
#include "dist/bootstrap.h"

namespace grpo::cli {

Result<DistLaunch> dist_launch_from_env();

// Multi-rank CUDA runs: pins this process to GPU LOCAL_RANK through
// CUDA_VISIBLE_DEVICES when the launcher left it unset (before any CUDA call).
void dist_pin_local_gpu(const DistLaunch& l);

}  // namespace grpo::cli
