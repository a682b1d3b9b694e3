// NCCL weight bridge: transfer plan, handshake, sender and receiver (see weight_broadcast.h).
#include "dist/weight_broadcast.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/log.h"
#include "core/timer.h"
#include "dist/bootstrap.h"

namespace grpo {

namespace {

constexpr double kMagic = 7130.25;  // "a grpo.cpp weight header", exact in a double
constexpr int kHeader = 5;          // magic, version, kind, n_buckets, total_bytes

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

TransferPlan plan_of(const Tensor& arena, std::vector<std::pair<std::string, Tensor*>> params, BroadcastKind kind,
                     int64_t bucket_bytes) {
  GRPO_CHECK(bucket_bytes >= 1);
  TransferPlan p;
  p.kind = kind;
  p.dtype = arena.dtype;
  uint64_t h = 14695981039346656037ull;
  const int k = int(kind), dt = int(arena.dtype);
  h = fnv1a(h, &k, sizeof k);
  h = fnv1a(h, &dt, sizeof dt);
  const char* base = static_cast<const char*>(arena.data);
  int64_t end = 0;
  for (auto& [name, t] : params) {
    const int64_t off = static_cast<const char*>(t->data) - base;
    GRPO_CHECK_MSG(off >= 0 && off + int64_t(t->nbytes()) <= int64_t(arena.nbytes()), "a parameter outside its arena");
    if (off < end) continue;  // an alias (tied lm_head) of bytes already planned
    p.tensors.push_back({name, off, int64_t(t->nbytes())});
    end = off + int64_t(t->nbytes());
    h = fnv1a(h, name.data(), name.size() + 1);
    h = fnv1a(h, &off, sizeof off);
    for (int d = 0; d < t->ndim; ++d) h = fnv1a(h, &t->shape[d], sizeof(int64_t));
  }
  p.total_bytes = end;
  p.layout_hash = h;
  // Buckets over [0, end): consecutive tensors while they fit, big tensors split.
  int64_t pos = 0;
  size_t ti = 0;
  while (pos < end) {
    BroadcastBucket b;
    b.byte_offset = pos;
    const int64_t limit = std::min(end, pos + bucket_bytes);
    // The bucket ends at the last tensor boundary inside the limit, or at the limit
    // when the first tensor alone is larger.
    int64_t stop = limit;
    size_t j = ti;
    while (j < p.tensors.size() && p.tensors[j].byte_offset + p.tensors[j].nbytes <= limit) ++j;
    if (j > ti && limit < end) stop = p.tensors[j - 1].byte_offset + p.tensors[j - 1].nbytes;
    if (stop <= pos) stop = limit;
    b.nbytes = stop - pos;
    while (ti + 1 < p.tensors.size() && p.tensors[ti].byte_offset + p.tensors[ti].nbytes <= pos) ++ti;
    b.first_tensor = int(ti);
    size_t last = ti;
    while (last + 1 < p.tensors.size() && p.tensors[last + 1].byte_offset < stop) ++last;
    b.last_tensor = int(last);
    p.buckets.push_back(b);
    pos = stop;
  }
  return p;
}

// A plan's hash as four exact doubles (16 bits each).
void hash_pieces(uint64_t h, double* out) {
  for (int i = 0; i < 4; ++i) out[i] = double((h >> (16 * i)) & 0xffff);
}

}  // namespace

std::string TransferPlan::summary() const {
  int64_t biggest = 0;
  for (const auto& b : buckets) biggest = std::max(biggest, b.nbytes);
  char s[192];
  std::snprintf(s, sizeof s, "%s: %zu tensors, %.2f MiB %s in %zu buckets of <= %.2f MiB",
                kind == BroadcastKind::full ? "full weights" : "LoRA adapters", tensors.size(),
                double(total_bytes) / (1 << 20), dtype_name(dtype), buckets.size(), double(biggest) / (1 << 20));
  return s;
}

TransferPlan transfer_plan(const ModelWeights& w, int64_t bucket_bytes) {
  return plan_of(w.arena, const_cast<ModelWeights&>(w).params(), BroadcastKind::full, bucket_bytes);
}

TransferPlan transfer_plan(const LoraWeights& l, int64_t bucket_bytes) {
  return plan_of(l.arena, const_cast<LoraWeights&>(l).params(), BroadcastKind::adapter, bucket_bytes);
}

Status BroadcastOptions::validate() const {
  if (root < 0) return error_status("weight bridge: root rank must be >= 0");
  if (bucket_bytes < 4096)
    return error_status("weight bridge: bucket_bytes = " + std::to_string(bucket_bytes) + " must be >= 4096");
  if (on_failure != "error" && on_failure != "continue")
    return error_status("weight bridge: on_failure = \"" + on_failure +
                        "\" must be \"error\" (stop training) or \"continue\" (train on without the server)");
  return ok_status();
}

Status bridge_parse_addr(const std::string& s, const std::string& what, std::string* host, int* port) {
  const size_t c = s.rfind(':');
  int p = 0;
  bool ok = c != std::string::npos && c > 0 && c + 1 < s.size();
  for (size_t i = c + 1; ok && i < s.size(); ++i) {
    ok = s[i] >= '0' && s[i] <= '9' && p < 65536;
    p = p * 10 + (s[i] - '0');
  }
  if (!ok || p < 1 || p > 65535)
    return error_status(what + " = \"" + s + "\": expected HOST:PORT with a port in 1..65535, e.g. 127.0.0.1:29650");
  *host = s.substr(0, c);
  *port = p;
  return ok_status();
}

Result<std::unique_ptr<Communicator>> bridge_connect_trainer(const std::string& addr, int port, int n_servers,
                                                             double timeout_s) {
#ifdef GRPO_HAVE_CUDA
  if (n_servers < 1) return error_status("weight bridge: at least one server");
  GRPO_ASSIGN_OR_RETURN(std::string id, nccl_make_id());
  const int world = 1 + n_servers;
  std::string payload(reinterpret_cast<const char*>(&world), sizeof world);
  payload += id;
  // The rendezvous connections stay open: a server that dies is noticed at the next
  // update instead of after timeout_s (dist/peer_watch.h).
  KeptLinks links;
  GRPO_TRY(tcp_rendezvous(addr, port, 0, world, payload, timeout_s, &links)
               .status()
               .with_context("weight bridge: waiting for " + std::to_string(n_servers) + " grpo serve --receive " + addr +
                             ":" + std::to_string(port)));
  std::vector<std::string> names;
  for (int r : links.ranks) names.push_back("grpo serve --receive-rank " + std::to_string(r));
  return communicator_nccl_create(id, 0, world, timeout_s,
                                  std::make_unique<PeerWatch>(true, std::move(links.fds), std::move(names)));
#else
  (void)addr, (void)port, (void)n_servers, (void)timeout_s;
  return error_status("the NCCL weight bridge needs a CUDA build (NCCL between GPUs); on the CPU follow the run with "
                      "grpo serve --watch");
#endif
}

Result<std::unique_ptr<Communicator>> bridge_connect_server(const std::string& addr, int port, int rank,
                                                            double timeout_s) {
#ifdef GRPO_HAVE_CUDA
  if (rank < 1) return error_status("--receive-rank must be >= 1 (rank 0 is the trainer)");
  KeptLinks links;
  auto got = tcp_rendezvous(addr, port, rank, 0, "", timeout_s, &links);
  if (!got.ok()) return got.status().with_context("--receive " + addr + ":" + std::to_string(port));
  const std::string& payload = got.value();
  int world = 0;
  if (payload.size() <= sizeof world) return error_status("weight bridge: a malformed rendezvous payload");
  std::memcpy(&world, payload.data(), sizeof world);
  if (rank >= world)
    return error_status("--receive-rank " + std::to_string(rank) + ": the trainer expects " +
                        std::to_string(world - 1) + " server(s) (ranks 1.." + std::to_string(world - 1) + ")");
  return communicator_nccl_create(
      payload.substr(sizeof world), rank, world, timeout_s,
      std::make_unique<PeerWatch>(false, std::move(links.fds), std::vector<std::string>{"the trainer (grpo train)"}));
#else
  (void)addr, (void)port, (void)rank, (void)timeout_s;
  return error_status("--receive: the NCCL weight bridge needs a CUDA build (NCCL between GPUs); on the CPU follow "
                      "the run with --watch RUN_DIR");
#endif
}

BridgeRejoin::BridgeRejoin(std::string host, int port, int n_servers, double timeout_s)
    : host_(std::move(host)), port_(port), n_servers_(n_servers), timeout_s_(timeout_s) {
  thread_ = std::thread([this] {
#ifdef GRPO_HAVE_CUDA
    auto id = nccl_make_id();
    if (!id.ok()) {
      status_ = id.status();
    } else {
      id_ = id.value();
      const int world = 1 + n_servers_;
      std::string payload(reinterpret_cast<const char*>(&world), sizeof world);
      payload += id_;
      // No deadline of its own: servers may come back at any time during the run.
      status_ = tcp_rendezvous(host_, port_, 0, world, payload, 1e9, &links_, &cancel_).status();
    }
#else
    status_ = error_status("the NCCL weight bridge needs a CUDA build");
#endif
    ready_ = true;
  });
}

BridgeRejoin::~BridgeRejoin() {
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : links_.fds) ::close(fd);  // not taken: the servers read the trainer as gone
}

