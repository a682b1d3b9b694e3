// The MPI backend for CPU ranks (see communicator.h). Errors from MPI use its
// default handler MPI_ERRORS_ARE_FATAL: a dead peer ends the whole job, which
// is what a data-parallel step needs (no rank can continue alone).
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/context.h"
#include "dist/bootstrap.h"

namespace grpo {

namespace {

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ok_status();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return error_status(std::string("MPI ") + what + " failed: " + std::string(msg, size_t(len)));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    serialized_ = level >= MPI_THREAD_SERIALIZED;
  }
  ~MpiCommunicator() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  Status all_reduce_sum(Context&, Tensor& t) override {
    if (t.device != Device::cpu || t.dtype != DType::f32)
      return error_status("MPI all-reduce takes f32 host tensors; GPU ranks use the NCCL backend");
    const int64_t n = t.numel();
    float* data = static_cast<float*>(t.data);
    // Reduce-scatter in rank order: rank r sums chunk r of every rank's buffer as
    // rank 0 + rank 1 + ... so the bits do not depend on MPI's algorithm.
    const std::vector<int64_t> b = split_even(n, size_);
    std::vector<int> send_counts(static_cast<size_t>(size_)), send_displs(static_cast<size_t>(size_)), recv_counts(static_cast<size_t>(size_)),
        recv_displs(static_cast<size_t>(size_));
    const int64_t mine = b[size_t(rank_) + 1] - b[size_t(rank_)];
    for (int r = 0; r < size_; ++r) {
      send_counts[size_t(r)] = int(b[size_t(r) + 1] - b[size_t(r)]);
      send_displs[size_t(r)] = int(b[size_t(r)]);
      recv_counts[size_t(r)] = int(mine);
      recv_displs[size_t(r)] = int(mine * r);
    }
    GRPO_CHECK_MSG(n < (int64_t(1) << 31), "MPI all-reduce of more than 2^31 floats: split the buckets");
    std::vector<float> parts(static_cast<size_t>(mine * size_));
    GRPO_TRY(mpi_status(MPI_Alltoallv(data, send_counts.data(), send_displs.data(), MPI_FLOAT, parts.data(),
                                      recv_counts.data(), recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
                        "alltoallv (reduce-scatter)"));
    float* own = data + b[size_t(rank_)];
    for (int64_t i = 0; i < mine; ++i) {
      float s = parts[size_t(i)];
      for (int r = 1; r < size_; ++r) s += parts[size_t(r * mine + i)];
      own[i] = s;
    }
    return gather_bytes(data, b, sizeof(float), "allgatherv (all-reduce)");
  }

  Status all_reduce_host(std::span<double> v, HostReduce op) override {
    const MPI_Op o = op == HostReduce::sum ? MPI_SUM : op == HostReduce::max ? MPI_MAX : MPI_MIN;
    if (op != HostReduce::sum)
      return mpi_status(MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_DOUBLE, o, MPI_COMM_WORLD),
                        "allreduce");
    // Sums in rank order, as all_reduce_sum, so every rank sees the same bits.
    std::vector<double> all(v.size() * size_t(size_));
    GRPO_TRY(mpi_status(MPI_Allgather(v.data(), int(v.size()), MPI_DOUBLE, all.data(), int(v.size()), MPI_DOUBLE,
                                      MPI_COMM_WORLD),
                        "allgather"));
    for (size_t i = 0; i < v.size(); ++i) {
      double s = all[i];
      for (int r = 1; r < size_; ++r) s += all[size_t(r) * v.size() + i];
      v[i] = s;
    }
    return ok_status();
  }

  Result<std::vector<float>> all_gather_host(std::span<const float> mine) override {
    int n = int(mine.size());
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    GRPO_TRY(mpi_status(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD), "allgather"));
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[size_t(r)] = total;
      total += counts[size_t(r)];
    }
    std::vector<float> all(static_cast<size_t>(total));
    GRPO_TRY(mpi_status(MPI_Allgatherv(mine.data(), n, MPI_FLOAT, all.data(), counts.data(), displs.data(), MPI_FLOAT,
                                       MPI_COMM_WORLD),
                        "allgatherv"));
    return all;
  }

  Status all_gather_ranges(Context&, Tensor& arena, std::span<const int64_t> bounds) override {
    if (arena.device != Device::cpu) return error_status("MPI all-gather takes host tensors; GPU ranks use NCCL");
    GRPO_CHECK(bounds.size() == size_t(size_) + 1 && bounds.back() <= arena.numel());
    return gather_bytes(arena.data, std::vector<int64_t>(bounds.begin(), bounds.end()), dtype_size(arena.dtype),
                        "allgatherv (ZeRO-1 weights)");
  }

  Status broadcast(Context&, Tensor& t, int root) override {
    if (t.device != Device::cpu) return error_status("MPI broadcast takes host tensors; GPU ranks use NCCL");
    GRPO_CHECK(root >= 0 && root < size_);
    // MPI counts are int: pieces of at most 1 GiB.
    char* p = static_cast<char*>(t.data);
    for (size_t done = 0, n = t.nbytes(); done < n;) {
      const size_t c = std::min(n - done, size_t(1) << 30);
      GRPO_TRY(mpi_status(MPI_Bcast(p + done, int(c), MPI_BYTE, root, MPI_COMM_WORLD), "broadcast"));
      done += c;
    }
    return ok_status();
  }

  Status barrier() override { return mpi_status(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }
  bool any_thread() const override { return serialized_; }

 private:
  // Every rank's element range [b[r], b[r+1]) of `data` (elements of `es` bytes) to every rank.
  Status gather_bytes(void* data, const std::vector<int64_t>& b, size_t es, const char* what) {
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const int64_t c = (b[size_t(r) + 1] - b[size_t(r)]) * int64_t(es), d = b[size_t(r)] * int64_t(es);
      GRPO_CHECK_MSG(c < (int64_t(1) << 31) && d < (int64_t(1) << 31),
                     "MPI all-gather of more than 2 GiB per call: the CPU backend is for small models");
      counts[size_t(r)] = int(c);
      displs[size_t(r)] = int(d);
    }
    return mpi_status(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(),
                                     MPI_BYTE, MPI_COMM_WORLD),
                      what);
  }
  int rank_ = 0, size_ = 1;
  bool serialized_ = false;
};

}  // namespace

bool mpi_is_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  return init != 0;
}

std::unique_ptr<Communicator> communicator_mpi_create(int* rank, int* world, int* local_rank) {
  if (!mpi_is_initialized()) {
    int provided = 0;
    // SERIALIZED: the overlapped gradient all-reduce calls MPI from its own thread
    // while the main thread waits; with less, it runs on the main thread instead.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  auto c = std::make_unique<MpiCommunicator>();
  *rank = c->rank();
  *world = c->size();
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank(), MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, local_rank);
  MPI_Comm_free(&node);
  return c;
}

void dist_abort_job(Communicator* comm, int code) {
  if (comm && comm->size() > 1 && mpi_is_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace grpo
