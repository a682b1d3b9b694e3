// StreamScope (core/context.h): inside a scope, device allocations, frees, copies and
// fills are ordered on the scope's stream and never wait for another stream. The
// other stream is held by a host callback that blocks until the test releases it, so
// a whole-device synchronisation would hang until the release (the test then fails on
// the elapsed time instead of hanging for good).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/context.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace grpo;

namespace {

#ifdef GRPO_HAVE_CUDA
std::atomic<bool> g_release{false};

void CUDART_CB block_until_released(void*) {
  while (!g_release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
#endif

}  // namespace

TEST(StreamScope, CpuContextSetsNoStream) {
  Context cpu;
  StreamScope s(cpu);
  EXPECT_EQ(tensor_thread_stream(), nullptr);
  Tensor t = tensor_zeros(Device::cpu, DType::f32, {4});
  EXPECT_EQ(tensor_to_f32(t), std::vector<float>(4, 0.f));
}

#ifdef GRPO_HAVE_CUDA
TEST(StreamScope, CopiesFillsAndFreesDoNotWaitForOtherStreams) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ContextOptions o;
  o.device = Device::cuda;
  o.workspace_bytes = 1 << 20;
  Context busy(o), mine(o);
  // A tensor from before the scope (plain cudaMalloc) and the busy stream held.
  Tensor outside = tensor_empty(Device::cuda, DType::f32, {1024});
  g_release = false;
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(busy.stream()), block_until_released, nullptr), cudaSuccess);
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    g_release = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  {
    StreamScope scope(mine);
    ASSERT_NE(tensor_thread_stream(), nullptr);
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 3.f;
    Tensor a = tensor_from_f32(Device::cuda, DType::f32, v, {1000});  // stream-ordered alloc + copy
    EXPECT_EQ(tensor_to_f32(a), v);
    Tensor z = tensor_zeros(Device::cuda, DType::f32, {257});
    EXPECT_EQ(tensor_to_f32(z), std::vector<float>(257, 0.f));
    Tensor b = tensor_empty(Device::cuda, DType::f32, {1000});
    tensor_copy(b, a);  // device to device
    EXPECT_EQ(tensor_to_f32(b), v);
    for (int i = 0; i < 50; ++i) Tensor scratch = tensor_empty(Device::cuda, DType::bf16, {4096, 64});  // freed at once
    elapsed = seconds_since(t0);
  }
  EXPECT_LT(elapsed, 2.0) << "a copy, fill or free inside the scope waited for the other stream";
  releaser.join();
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(busy.stream())), cudaSuccess);
  EXPECT_EQ(tensor_thread_stream(), nullptr);  // the scope restored the thread's previous stream
}

TEST(StreamScope, TensorsKeepTheirStreamAliveAfterTheContext) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ContextOptions o;
  o.device = Device::cuda;
  o.workspace_bytes = 1 << 20;
  o.high_priority = true;
  Tensor kept;
  {
    Context ctx(o);
    StreamScope scope(ctx);
    kept = tensor_from_f32(Device::cuda, DType::f32, {1.f, 2.f, 3.f}, {3});
  }
  // The context and its scope are gone; the tensor still reads back and frees on its stream.
  EXPECT_EQ(tensor_to_f32(kept), (std::vector<float>{1.f, 2.f, 3.f}));
  kept = Tensor();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
#endif
