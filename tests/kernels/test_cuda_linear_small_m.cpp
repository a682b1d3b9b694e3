// The decode-sized bf16 GEMM (kernels/cuda/linear_small_m.cu) against the CPU
// linear_forward on the same bf16-rounded inputs (f32 reference), plus the properties the
// engine relies on: a row's output does not depend on M or on the other rows, runs are
// bitwise repeatable, the tile width NT changes no bit, CUDA-graph replay gives the same
// bits, and linear_forward uses the kernel (bitwise) where it applies and falls back to
// cuBLASLt where it does not.
//
// Error bound per element (see within_bound): the kernel sums in f32 and rounds once to
// bf16 (unit roundoff u = 2^-8), so |got − ref| <= u·|ref| + (f32 summation error). The
// summation error of K products is far below 1e-4·Σ|x||w|, which is the slack allowed on
// top (Σ|x||w| comes from the CPU op on |x|, |w|). A lost or doubled 64-wide K chunk moves
// an output by ~8·σ(x)σ(w), orders of magnitude above both terms. An f32 bias is added
// after a first rounding (as on the cuBLASLt path), which adds u·|x·w| to the bound.
#include "linear_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <cstring>

#include "kernels/cuda/linear_small_m.h"
#include "kernels/linear.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

std::vector<float> run_small_m(Problem& p, int64_t M, cuda::SmallMConfig cfg = {}) {
  Tensor o = p.out(M);
  Tensor x = p.xs(M);
  EXPECT_TRUE(cuda::linear_small_m(gpu_ctx(), o, x, p.gw, p.bias(), p.c.accumulate, cfg))
      << "linear_small_m declined " << case_name(p.c, M);
  return fetch(o);
}

const Case kCases[] = {
    {1152, 896, Bias::bf16, false},  // Qwen2.5-0.5B qkv (split 8)
    {896, 4864, Bias::none, true},   // Qwen2.5-0.5B down, accumulating into the residual
    {100, 72, Bias::bf16, true},     // N not a multiple of the tile, K one full + one partial chunk
    {99, 72, Bias::f32, false},      // N % 4 != 0 (scalar epilogue), f32 bias
    {9728, 896, Bias::none, false},  // Qwen2.5-0.5B gate_up
};
const int64_t kMs[] = {1, 5, 16, 33, 64};

// Turns the linear_forward dispatch on for one test and restores the previous setting
// (GRPO_SMALL_M_GEMM=0 runs of the other tests stay on cuBLASLt).
struct EnableSmallM {
  bool prev = cuda::small_m_gemm_enabled();
  EnableSmallM() { cuda::set_small_m_gemm_enabled(true); }
  ~EnableSmallM() { cuda::set_small_m_gemm_enabled(prev); }
};

}  // namespace

// Every M of every case against the CPU reference; rows bitwise equal to the M = 64 run's
// first rows; linear_forward bitwise equal to linear_small_m where it dispatches to it; a
// repeated run bitwise equal.
TEST(CudaLinearSmallM, MatchesCpuAndIsBatchInvariant) {
  GRPO_SKIP_WITHOUT_CUDA();
  EnableSmallM on;
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    Problem p(c, seed += 10);
    const std::vector<float> full = run_small_m(p, 64);
    EXPECT_TRUE(bitwise_equal(run_small_m(p, 64), full, full.size())) << "repeat differs: " << case_name(c, 64);
    for (int64_t M : kMs) {
      const std::string name = case_name(c, M);
      const std::vector<float> got = M == 64 ? full : run_small_m(p, M);
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      EXPECT_TRUE(within_bound(name, got, ref, bound));
      EXPECT_TRUE(bitwise_equal(got, full, size_t(M * c.N))) << "rows depend on M: " << name;
      if (!cuda::small_m_preferred(M, c.N)) continue;  // linear_forward uses cuBLASLt there
      Tensor o = p.out(M);
      Tensor x = p.xs(M);
      cuda::linear_forward(gpu_ctx(), o, x, p.gw, p.bias(), c.accumulate);
      EXPECT_TRUE(bitwise_equal(fetch(o), got, got.size())) << "linear_forward did not use the kernel: " << name;
    }
  }
}

