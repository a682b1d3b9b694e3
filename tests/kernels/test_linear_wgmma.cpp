// The Hopper wgmma/TMA decode GEMM (kernels/cuda/linear_wgmma.cu) against the CPU
// linear_forward on the same bf16-rounded inputs (f32 reference), plus the properties a
// dispatch would rely on: a row's output does not depend on M or on the other rows, runs are
// bitwise repeatable, the tile width nt and the ring depth change no bit, the persistent tile
// loop (split = 1, more tiles than resident blocks) gives the same bits as one tile per block,
// CUDA-graph replay gives the same bits, and unsupported inputs are declined.
// Skipped without a CUDA device and on devices other than sm_90 (the kernel is sm_90a code).
//
// Error bound per element (see within_bound), as in test_cuda_linear_small_m.cpp: the kernel
// sums in f32 and rounds once to bf16 (unit roundoff u = 2^-8), so |got − ref| <= u·|ref| +
// (f32 summation error). The summation error of K products is far below 1e-4·Σ|x||w|, the
// slack allowed on top (Σ|x||w| comes from the CPU op on |x|, |w|). A lost or doubled 64-wide
// K chunk, a wrong swizzle or a misplaced fragment moves an output by ~8·σ(x)σ(w) or more,
// orders of magnitude above both terms. An f32 bias is added after a first rounding (as on
// the cuBLASLt path), which adds u·|x·w| to the bound.
#include "linear_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <cstring>

#include "kernels/cuda/linear_wgmma.h"
#include "kernels/linear.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

#define GRPO_SKIP_WITHOUT_WGMMA()                                                                      \
  do {                                                                                                 \
    GRPO_SKIP_WITHOUT_CUDA();                                                                          \
    if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "linear_wgmma needs an sm_90 device (H100/H200)"; \
  } while (0)

std::string cfg_name(const cuda::WgmmaGemmConfig& g) {
  return " nt=" + std::to_string(g.nt) + " split=" + std::to_string(g.split) + " stages=" + std::to_string(g.stages);
}

std::vector<float> run_wgmma(Problem& p, int64_t M, cuda::WgmmaGemmConfig cfg = {}) {
  Tensor o = p.out(M);
  Tensor x = p.xs(M);
  EXPECT_TRUE(cuda::linear_wgmma(gpu_ctx(), o, x, p.gw, p.bias(), p.c.accumulate, cfg))
      << "linear_wgmma declined " << case_name(p.c, M) << cfg_name(cfg);
  return fetch(o);
}

const Case kCases[] = {
    {1152, 896, Bias::bf16, false},    // Qwen2.5-0.5B qkv
    {896, 896, Bias::none, true},      // Qwen2.5-0.5B o, accumulating into the residual
    {9728, 896, Bias::none, false},    // Qwen2.5-0.5B gate_up
    {896, 4864, Bias::none, true},     // Qwen2.5-0.5B down
    {8232, 896, Bias::none, false},    // LM head with a reduced vocabulary (8192 + 40: a partial tile)
    {4096, 1024, Bias::none, false},   // Qwen3-0.6B qkv
    {1024, 2048, Bias::none, true},    // Qwen3-0.6B o
    {6144, 1024, Bias::none, false},   // Qwen3-0.6B gate_up
    {1024, 3072, Bias::none, true},    // Qwen3-0.6B down
    {1000, 904, Bias::f32, false},     // N not a multiple of any tile, K = 14 chunks + 8 columns, f32 bias
    {99, 72, Bias::bf16, true},        // N % 4 != 0 (scalar epilogue), N smaller than every tile
    {40, 64, Bias::none, false},       // N smaller than every tile (a clamped TMA box), K one chunk
};
const int64_t kMs[] = {1, 7, 16, 33, 64};

}  // namespace

// Every M of every case with the heuristic's configuration against the CPU reference; rows
// bitwise equal to the M = 64 run's first rows; a repeated run bitwise equal.
TEST(CudaLinearWgmma, MatchesCpuAndIsBatchInvariant) {
  GRPO_SKIP_WITHOUT_WGMMA();
  uint32_t seed = 500;
  for (const Case& c : kCases) {
    Problem p(c, seed += 10);
    const cuda::WgmmaGemmConfig h = cuda::wgmma_gemm_config(c.N, c.K);
    const std::vector<float> full = run_wgmma(p, 64);
    EXPECT_TRUE(bitwise_equal(run_wgmma(p, 64), full, full.size())) << "repeat differs: " << case_name(c, 64) << cfg_name(h);
    for (int64_t M : kMs) {
      const std::string name = case_name(c, M) + cfg_name(h);
      const std::vector<float> got = M == 64 ? full : run_wgmma(p, M);
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      EXPECT_TRUE(within_bound(name, got, ref, bound));
      EXPECT_TRUE(bitwise_equal(got, full, size_t(M * c.N))) << "rows depend on M: " << name;
    }
  }
}

