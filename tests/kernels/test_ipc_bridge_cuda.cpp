// The CUDA IPC bridge between two processes on one GPU (dist/ipc_bridge.h): this
// binary exports a bf16 weight arena and re-runs itself as the attaching process
// (a CUDA context cannot open its own handle), which must see the exporter's
// bytes without a copy, its model config and each version it publishes.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "dist/ipc_bridge.h"
#include "model/checkpoint.h"

using namespace grpo;
namespace fs = std::filesystem;

namespace {

// The value weight i holds at `version` (exact in bf16: small integers / 8).
float pattern(int64_t i, int64_t version) { return float((i * 7 + version * 3) % 64 - 32) / 8.f; }

ModelConfig tiny_config() {
  auto c = model_config_load(std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny/config.json");
  GRPO_CHECK_MSG(c.ok(), c.status().message().c_str());
  return c.value();
}

int attach_child(const std::string& dir, int64_t version) {
  const std::string cmd = "GRPO_IPC_CHILD=" + dir + " GRPO_IPC_VERSION=" + std::to_string(version) + " " +
                          fs::read_symlink("/proc/self/exe").string() +
                          " --gtest_color=no --gtest_filter=IpcBridgeCudaChild.Attach > " + dir + "/child.log 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace

TEST(IpcBridgeCudaChild, Attach) {
  const char* dir = std::getenv("GRPO_IPC_CHILD");
  if (!dir) GTEST_SKIP() << "runs as the attaching process of IpcBridgeCuda.*";
  const int64_t want = std::atoll(std::getenv("GRPO_IPC_VERSION"));
  auto a = IpcAttachment::open(dir);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a.value()->version(), want);
  ModelWeights& w = a.value()->weights();
  EXPECT_EQ(w.config.hidden_size, tiny_config().hidden_size);
  EXPECT_EQ(w.dtype, DType::bf16);
  std::vector<float> got = tensor_to_f32(w.arena);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < int64_t(got.size()); ++i)
    if (got[size_t(i)] != pattern(i, want) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << "first differing element " << first;
  // The view is the trainer's memory: a write here is seen by the exporter.
  Tensor one = tensor_from_f32(Device::cuda, DType::bf16, {99.f}, {1});
  Tensor dst = w.arena.slice0(0, 1);
  tensor_copy(dst, one);
}

TEST(IpcBridgeCuda, AnotherProcessServesTheExportedArenaInPlace) {
  GRPO_SKIP_WITHOUT_CUDA();
  const std::string dir = (fs::temp_directory_path() / ("grpo_ipc_cuda_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  ModelWeights w = weights_allocate(tiny_config(), Device::cuda, DType::bf16);
  auto fill = [&](int64_t v) {
    std::vector<float> h(size_t(w.arena.numel()));
    for (int64_t i = 0; i < int64_t(h.size()); ++i) h[size_t(i)] = pattern(i, v);
    Tensor t = tensor_from_f32(Device::cuda, DType::bf16, h, {int64_t(h.size())});
    tensor_copy(w.arena, t);
  };
  fill(1);
  auto x = IpcExporter::create(dir, w, std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny", 1);
  ASSERT_TRUE(x.ok()) << x.status().message();
  ASSERT_EQ(attach_child(dir, 1), 0) << "see " << dir << "/child.log";
  EXPECT_EQ(tensor_to_f32(w.arena.slice0(0, 1))[0], 99.f) << "the child wrote through its mapping";
  fill(2);
  x.value()->publish(2);
  ASSERT_EQ(attach_child(dir, 2), 0) << "see " << dir << "/child.log";
  x.value().reset();
  EXPECT_FALSE(fs::exists(fs::path(dir) / kIpcChannelFile)) << "the exporter removes its channel on exit";
  auto gone = IpcAttachment::open(dir);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("bridge = \"ipc\""), std::string::npos) << gone.status().message();
}

#else
TEST(IpcBridgeCuda, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