// Every tile width and split: correct; the tile width changes no bit.
TEST(CudaLinearSmallM, AllConfigurations) {
  GRPO_SKIP_WITHOUT_CUDA();
  const Case cases[] = {{1152, 896, Bias::bf16, true}, {100, 72, Bias::none, false}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    Problem p(c, seed += 10);
    for (int64_t M : {int64_t(5), int64_t(64)}) {
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      for (int split : {1, 2, 4, 8}) {
        std::vector<float> first;
        for (int nt : {64, 128}) {
          const std::string name = case_name(c, M) + " nt=" + std::to_string(nt) + " split=" + std::to_string(split);
          const std::vector<float> got = run_small_m(p, M, cuda::SmallMConfig{nt, split});
          EXPECT_TRUE(within_bound(name, got, ref, bound));
          if (first.empty()) first = got;
          else EXPECT_TRUE(bitwise_equal(got, first, got.size())) << "nt changed bits: " << name;
        }
      }
    }
  }
}

// The launch can be captured into a CUDA graph (cluster launch included) and replays to
// the same bits as a direct call.
TEST(CudaLinearSmallM, GraphReplay) {
  GRPO_SKIP_WITHOUT_CUDA();
  Problem p({1152, 896, Bias::bf16, false}, 400);
  const std::vector<float> direct = run_small_m(p, 64);
  ASSERT_GT(cuda::small_m_config(1152, 896).split, 1) << "expected a cluster launch for this shape";
  Tensor o = p.out(64);
  Tensor x = p.xs(64);
  auto st = static_cast<cudaStream_t>(gpu_ctx().stream());
  gpu_ctx().synchronize();
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const bool used = cuda::linear_small_m(gpu_ctx(), o, x, p.gw, p.bias(), false);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(used);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  EXPECT_TRUE(bitwise_equal(fetch(o), direct, direct.size()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Where the kernel does not apply it declines, and linear_forward still computes the
// product (through cuBLASLt).
TEST(CudaLinearSmallM, DeclinesUnsupported) {
  GRPO_SKIP_WITHOUT_CUDA();
  EnableSmallM on;
  const int64_t N = 40;
  {  // M = 65 rows
    const int64_t M = 65, K = 64;
    Tensor x = dev(rounded(randn(size_t(M * K), 1), DType::bf16), DType::bf16, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 2), DType::bf16), DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_small_m(gpu_ctx(), o, x, w, nullptr, false));
  }
  {  // f32 operands
    const int64_t M = 4, K = 64;
    Tensor x = dev(randn(size_t(M * K), 3), DType::f32, {M, K}), w = dev(randn(size_t(N * K), 4), DType::f32, {N, K});
    Tensor o = poisoned(DType::f32, {M, N});
    EXPECT_FALSE(cuda::linear_small_m(gpu_ctx(), o, x, w, nullptr, false));
  }
  {  // K % 8 != 0, then through linear_forward against the CPU
    const int64_t M = 5, K = 70;
    auto xv = rounded(randn(size_t(M * K), 5), DType::bf16), wv = rounded(randn(size_t(N * K), 6, 0.1f), DType::bf16);
    Tensor x = dev(xv, DType::bf16, {M, K}), w = dev(wv, DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_small_m(gpu_ctx(), o, x, w, nullptr, false));
    std::vector<float> ref(size_t(M * N));
    Tensor hx = host(xv, {M, K}), hw = host(wv, {N, K}), hr = host(ref, {M, N});
    cpu::linear_forward(cpu_ctx(), hr, hx, hw, nullptr, false);
    cuda::linear_forward(gpu_ctx(), o, x, w, nullptr, false);
    EXPECT_TRUE(close("linear_forward K=70 (cuBLASLt fallback)", fetch(o), ref, Tol{2e-2, 1e-2}));
  }
  {  // x not 16-byte aligned (a view starting one element into a buffer)
    const int64_t M = 4, K = 64;
    Tensor buf = dev(rounded(randn(size_t(M * K + 8), 7), DType::bf16), DType::bf16, {M * K + 8});
    Tensor x = tensor_borrow(static_cast<char*>(buf.data) + 2, DType::bf16, Device::cuda, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 8), DType::bf16), DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_small_m(gpu_ctx(), o, x, w, nullptr, false));
  }
}

#else
TEST(CudaLinearSmallM, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