// Every tile width × split (and the default, a shallow and a deep ring): correct; within one
// split neither nt nor the ring depth changes a bit. The heuristic's choices for the Qwen
// shapes are valid configurations.
TEST(CudaLinearWgmma, AllConfigurations) {
  GRPO_SKIP_WITHOUT_WGMMA();
  const Case cases[] = {{1152, 896, Bias::bf16, true}, {1000, 904, Bias::f32, false}, {100, 72, Bias::none, false}};
  uint32_t seed = 700;
  for (const Case& c : cases) {
    Problem p(c, seed += 10);
    for (int64_t M : {int64_t(5), int64_t(64)}) {
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      for (int split : {1, 2, 4, 8}) {
        std::vector<float> first;
        for (int nt : {64, 128, 256}) {
          const int deep = nt == 64 ? 12 : nt == 128 ? 8 : 5;
          for (int stages : {0, 2, deep}) {
            const cuda::WgmmaGemmConfig g{nt, split, stages};
            const std::string name = case_name(c, M) + cfg_name(g);
            const std::vector<float> got = run_wgmma(p, M, g);
            EXPECT_TRUE(within_bound(name, got, ref, bound));
            if (first.empty()) first = got;
            else EXPECT_TRUE(bitwise_equal(got, first, got.size())) << "nt or stages changed bits: " << name;
          }
        }
      }
    }
  }
  const int64_t shapes[][2] = {{1152, 896}, {896, 896},   {9728, 896}, {896, 4864},  {151936, 896},
                               {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
  for (const auto& s : shapes) {
    const cuda::WgmmaGemmConfig h = cuda::wgmma_gemm_config(s[0], s[1]);
    EXPECT_TRUE(h.nt == 64 || h.nt == 128 || h.nt == 256) << "N=" << s[0] << " K=" << s[1] << cfg_name(h);
    EXPECT_TRUE(h.split == 1 || h.split == 2 || h.split == 4 || h.split == 8) << "N=" << s[0] << cfg_name(h);
    EXPECT_TRUE(h.stages >= 2 && h.stages <= 16) << "N=" << s[0] << cfg_name(h);
  }
}

// split = 1 with more tiles than resident blocks: each block walks several tiles with one TMA
// ring (a deep ring leaves one block per SM). Same bits as a shallow ring (many resident blocks,
// one tile each where they fit), correct against the CPU, and independent of M.
TEST(CudaLinearWgmma, PersistentTileLoop) {
  GRPO_SKIP_WITHOUT_WGMMA();
  // 626 tiles of 64 (157 of 256), 8 chunks each: with one block per SM every block walks several
  // tiles and its ring (12, 8 or 5 stages) refills across tile boundaries.
  const Case c{40008, 512, Bias::bf16, true};
  Problem p(c, 900);
  for (int64_t M : {int64_t(3), int64_t(64)}) {
    std::vector<float> ref, bound;
    p.reference(M, ref, bound);
    std::vector<float> first;
    for (const cuda::WgmmaGemmConfig g : {cuda::WgmmaGemmConfig{64, 1, 2}, cuda::WgmmaGemmConfig{64, 1, 12},
                                          cuda::WgmmaGemmConfig{128, 1, 8}, cuda::WgmmaGemmConfig{256, 1, 5},
                                          cuda::WgmmaGemmConfig{}}) {
      const std::string name = case_name(c, M) + cfg_name(g);
      const std::vector<float> got = run_wgmma(p, M, g);
      EXPECT_TRUE(within_bound(name, got, ref, bound));
      if (first.empty()) first = got;
      else if (g.nt != 0 || cuda::wgmma_gemm_config(c.N, c.K).split == 1)
        EXPECT_TRUE(bitwise_equal(got, first, got.size())) << "tile walk changed bits: " << name;
    }
  }
}

// The launches can be captured into a CUDA graph (a cluster launch and a persistent one) and
// replay to the same bits as direct calls.
TEST(CudaLinearWgmma, GraphReplay) {
  GRPO_SKIP_WITHOUT_WGMMA();
  Problem p({1152, 896, Bias::bf16, false}, 950);
  Problem q({40008, 128, Bias::none, true}, 960);
  const cuda::WgmmaGemmConfig cluster_cfg{64, 4, 0}, persistent_cfg{64, 1, 12};
  const std::vector<float> direct_p = run_wgmma(p, 64, cluster_cfg);
  const std::vector<float> direct_q = run_wgmma(q, 64, persistent_cfg);
  Tensor op = p.out(64), oq = q.out(64);
  Tensor xp = p.xs(64), xq = q.xs(64);
  auto st = static_cast<cudaStream_t>(gpu_ctx().stream());
  gpu_ctx().synchronize();
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const bool used_p = cuda::linear_wgmma(gpu_ctx(), op, xp, p.gw, p.bias(), false, cluster_cfg);
  // The accumulating launch reads oq: replaying twice would add twice, so it is captured once
  // and replayed once, on a fresh copy of the old values.
  const bool used_q = cuda::linear_wgmma(gpu_ctx(), oq, xq, q.gw, q.bias(), true, persistent_cfg);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(used_p);
  ASSERT_TRUE(used_q);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  EXPECT_TRUE(bitwise_equal(fetch(op), direct_p, direct_p.size()));
  EXPECT_TRUE(bitwise_equal(fetch(oq), direct_q, direct_q.size()));
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);  // op again (overwritten, same bits)
  EXPECT_TRUE(bitwise_equal(fetch(op), direct_p, direct_p.size()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Where the kernel does not apply it declines and leaves the output alone.
// linear_wgmma_rows (the bitwise mode's GEMM for every M) gives each row the bits that
// linear_wgmma gives it in a decode-sized call, whatever M and slice the row comes in, and is
// within the bf16 bound of the CPU reference; linear_wgmma_f32 holds the same sums scaled by
// alpha in f32 (within f32 rounding of the reference) and is M-invariant too.
TEST(CudaLinearWgmma, RowsAndF32AreBatchInvariant) {
  GRPO_SKIP_WITHOUT_WGMMA();
  // Four full 64-row slices and a partial one; two full 128-row slices and a partial one whose
  // second warpgroup has no rows.
  const int64_t kM = 300;
  uint32_t seed = 900;
  for (const Case& c : kCases) {
    seed += 10;
    const std::vector<float> x = rounded(randn(size_t(kM * c.K), seed), DType::bf16);
    const std::vector<float> w = rounded(randn(size_t(c.N * c.K), seed + 1, 0.05f), DType::bf16);
    const std::vector<float> b = rounded(randn(size_t(c.N), seed + 2), DType::bf16);
    const std::vector<float> old = rounded(randn(size_t(kM * c.N), seed + 3), DType::bf16);
    Tensor gx = dev(x, DType::bf16, {kM, c.K}), gw = dev(w, DType::bf16, {c.N, c.K});
    Tensor gb;
    if (c.bias != Bias::none) gb = dev(b, c.bias == Bias::f32 ? DType::f32 : DType::bf16, {c.N});
    const Tensor* bias = c.bias == Bias::none ? nullptr : &gb;
    auto out_for = [&](int64_t r0, int64_t r1) {
      if (!c.accumulate) return poisoned(DType::bf16, {r1 - r0, c.N});
      return dev(std::vector<float>(old.begin() + r0 * c.N, old.begin() + r1 * c.N), DType::bf16, {r1 - r0, c.N});
    };
    // One warpgroup per 64-row slice, and two per 128-row slice (the default from 256 rows;
    // with nt 64 and 256, which a split > 1 turns back into one warpgroup).
    for (const cuda::WgmmaGemmConfig g : {cuda::WgmmaGemmConfig{0, 0, 0, 1}, cuda::WgmmaGemmConfig{},
                                          cuda::WgmmaGemmConfig{64, 0, 0, 2}, cuda::WgmmaGemmConfig{256, 0, 0, 2}}) {
      const std::string name = case_name(c, kM) + cfg_name(g) + " wg=" + std::to_string(g.wg);
      Tensor all = out_for(0, kM);
      ASSERT_TRUE(cuda::linear_wgmma_rows(gpu_ctx(), all, gx, gw, bias, c.accumulate, g)) << name;
      const std::vector<float> got = fetch(all);
      // Against decode-sized calls of row ranges that straddle the 64- and 128-row slices.
      for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 1}, {5, 12}, {60, 70}, {120, 136}, {130, 194}, {250, 300}}) {
        Tensor o = out_for(r0, r1);
        ASSERT_TRUE(cuda::linear_wgmma(gpu_ctx(), o, gx.slice0(r0, r1), gw, bias, c.accumulate));
        const std::vector<float> part = fetch(o);
        EXPECT_TRUE(bitwise_equal(part, std::vector<float>(got.begin() + r0 * c.N, got.begin() + r1 * c.N), part.size()))
            << "rows " << r0 << ".." << r1 << " differ from linear_wgmma: " << name;
      }
    }
    if (c.bias != Bias::none || c.accumulate) continue;
    // f32 output, alpha = 1/0.7 (a sampling temperature), against the CPU reference and M-invariant.
    const float alpha = 1.f / 0.7f;
    Tensor f_all = poisoned(DType::f32, {kM, c.N});
    ASSERT_TRUE(cuda::linear_wgmma_f32(gpu_ctx(), f_all, gx, gw, alpha)) << case_name(c, kM);
    const std::vector<float> fa = fetch(f_all);
    Tensor f_part = poisoned(DType::f32, {33, c.N});
    ASSERT_TRUE(cuda::linear_wgmma_f32(gpu_ctx(), f_part, gx.slice0(100, 133), gw, alpha));
    const std::vector<float> fp = fetch(f_part);
    EXPECT_TRUE(bitwise_equal(fp, std::vector<float>(fa.begin() + 100 * c.N, fa.begin() + 133 * c.N), fp.size()))
        << "f32 rows 100..133 depend on the batch: " << case_name(c, kM);
    std::vector<float> xm = x, pre(size_t(kM * c.N)), ax = absv(x), aw = absv(w), mag(size_t(kM * c.N));
    std::vector<float> wm = w;
    Tensor hx = host(xm, {kM, c.K}), hw = host(wm, {c.N, c.K}), hp = host(pre, {kM, c.N});
    Tensor hax = host(ax, {kM, c.K}), haw = host(aw, {c.N, c.K}), hm = host(mag, {kM, c.N});
    cpu::linear_forward(cpu_ctx(), hp, hx, hw, nullptr, false);
    cpu::linear_forward(cpu_ctx(), hm, hax, haw, nullptr, false);
    std::vector<float> ref(pre.size()), bound(pre.size());
    for (size_t i = 0; i < pre.size(); ++i) {
      ref[i] = alpha * pre[i];
      bound[i] = float(alpha * (1e-4 * mag[i]) + 1e-6 * std::fabs(ref[i]));
    }
    EXPECT_TRUE(within_bound("f32 " + case_name(c, kM), fa, ref, bound));
  }
}

TEST(CudaLinearWgmma, DeclinesUnsupported) {
  GRPO_SKIP_WITHOUT_WGMMA();
  const int64_t N = 40;
  {  // M = 65 rows
    const int64_t M = 65, K = 64;
    Tensor x = dev(rounded(randn(size_t(M * K), 1), DType::bf16), DType::bf16, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 2), DType::bf16), DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_wgmma(gpu_ctx(), o, x, w, nullptr, false));
  }
  {  // f32 operands
    const int64_t M = 4, K = 64;
    Tensor x = dev(randn(size_t(M * K), 3), DType::f32, {M, K}), w = dev(randn(size_t(N * K), 4), DType::f32, {N, K});
    Tensor o = poisoned(DType::f32, {M, N});
    EXPECT_FALSE(cuda::linear_wgmma(gpu_ctx(), o, x, w, nullptr, false));
  }
  for (const int64_t K : {int64_t(70), int64_t(40)}) {  // K % 8 != 0; K below one 64-wide chunk
    const int64_t M = 5;
    Tensor x = dev(rounded(randn(size_t(M * K), 5), DType::bf16), DType::bf16, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 6), DType::bf16), DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_wgmma(gpu_ctx(), o, x, w, nullptr, false)) << "K=" << K;
  }
  {  // x not 16-byte aligned (a view starting one element into a buffer)
    const int64_t M = 4, K = 64;
    Tensor buf = dev(rounded(randn(size_t(M * K + 8), 7), DType::bf16), DType::bf16, {M * K + 8});
    Tensor x = tensor_borrow(static_cast<char*>(buf.data) + 2, DType::bf16, Device::cuda, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 8), DType::bf16), DType::bf16, {N, K});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_wgmma(gpu_ctx(), o, x, w, nullptr, false));
  }
  {  // a bias of the wrong length
    const int64_t M = 4, K = 64;
    Tensor x = dev(rounded(randn(size_t(M * K), 9), DType::bf16), DType::bf16, {M, K});
    Tensor w = dev(rounded(randn(size_t(N * K), 10), DType::bf16), DType::bf16, {N, K});
    Tensor b = dev(rounded(randn(size_t(N + 8), 11), DType::bf16), DType::bf16, {N + 8});
    Tensor o = poisoned(DType::bf16, {M, N});
    EXPECT_FALSE(cuda::linear_wgmma(gpu_ctx(), o, x, w, &b, false));
    const std::vector<float> after = fetch(o);
    for (float v : after) ASSERT_TRUE(std::isnan(v)) << "a declined call wrote the output";
  }
}

#else
TEST(CudaLinearWgmma, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
