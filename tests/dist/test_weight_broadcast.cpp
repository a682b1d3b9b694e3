// The NCCL weight bridge's CPU-testable parts (dist/weight_broadcast.h): the
// transfer plan (coverage, bucket bounds, layout hash), failure handling with a
// communicator that fails on purpose, and the protocol on 2 MPI ranks under
// mpirun (this binary re-runs itself as the ranks): versions arrive in order and
// every byte matches what the trainer rank computed; a server of another model is
// refused on both ranks before any weights move. The two-GPU NCCL run is a
// separate issue.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/bootstrap.h"
#include "dist/weight_broadcast.h"
#include "model/checkpoint.h"

using namespace grpo;

namespace {

std::string arith_dir() { return std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny"; }

ModelWeights arith() {
  auto w = model_load(arith_dir(), Device::cpu, DType::f32);
  GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
  return std::move(w).value();
}

// Fails broadcast number `fail_at` (1-based; 0 = never); counts calls.
class FlakyComm final : public Communicator {
 public:
  explicit FlakyComm(int fail_at) : fail_at_(fail_at) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "flaky"; }
  Status all_reduce_sum(Context&, Tensor&) override { return ok_status(); }
  Status all_reduce_host(std::span<double>, HostReduce) override {
    ++n_host;
    return ok_status();
  }
  Result<std::vector<float>> all_gather_host(std::span<const float> m) override { return std::vector<float>(m.begin(), m.end()); }
  Status all_gather_ranges(Context&, Tensor&, std::span<const int64_t>) override { return ok_status(); }
  Status broadcast(Context&, Tensor&, int) override {
    if (++n_bcast == fail_at_) return error_status("peer rank 1 is gone (simulated)");
    return ok_status();
  }
  Status barrier() override { return ok_status(); }
  int n_bcast = 0, n_host = 0;

 private:
  int fail_at_;
};

}  // namespace

TEST(WeightBroadcastPlan, CoversTheArenaInBoundedBuckets) {
  ModelWeights w = arith();
  const int64_t arena_bytes = int64_t(w.arena.nbytes());
  int64_t biggest = 0;
  for (auto& [n, t] : w.params()) biggest = std::max(biggest, int64_t(t->nbytes()));
  for (int64_t bucket : {int64_t(4096), biggest / 3, biggest, int64_t(1) << 30}) {
    TransferPlan p = transfer_plan(w, bucket);
    SCOPED_TRACE(p.summary());
    EXPECT_EQ(p.total_bytes, arena_bytes);
    EXPECT_EQ(p.tensors.size(), w.params().size());  // untied: every parameter once
    int64_t pos = 0;
    for (const auto& b : p.buckets) {
      EXPECT_EQ(b.byte_offset, pos);
      EXPECT_GT(b.nbytes, 0);
      EXPECT_LE(b.nbytes, bucket);
      // The tensors it names really overlap it.
      const auto& f = p.tensors[size_t(b.first_tensor)];
      const auto& l = p.tensors[size_t(b.last_tensor)];
      EXPECT_LT(f.byte_offset, b.byte_offset + b.nbytes);
      EXPECT_GT(f.byte_offset + f.nbytes, b.byte_offset);
      EXPECT_LT(l.byte_offset, b.byte_offset + b.nbytes);
      pos += b.nbytes;
    }
    EXPECT_EQ(pos, arena_bytes);
    if (bucket >= biggest) {  // whole tensors: every bucket boundary is a tensor boundary
      for (const auto& b : p.buckets) {
        bool starts = false;
        for (const auto& t : p.tensors) starts |= t.byte_offset == b.byte_offset;
        EXPECT_TRUE(starts) << "bucket at " << b.byte_offset << " cuts a tensor";
      }
    }
  }
  EXPECT_EQ(transfer_plan(w, int64_t(1) << 30).buckets.size(), 1u);
  EXPECT_GE(transfer_plan(w, biggest / 3).buckets.size(), 3u);
}

