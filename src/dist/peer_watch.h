// Liveness of the other processes of a run that has no launcher to reap it: the
// ranks of an env (torchrun-style) launch started by hand or by a script, and
// the `grpo serve --receive` processes of the NCCL weight bridge. NCCL cannot
// tell a dead peer from a slow one over NVLink or shared memory, so without
// this the survivors wait in a collective until [dist] timeout_s.
//
// The TCP rendezvous connections stay open for the whole run (tcp_rendezvous's
// `keep`): rank 0 holds one to every other process, each other process one to
// rank 0. When a process dies, for whatever reason, the kernel closes its end
// and the other end reads end-of-file at once. A process that ends normally
// first writes a goodbye byte (finish()). A watch thread polls the connections:
// end-of-file without a goodbye marks the run lost; rank 0 then shuts its other
// connections without a goodbye, so every process hears of any death within one
// poll interval (100 ms). The NCCL communicator reads lost() while it waits for
// a collective and aborts with that reason (nccl_communicator.cpp).
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace grpo {

class PeerWatch {
 public:
  // fds: connected sockets, owned from now on; names[i]: who is at the other end of
  // fds[i] ("rank 1"), for messages. hub: this is rank 0, which holds a connection
  // to every other process and passes a loss on to the rest.
  PeerWatch(bool hub, std::vector<int> fds, std::vector<std::string> names);
  // Stops the thread and closes the sockets without a goodbye: a peer still
  // running reads this process as lost unless finish() was called.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Empty while no peer has gone without a goodbye; else which and why.
  std::string lost() const;
  // This process ended normally: a goodbye to every peer still connected.
  void finish();
  // The NCCL weight bridge's update notice: the trainer tells every server that a
  // collective follows, so that a server waits for it on the host (wait_notice)
  // rather than inside a pending NCCL collective, which would block every
  // whole-device synchronisation of its engine while it serves (a deadlock: the
  // trainer waits for the server's rollouts before its next update).
  void notify();
  // Blocks until one notice more than already taken has arrived (ok), the run is
  // lost (its reason) or timeout_s passes.
  Status wait_notice(double timeout_s);

 private:
  void run();
  void mark_lost(const std::string& why);

  bool hub_;
  std::vector<int> fds_;
  std::vector<std::string> names_;
  std::vector<char> done_;  // the peer said goodbye
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string lost_;
  int64_t notices_ = 0, taken_ = 0;
  std::thread thread_;
};

}  // namespace grpo
