// How this process learns its place in a data-parallel run. src/cli reads the
// launcher's environment into DistLaunch (only the CLI reads the environment);
// dist_init turns it into a Communicator:
//   single : one rank, no library calls (the default)
//   mpi    : started by mpirun/srun with OpenMPI; CPU ranks use MPI
//            collectives, CUDA ranks NCCL with its id broadcast over MPI
//   env    : torchrun/Slurm-style RANK / WORLD_SIZE / LOCAL_RANK /
//            MASTER_ADDR / MASTER_PORT; CUDA ranks only (NCCL, id handed out
//            by rank 0 over a TCP rendezvous); CPU ranks must use mpirun.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "dist/communicator.h"
#include "dist/peer_watch.h"

namespace grpo {

enum class LaunchKind { single, mpi, env };

struct DistLaunch {
  LaunchKind kind = LaunchKind::single;
  int rank = 0, world_size = 1, local_rank = 0;  // env: from the variables; mpi: filled by dist_init
  std::string master_addr;                       // env only
  int master_port = 0;
  double timeout_s = 300;  // NCCL watchdog and rendezvous limit ([dist] timeout_s)
};

// Brings up the communicator for ranks on `device`. Errors say which variable
// or library is missing and how to launch instead.
Result<std::unique_ptr<Communicator>> dist_init(DistLaunch& launch, Device device);

// MPI only: ends the whole job from any rank (MPI_Abort) after a fatal error
// on one rank, so that no rank waits forever in a collective. No-op otherwise.
void dist_abort_job(Communicator* comm, int code);

std::unique_ptr<Communicator> communicator_mpi_create(int* rank, int* world, int* local_rank);
bool mpi_is_initialized();
#ifdef GRPO_HAVE_CUDA
// id_bytes is the 128-byte ncclUniqueId, already identical on every rank. With
// `watch`, a collective that waits on a peer the watch reports lost is aborted at
// once with the watch's reason (else after timeout_s).
Result<std::unique_ptr<Communicator>> communicator_nccl_create(const std::string& id_bytes, int rank, int world,
                                                               double timeout_s,
                                                               std::unique_ptr<PeerWatch> watch = nullptr);
Result<std::string> nccl_make_id();
#endif
// Connections a rendezvous leaves open (for dist/peer_watch.h): sockets and the
// rank at the other end of each (rank 0: every other rank; others: rank 0).
struct KeptLinks {
  std::vector<int> fds;
  std::vector<int> ranks;
};

// TCP rendezvous: rank 0 listens on addr:port and sends `payload` to each of
// the world-1 other ranks, which connect (retrying until timeout_s) and
// return it. Rank 0 returns its own payload. With `keep` (on every rank or on
// none) each rank answers with its rank number and the connections stay open,
// handed over in *keep. Rank 0 gives up with an error soon after *cancel turns true.
Result<std::string> tcp_rendezvous(const std::string& addr, int port, int rank, int world, const std::string& payload,
                                   double timeout_s, KeptLinks* keep = nullptr,
                                   const std::atomic<bool>* cancel = nullptr);

}  // namespace grpo