Result<std::unique_ptr<Communicator>> BridgeRejoin::take() {
  GRPO_CHECK(ready_.load());
  if (thread_.joinable()) thread_.join();
  if (!status_.ok()) return status_.with_context("weight bridge: waiting for servers to rejoin");
#ifdef GRPO_HAVE_CUDA
  std::vector<std::string> names;
  for (int r : links_.ranks) names.push_back("grpo serve --receive-rank " + std::to_string(r));
  auto watch = std::make_unique<PeerWatch>(true, std::move(links_.fds), std::move(names));
  links_ = {};
  return communicator_nccl_create(id_, 0, 1 + n_servers_, timeout_s_, std::move(watch));
#else
  return error_status("the NCCL weight bridge needs a CUDA build");
#endif
}

Status broadcast_handshake(Communicator& comm, const TransferPlan& plan, const BroadcastOptions& opt) {
  GRPO_TRY(opt.validate());
  if (opt.root >= comm.size())
    return error_status("weight bridge: root rank " + std::to_string(opt.root) + " but only " +
                        std::to_string(comm.size()) + " ranks");
  if (comm.size() < 2) return error_status("weight bridge: needs the trainer and at least one server rank");
  // min and max of every piece agree exactly when every rank has the same plan.
  double lo[7], hi[7];
  hash_pieces(plan.layout_hash, lo);
  lo[4] = double(plan.total_bytes);
  lo[5] = double(plan.kind);
  lo[6] = double(plan.buckets.size());
  std::copy(lo, lo + 7, hi);
  GRPO_TRY(comm.all_reduce_host(std::span<double>(lo, 7), HostReduce::min).with_context("weight bridge handshake"));
  GRPO_TRY(comm.all_reduce_host(std::span<double>(hi, 7), HostReduce::max).with_context("weight bridge handshake"));
  if (!std::equal(lo, lo + 7, hi))
    return error_status("weight bridge handshake (rank " + std::to_string(comm.rank()) + "): the ranks hold different " +
                        "models (this rank: " + plan.summary() + "; totals over ranks range from " +
                        std::to_string(int64_t(lo[4])) + " to " + std::to_string(int64_t(hi[4])) +
                        " bytes); start the server with the trainer's model (same architecture, dtype, LoRA shape)");
  return ok_status();
}

