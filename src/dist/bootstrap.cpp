// dist_init (see bootstrap.h) and the TCP rendezvous that hands the NCCL id
// from rank 0 to the other ranks of an env-var (torchrun-style) launch.
#include "dist/bootstrap.h"

#include <arpa/inet.h>
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/timer.h"

namespace grpo {

namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() { if (fd >= 0) ::close(fd); }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

Status send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return error_status(std::string("rendezvous send: ") + std::strerror(errno));
    c += k;
    n -= size_t(k);
  }
  return ok_status();
}

Status recv_all(int fd, void* p, size_t n, double deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    const int left_ms = int(std::max(0.0, deadline - now_seconds()) * 1000);
    const int pr = ::poll(&pf, 1, left_ms);
    if (pr == 0) return error_status("rendezvous: rank 0 sent nothing before the timeout");
    if (pr < 0 && errno == EINTR) continue;
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return error_status("rendezvous: rank 0 closed the connection early");
    c += k;
    n -= size_t(k);
  }
  return ok_status();
}

}  // namespace

Result<std::string> tcp_rendezvous(const std::string& addr, int port, int rank, int world, const std::string& payload,
                                   double timeout_s, KeptLinks* keep, const std::atomic<bool>* cancel) {
  const double deadline = now_seconds() + timeout_s;
  const std::string where = addr + ":" + std::to_string(port);
  if (rank == 0) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));
    if (s.fd < 0) return error_status(std::string("rendezvous socket: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);  // MASTER_ADDR names this host for the others
    sa.sin_port = htons(uint16_t(port));
    if (::bind(s.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
      return error_status("rendezvous: rank 0 cannot listen on port " + std::to_string(port) + ": " +
                          std::strerror(errno) + "; choose a free MASTER_PORT");
    if (::listen(s.fd, world) != 0) return error_status(std::string("rendezvous listen: ") + std::strerror(errno));
    const uint32_t len = uint32_t(payload.size());
    for (int got = 1; got < world;) {
      if (cancel && cancel->load()) return error_status("rendezvous at " + where + ": cancelled");
      pollfd pf{s.fd, POLLIN, 0};
      const double left_s = std::max(0.0, deadline - now_seconds());
      const int pr = ::poll(&pf, 1, int(std::min(left_s, cancel ? 0.2 : 3600.0) * 1000));
      if (pr == 0 && now_seconds() < deadline) continue;
      if (pr == 0)
        return error_status("rendezvous: only " + std::to_string(got) + " of " + std::to_string(world) +
                            " ranks reached " + where + " within " + std::to_string(int(timeout_s)) +
                            " s; check WORLD_SIZE and that every rank was started");
      if (pr < 0) continue;
      Fd c(::accept(s.fd, nullptr, nullptr));
      if (c.fd < 0) continue;
      GRPO_TRY(send_all(c.fd, &len, sizeof len));
      GRPO_TRY(send_all(c.fd, payload.data(), payload.size()));
      if (keep) {  // the other side names its rank; the connection stays open
        int32_t r = -1;
        GRPO_TRY(recv_all(c.fd, &r, sizeof r, deadline));
        keep->ranks.push_back(int(r));
        keep->fds.push_back(c.release());
      }
      ++got;
    }
    return payload;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return error_status("rendezvous: MASTER_ADDR " + addr + ": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, freeaddrinfo);
  while (true) {
    Fd c(::socket(AF_INET, SOCK_STREAM, 0));
    if (c.fd >= 0 && ::connect(c.fd, res->ai_addr, res->ai_addrlen) == 0) {
      uint32_t len = 0;
      GRPO_TRY(recv_all(c.fd, &len, sizeof len, deadline));
      std::string out(len, '\0');
      GRPO_TRY(recv_all(c.fd, out.data(), len, deadline));
      if (keep) {
        const int32_t r = rank;
        GRPO_TRY(send_all(c.fd, &r, sizeof r));
        keep->ranks.push_back(0);
        keep->fds.push_back(c.release());
      }
      return out;
    }
    if (now_seconds() > deadline)
      return error_status("rendezvous: rank " + std::to_string(rank) + " could not reach rank 0 at " + where +
                          " within " + std::to_string(int(timeout_s)) + " s; check MASTER_ADDR / MASTER_PORT");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Result<std::unique_ptr<Communicator>> dist_init(DistLaunch& l, Device device) {
  if (l.kind == LaunchKind::single) return communicator_local();
  if (l.kind == LaunchKind::mpi) {
    int rank = 0, world = 1, local = 0;
    auto mpi = communicator_mpi_create(&rank, &world, &local);
    l.rank = rank;
    l.world_size = world;
    l.local_rank = local;
    if (device == Device::cpu) return std::unique_ptr<Communicator>(std::move(mpi));
#ifdef GRPO_HAVE_CUDA
    std::string id(128, '\0');
    if (rank == 0) {
      GRPO_ASSIGN_OR_RETURN(id, nccl_make_id());
    }
    MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    // The MPI communicator stays alive (MPI is finalised at exit) for dist_abort_job.
    static std::unique_ptr<Communicator> keep_mpi;
    keep_mpi = std::move(mpi);
    return communicator_nccl_create(id, rank, world, l.timeout_s);
#else
    return error_status("GPU ranks need a CUDA build with NCCL (this binary has no CUDA)");
#endif
  }
  if (l.world_size < 1 || l.rank < 0 || l.rank >= l.world_size)
    return error_status("RANK " + std::to_string(l.rank) + " / WORLD_SIZE " + std::to_string(l.world_size) +
                        ": need 0 <= RANK < WORLD_SIZE");
  if (l.world_size == 1) {
#ifdef GRPO_HAVE_CUDA
    if (device == Device::cuda) {
      GRPO_ASSIGN_OR_RETURN(std::string id, nccl_make_id());
      return communicator_nccl_create(id, 0, 1, l.timeout_s);
    }
#endif
    return communicator_local();
  }
  if (device == Device::cpu)
    return error_status("WORLD_SIZE=" + std::to_string(l.world_size) +
                        " with CPU ranks: launch CPU ranks with mpirun (mpirun -np N grpo train CFG); the "
                        "RANK/WORLD_SIZE/MASTER_ADDR launch is for GPU ranks (NCCL)");
#ifdef GRPO_HAVE_CUDA
  if (l.master_addr.empty() || l.master_port <= 0 || l.master_port > 65535)
    return error_status("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT (1..65535) naming rank 0's host and a "
                        "free port, as torchrun and Slurm scripts set them");
  std::string id;
  if (l.rank == 0) {
    GRPO_ASSIGN_OR_RETURN(id, nccl_make_id());
  }
  // No launcher reaps an env launch when one rank dies: the rendezvous connections
  // stay open as the ranks' liveness links (dist/peer_watch.h).
  KeptLinks links;
  GRPO_ASSIGN_OR_RETURN(id, tcp_rendezvous(l.master_addr, l.master_port, l.rank, l.world_size, id, l.timeout_s, &links));
  std::vector<std::string> names;
  for (int r : links.ranks) names.push_back("rank " + std::to_string(r));
  auto watch = std::make_unique<PeerWatch>(l.rank == 0, std::move(links.fds), std::move(names));
  return communicator_nccl_create(id, l.rank, l.world_size, l.timeout_s, std::move(watch));
#else
  return error_status("GPU ranks need a CUDA build with NCCL (this binary has no CUDA)");
#endif
}

}  // namespace grpo