TEST(WeightBroadcastPlan, HashFollowsTheLayoutNotTheValues) {
  ModelWeights a = arith(), b = arith();
  std::vector<float> v = tensor_to_f32(b.final_norm);
  v[0] += 1;
  Tensor t = tensor_from_f32(Device::cpu, DType::f32, v, {int64_t(v.size())});
  tensor_copy(b.final_norm, t);
  EXPECT_EQ(transfer_plan(a, 1 << 20).layout_hash, transfer_plan(b, 1 << 20).layout_hash);
  ModelConfig c = a.config;
  c.intermediate_size = 64;
  ModelWeights other = weights_allocate(c, Device::cpu, DType::f32);
  EXPECT_NE(transfer_plan(a, 1 << 20).layout_hash, transfer_plan(other, 1 << 20).layout_hash);
  // Tied embeddings: lm_head is the embedding's bytes, sent once.
  ModelConfig ct = a.config;
  ct.tie_word_embeddings = true;
  ModelWeights tied = weights_allocate(ct, Device::cpu, DType::f32);
  TransferPlan pt = transfer_plan(tied, 1 << 20);
  EXPECT_EQ(pt.total_bytes, weights_numel(ct) * 4);
  // LoRA adapters have a plan of their own kind.
  LoraConfig lc;
  lc.r = 4;
  LoraWeights l = lora_allocate(a.config, lc, Device::cpu, DType::f32);
  TransferPlan pl = transfer_plan(l, 1 << 20);
  EXPECT_EQ(pl.kind, BroadcastKind::adapter);
  EXPECT_EQ(pl.total_bytes, int64_t(l.arena.nbytes()));
  EXPECT_NE(pl.layout_hash, transfer_plan(a, 1 << 20).layout_hash);
}

TEST(WeightBroadcastFailure, ErrorModeStopsWithTheVersionAndBucket) {
  ModelWeights w = arith();
  Context ctx(ContextOptions{});
  FlakyComm comm(3);
  BroadcastOptions o;
  o.bucket_bytes = 64 << 10;
  WeightBroadcaster tx(comm, w.arena, transfer_plan(w, o.bucket_bytes), o);
  ASSERT_GE(tx.plan().buckets.size(), 3u);
  ASSERT_TRUE(tx.handshake().ok());
  const int n = int(tx.plan().buckets.size());
  // Version 1 fails at its third bucket.
  Status st = tx.publish(ctx, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("version 1, bucket 3/" + std::to_string(n)), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("peer rank 1 is gone"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("\"continue\""), std::string::npos) << st.message();
}

TEST(WeightBroadcastFailure, ContinueModeTakesTheBridgeDownAndTrainsOn) {
  ModelWeights w = arith();
  Context ctx(ContextOptions{});
  const int64_t bucket = 64 << 10;
  const int n = int(transfer_plan(w, bucket).buckets.size());
  FlakyComm comm(n + 2);  // version 1 goes through; version 2 fails at its second bucket
  BroadcastOptions o;
  o.bucket_bytes = bucket;
  o.on_failure = "continue";
  WeightBroadcaster tx(comm, w.arena, transfer_plan(w, bucket), o);
  ASSERT_TRUE(tx.publish(ctx, 1).ok());
  EXPECT_EQ(tx.stats().version, 1);
  EXPECT_FALSE(tx.stats().down);
  EXPECT_TRUE(tx.publish(ctx, 2).ok());
  EXPECT_TRUE(tx.stats().down);
  EXPECT_EQ(tx.stats().version, 1) << "a version that did not arrive whole is not counted";
  EXPECT_NE(tx.stats().last_error.find("version 2, bucket 2/"), std::string::npos) << tx.stats().last_error;
  const int calls = comm.n_bcast + comm.n_host;
  EXPECT_TRUE(tx.publish(ctx, 3).ok());
  EXPECT_TRUE(tx.finish().ok());
  EXPECT_EQ(comm.n_bcast + comm.n_host, calls) << "a bridge that is down makes no more calls";
}

TEST(WeightBroadcastFailure, BadOptionsAndWorlds) {
  BroadcastOptions o;
  o.on_failure = "retry";
  EXPECT_NE(o.validate().message().find("on_failure"), std::string::npos);
  o = {};
  o.bucket_bytes = 10;
  EXPECT_NE(o.validate().message().find("bucket_bytes"), std::string::npos);
  ModelWeights w = arith();
  auto local = communicator_local();
  Status st = broadcast_handshake(*local, transfer_plan(w, 1 << 20), BroadcastOptions{});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("at least one server rank"), std::string::npos) << st.message();
}

// ---- 2 MPI ranks: rank 0 trains (sends), rank 1 serves (receives) ----

namespace {

// What the trainer rank holds at `version`: the model plus the version on every weight.
float expected_at(float base, int64_t version) { return base + float(version); }

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

}  // namespace