WeightBroadcaster::WeightBroadcaster(Communicator& comm, Tensor arena, TransferPlan plan, BroadcastOptions opt)
    : comm_(comm), arena_(arena), plan_(std::move(plan)), opt_(std::move(opt)) {}

Status WeightBroadcaster::fail(Status st) {
  stats_.last_error = st.message();
  if (opt_.on_failure == "continue") {
    stats_.down = true;
    GRPO_LOG_WARN("weight bridge down (on_failure = \"continue\"): %s; training goes on without the server",
                  st.message().c_str());
    return ok_status();
  }
  return st.with_context("weight bridge (on_failure = \"error\"; \"continue\" trains on without the server)");
}

Status WeightBroadcaster::publish(Context& ctx, int64_t version) {
  if (stats_.down) return ok_status();
  GRPO_CHECK(version >= 0);
  const double t0 = now_seconds();
  double hdr[kHeader] = {kMagic, double(version), double(plan_.kind), double(plan_.buckets.size()),
                         double(plan_.total_bytes)};
  comm_.notify_peers();  // the servers wait for this on the host, not inside the collective
  Status st = comm_.all_reduce_host(std::span<double>(hdr, kHeader), HostReduce::max);
  if (!st.ok()) return fail(st.with_context("header of version " + std::to_string(version)));
  char* base = static_cast<char*>(arena_.data);
  for (size_t i = 0; i < plan_.buckets.size(); ++i) {
    const BroadcastBucket& b = plan_.buckets[i];
    Tensor piece = tensor_borrow(base + b.byte_offset, DType::u8, arena_.device, {b.nbytes});
    st = comm_.broadcast(ctx, piece, opt_.root);
    if (!st.ok())
      return fail(st.with_context("version " + std::to_string(version) + ", bucket " + std::to_string(i + 1) + "/" +
                                  std::to_string(plan_.buckets.size()) + " (" + plan_.tensors[size_t(b.first_tensor)].name +
                                  ")"));
  }
  stats_.n_updates++;
  stats_.bytes += plan_.total_bytes;
  stats_.version = version;
  stats_.last_s = now_seconds() - t0;
  return ok_status();
}

