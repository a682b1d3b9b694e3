// Collectives between the ranks of a data-parallel run, behind one interface
// with three backends: Local (one rank, no library), MPI (CPU ranks launched
// by mpirun) and NCCL (one GPU per rank; bootstrapped over MPI or a TCP
// rendezvous, dist/bootstrap.h). Every collective is called by every rank in
// the same order; a rank that never arrives is the failure case of
// docs/distributed.md (MPI aborts the job; NCCL is aborted by a watchdog).
//
// Determinism: all_reduce_sum gives every rank the same bits. The MPI backend
// sums the contributions in rank order (reduce-scatter by alltoall, sum
// r = 0..N-1, all-gather), independent of MPI's algorithm choice; NCCL's ring
// is fixed for a given world size and topology.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace grpo {

class Context;

enum class HostReduce { sum, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  // This rank ended its run normally (after its last collective): tells peers that
  // watch its liveness (dist/peer_watch.h) that its exit is not a failure.
  virtual void finish() {}
  // Weight bridge (dist/peer_watch.h): the root announces a collective to the other
  // ranks on the host side; a rank waits for the announcement before entering it.
  // No-ops without liveness links (MPI, one rank).
  virtual void notify_peers() {}
  virtual Status wait_notice(double timeout_s) { (void)timeout_s; return ok_status(); }
  // In place: t (f32, contiguous, on the communicator's device) becomes the
  // sum over ranks. Enqueued on ctx's stream for NCCL; done on return for MPI.
  virtual Status all_reduce_sum(Context& ctx, Tensor& t) = 0;
  // Small host vectors (metrics, token counts, stop flags), same length on every rank.
  virtual Status all_reduce_host(std::span<double> v, HostReduce op) = 0;
  // Every rank's `mine` (lengths may differ), concatenated in rank order.
  virtual Result<std::vector<float>> all_gather_host(std::span<const float> mine) = 0;
  // `arena` is the same flat buffer on every rank; rank r owns elements
  // [bounds[r], bounds[r+1]) (bounds has size()+1 entries). Afterwards every
  // rank holds every rank's range (ZeRO-1's all-gather of updated weights).
  virtual Status all_gather_ranges(Context& ctx, Tensor& arena, std::span<const int64_t> bounds) = 0;
  // In place: every rank's `t` (contiguous, any dtype, on the communicator's device)
  // becomes rank `root`'s. Done on return. Used by the NCCL weight bridge
  // (dist/weight_broadcast.h).
  virtual Status broadcast(Context& ctx, Tensor& t, int root) = 0;
  // Waits until every rank arrives.
  virtual Status barrier() = 0;
  // Whether collectives may be called from a thread other than the one that
  // created the communicator (one thread at a time): the gradient all-reduce
  // overlapped with the backward runs them on its own thread when this holds.
  virtual bool any_thread() const { return true; }
};

// World size 1: every collective is the identity.
std::unique_ptr<Communicator> communicator_local();

// Splits n items into `parts` contiguous ranges, the first n % parts one longer:
// returns parts+1 bounds. Used for prompts per rank and for ZeRO-1 shards.
std::vector<int64_t> split_even(int64_t n, int parts);

}  // namespace grpo