TEST(WeightBroadcastMpiChild, Rank) {
  const char* mode = std::getenv("GRPO_BRIDGE_CHILD");
  if (!mode) GTEST_SKIP() << "runs as a rank of WeightBroadcastMpi.* under mpirun";
  int rank = 0, world = 0, local = 0;
  std::unique_ptr<Communicator> comm = communicator_mpi_create(&rank, &world, &local);
  ASSERT_EQ(world, 2);
  Context ctx(ContextOptions{});
  ModelWeights base = arith();
  BroadcastOptions o;
  o.bucket_bytes = 48 << 10;  // several buckets, some splitting a tensor
  if (rank == 0) {
    ModelWeights w = arith();
    WeightBroadcaster tx(*comm, w.arena, transfer_plan(w, o.bucket_bytes), o);
    Status hs = tx.handshake();
    if (std::string(mode) == "mismatch") {
      ASSERT_FALSE(hs.ok());
      EXPECT_NE(hs.message().find("different models"), std::string::npos) << hs.message();
      return;
    }
    ASSERT_TRUE(hs.ok()) << hs.message();
    const float* b = base.arena.ptr<float>();
    float* p = w.arena.ptr<float>();
    for (int64_t v = 1; v <= 3; ++v) {
      for (int64_t i = 0; i < w.arena.numel(); ++i) p[i] = expected_at(b[i], v);
      ASSERT_TRUE(tx.publish(ctx, v).ok());
    }
    ASSERT_TRUE(tx.finish().ok());
    std::printf("rank 0: sent 3 versions, %s\n", tx.plan().summary().c_str());
    return;
  }
  ModelConfig c = base.config;
  if (std::string(mode) == "mismatch") c.intermediate_size = 64;
  ModelWeights w = weights_allocate(c, Device::cpu, DType::f32);
  tensor_fill_zero(w.arena);
  WeightReceiver rx(*comm, w.arena, transfer_plan(w, o.bucket_bytes), o);
  Status hs = rx.handshake();
  if (std::string(mode) == "mismatch") {
    ASSERT_FALSE(hs.ok());
    EXPECT_NE(hs.message().find("different models"), std::string::npos) << hs.message();
    return;
  }
  ASSERT_TRUE(hs.ok()) << hs.message();
  std::vector<int64_t> versions;
  while (true) {
    auto v = rx.wait_header();
    ASSERT_TRUE(v.ok()) << v.status().message();
    if (v.value() == -1) break;
    ASSERT_TRUE(rx.receive(ctx).ok());
    versions.push_back(v.value());
    const float* b = base.arena.ptr<float>();
    const float* p = w.arena.ptr<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < w.arena.numel(); ++i) bad += p[i] != expected_at(b[i], v.value());
    EXPECT_EQ(bad, 0) << "version " << v.value();
    EXPECT_EQ(rx.stats().version, v.value());
  }
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 2, 3}));
  std::printf("rank 1: received versions 1..3 intact\n");
}

namespace {

int run_ranks(const std::string& mode, std::string* log) {
  const std::string out = (std::filesystem::temp_directory_path() / ("grpo_bcast_" + mode + std::to_string(::getpid()))).string();
  const std::string cmd = "GRPO_BRIDGE_CHILD=" + mode + " mpirun --allow-run-as-root --oversubscribe -np 2 -x GRPO_BRIDGE_CHILD " +
                          std::filesystem::read_symlink("/proc/self/exe").string() +
                          " --gtest_color=no --gtest_filter=WeightBroadcastMpiChild.Rank > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  *log = ss.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace

TEST(WeightBroadcastMpi, TwoRanksReceiveEveryVersionIntact) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (Debian: openmpi-bin)";
  std::string log;
  ASSERT_EQ(run_ranks("ok", &log), 0) << log;
  EXPECT_NE(log.find("rank 1: received versions 1..3 intact"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0: sent 3 versions"), std::string::npos) << log;
}

TEST(WeightBroadcastMpi, AServerOfAnotherModelIsRefusedOnBothRanks) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (Debian: openmpi-bin)";
  std::string log;
  ASSERT_EQ(run_ranks("mismatch", &log), 0) << log;
  EXPECT_EQ(log.find("[  FAILED  ]"), std::string::npos) << log;
  const std::string ok = "[       OK ] WeightBroadcastMpiChild.Rank";
  const size_t first = log.find(ok);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find(ok, first + 1), std::string::npos) << "both ranks must have run: " << log;
}