Status WeightBroadcaster::finish() {
  if (stats_.down) return ok_status();
  double hdr[kHeader] = {kMagic, -1, double(plan_.kind), 0, 0};
  comm_.notify_peers();
  Status st = comm_.all_reduce_host(std::span<double>(hdr, kHeader), HostReduce::max);
  if (!st.ok()) return fail(st.with_context("final header"));
  comm_.finish();
  return st;
}

WeightReceiver::WeightReceiver(Communicator& comm, Tensor arena, TransferPlan plan, BroadcastOptions opt)
    : comm_(comm), arena_(arena), plan_(std::move(plan)), opt_(std::move(opt)) {}

Result<int64_t> WeightReceiver::wait_header() {
  GRPO_CHECK_MSG(pending_ == -2, "wait_header twice without receive()");
  // The root's header wins the max; receivers contribute the lowest double.
  // Wait on the host for the trainer's notice: a pending NCCL collective would stall
  // every whole-device synchronisation of the engine serving meanwhile.
  GRPO_TRY(comm_.wait_notice(1e9).with_context("weight bridge: waiting for the trainer's next update"));
  double hdr[kHeader];
  std::fill(hdr, hdr + kHeader, std::numeric_limits<double>::lowest());
  GRPO_TRY(comm_.all_reduce_host(std::span<double>(hdr, kHeader), HostReduce::max).with_context("weight bridge header"));
  if (hdr[0] != kMagic)
    return error_status("weight bridge: a header without the grpo.cpp magic; another program or version is rank " +
                        std::to_string(opt_.root));
  const int64_t v = int64_t(hdr[1]);
  if (v == -1) {
    comm_.finish();  // the trainer is done; this server leaving later is no failure
    return v;
  }
  if (hdr[2] != double(plan_.kind) || hdr[3] != double(plan_.buckets.size()) || hdr[4] != double(plan_.total_bytes))
    return error_status("weight bridge: version " + std::to_string(v) + " announces " + std::to_string(int64_t(hdr[3])) +
                        " buckets of " + std::to_string(int64_t(hdr[4])) + " bytes; this server's plan is " +
                        plan_.summary());
  pending_ = v;
  return v;
}

Status WeightReceiver::receive(Context& ctx) {
  GRPO_CHECK_MSG(pending_ >= 0, "receive() without an announced version (wait_header first)");
  const double t0 = now_seconds();
  char* base = static_cast<char*>(arena_.data);
  for (size_t i = 0; i < plan_.buckets.size(); ++i) {
    const BroadcastBucket& b = plan_.buckets[i];
    Tensor piece = tensor_borrow(base + b.byte_offset, DType::u8, arena_.device, {b.nbytes});
    Status st = comm_.broadcast(ctx, piece, opt_.root);
    if (!st.ok())
      return st.with_context("weight bridge: version " + std::to_string(pending_) + ", bucket " +
                             std::to_string(i + 1) + "/" + std::to_string(plan_.buckets.size()) +
                             " (the weights are partly updated: do not serve them)");
  }
  stats_.n_updates++;
  stats_.bytes += plan_.total_bytes;
  stats_.version = pending_;
  stats_.last_s = now_seconds() - t0;
  pending_ = -2;
  return ok_status();
}

}  // namespace grpo
