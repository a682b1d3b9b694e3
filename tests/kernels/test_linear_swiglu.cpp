// The gate/up projection with SwiGLU fused into the Hopper wgmma GEMM (linear_wgmma_swiglu in
// kernels/cuda/linear_wgmma.cu) and its dispatcher linear_swiglu_forward (kernels/linear.h):
//   act (M,F) = silu(g)·u,  [g | u] = x (M,K) · w_gate_up (2F,K)ᵀ.
// Checked against
//   - the CPU reference: cpu::linear_forward and cpu::swiglu_forward in f32 on the same
//     bf16-rounded inputs, within the error bound derived below;
//   - the unfused CUDA path, bit for bit: linear_wgmma (same split) then swiglu_forward. The
//     fused kernel must reproduce it exactly, for every tile width, split and ring depth;
// plus: rows do not depend on M, a persistent tile walk and CUDA-graph replay give the same
// bits, and the dispatcher fuses exactly where linear_forward would use linear_wgmma and falls
// back to linear_forward + swiglu_forward elsewhere (M > 64, F % 32 != 0, the small-M kernel's
// range, the switch off, CPU tensors). GPU tests skip without an sm_90 device.
//
// Error bound per element (within_bound). The kernel sums g and u in f32 (error below
// 1e-4·S, S = Σ|x||w| of that column, as in linear_test_util.h) and rounds each to bf16
// (u = 2^-8), so |ĝ − g| <= eg = u·|g| + 1e-4·Sg and |û − up| <= eu likewise. silu'(t) =
// σ(t)(1 + t(1 − σ(t))) lies in [-0.1, 1.1], so |silu(ĝ) − silu(g)| <= 1.1·eg and
//   |silu(ĝ)·û − silu(g)·up| <= 1.1·eg·(|up| + eu) + |silu(g)|·eu;
// the f32 evaluation of silu(ĝ)·û adds a few ulps (< 1e-6 relative) and the final rounding
// u·|act|. A lost K chunk, a wrong swizzle, or a gate/up column swapped or misplaced moves g or
// up by ~σ(g) ≈ 1.5 here, two orders of magnitude above the bound.
#include "linear_test_util.h"

#include <cstring>

#include "kernels/elementwise.h"
#include "kernels/linear.h"

using namespace grpo;
using namespace grpo::cudatest;

// The CPU fallback of the dispatcher (no GPU needed): exactly linear_forward then
// swiglu_forward, gate_up left holding the pre-activations, and close to a direct double
// evaluation of silu(x·w_gᵀ)·(x·w_uᵀ) (f32 sums of K = 24 products: relative error ~1e-6).
TEST(LinearSwigluCpu, FallbackIsLinearThenSwiglu) {
  const int64_t M = 5, K = 24, F = 12;
  std::vector<float> x = randn(size_t(M * K), 31), w = randn(size_t(2 * F * K), 32, 0.3f);
  std::vector<float> act(size_t(M * F)), gu(size_t(M * 2 * F)), act2(size_t(M * F)), gu2(size_t(M * 2 * F));
  Tensor hx = host(x, {M, K}), hw = host(w, {2 * F, K}), ha = host(act, {M, F}), hg = host(gu, {M, 2 * F});
  Tensor ha2 = host(act2, {M, F}), hg2 = host(gu2, {M, 2 * F});
  linear_swiglu_forward(cpu_ctx(), ha, hg, hx, hw);
  linear_forward(cpu_ctx(), hg2, hx, hw, nullptr, false);
  swiglu_forward(cpu_ctx(), ha2, hg2);
  EXPECT_EQ(std::memcmp(act.data(), act2.data(), act.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(gu.data(), gu2.data(), gu.size() * sizeof(float)), 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < F; ++n) {
      double g = 0, up = 0;
      for (int64_t k = 0; k < K; ++k) {
        g += double(x[size_t(m * K + k)]) * w[size_t(n * K + k)];
        up += double(x[size_t(m * K + k)]) * w[size_t((F + n) * K + k)];
      }
      const double r = g / (1.0 + std::exp(-g)) * up;
      EXPECT_NEAR(act[size_t(m * F + n)], r, 1e-5 + 1e-5 * std::fabs(r)) << "m=" << m << " n=" << n;
    }
}

#ifdef GRPO_HAVE_CUDA
#include "kernels/cuda/linear_small_m.h"
#include "kernels/cuda/linear_wgmma.h"

namespace {

#define GRPO_SKIP_WITHOUT_WGMMA()                                                                           \
  do {                                                                                                      \
    GRPO_SKIP_WITHOUT_CUDA();                                                                               \
    if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "linear_wgmma_swiglu needs an sm_90 device (H100/H200)"; \
  } while (0)

std::string cfg_name(const cuda::WgmmaGemmConfig& g) {
  return " nt=" + std::to_string(g.nt) + " split=" + std::to_string(g.split) + " stages=" + std::to_string(g.stages);
}

// silu(g)·up in double and the bound above, for the first M rows; pre (M, 2F) and mag (M, 2F):
// the CPU linear_forward of x·wᵀ and of |x|·|w|ᵀ.
void swiglu_bound(int64_t M, int64_t F, const std::vector<float>& pre, const std::vector<float>& mag,
                  const std::vector<float>& ref, std::vector<float>& bound) {
  const double u = 1.0 / 256;
  bound.resize(size_t(M * F));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < F; ++n) {
      const double g = pre[size_t(m * 2 * F + n)], up = pre[size_t(m * 2 * F + F + n)];
      const double sg = mag[size_t(m * 2 * F + n)], su = mag[size_t(m * 2 * F + F + n)];
      const double eg = 1.01 * (u * std::fabs(g) + 1e-4 * sg), eu = 1.01 * (u * std::fabs(up) + 1e-4 * su);
      const double silu = g / (1.0 + std::exp(-g));
      const double act = std::fabs(double(ref[size_t(m * F + n)]));
      const double d = 1.1 * eg * (std::fabs(up) + eu) + std::fabs(silu) * eu;
      bound[size_t(m * F + n)] = float(1.01 * (d + u * (act + d)) + 1e-6 * act + 1e-30);
    }
}


struct GatedCase {
  int64_t K, F;
};
std::string case_name(const GatedCase& c, int64_t M) {
  return "M=" + std::to_string(M) + " K=" + std::to_string(c.K) + " F=" + std::to_string(c.F);
}

// bf16 inputs for up to `rows` rows (smaller M use a prefix) and the CPU reference.
struct GatedProblem {
  GatedCase c;
  int64_t rows;
  std::vector<float> x, w;  // bf16-rounded values
  Tensor gx, gw;

  GatedProblem(const GatedCase& cs, uint32_t seed, int64_t rows_ = 64) : c(cs), rows(rows_) {
    x = rounded(randn(size_t(rows * c.K), seed), DType::bf16);
    w = rounded(randn(size_t(2 * c.F * c.K), seed + 1, 0.05f), DType::bf16);
    gx = dev(x, DType::bf16, {rows, c.K});
    gw = dev(w, DType::bf16, {2 * c.F, c.K});
  }
  Tensor xs(int64_t M) const { return gx.slice0(0, M); }

  void reference(int64_t M, std::vector<float>& ref, std::vector<float>& bound) {
    std::vector<float> xm(x.begin(), x.begin() + M * c.K), pre(size_t(M * 2 * c.F)), mag(size_t(M * 2 * c.F));
    std::vector<float> ax = absv(xm), aw = absv(w);
    ref.assign(size_t(M * c.F), 0.f);
    Tensor hx = host(xm, {M, c.K}), hw = host(w, {2 * c.F, c.K}), hp = host(pre, {M, 2 * c.F});
    Tensor hax = host(ax, {M, c.K}), haw = host(aw, {2 * c.F, c.K}), hm = host(mag, {M, 2 * c.F});
    Tensor hr = host(ref, {M, c.F});
    cpu::linear_forward(cpu_ctx(), hp, hx, hw, nullptr, false);
    cpu::linear_forward(cpu_ctx(), hm, hax, haw, nullptr, false);
    cpu::swiglu_forward(cpu_ctx(), hr, hp);
    swiglu_bound(M, c.F, pre, mag, ref, bound);
  }
};

// The fused kernel (act poisoned first); `ok` receives whether it ran.
std::vector<float> run_fused(GatedProblem& p, int64_t M, cuda::WgmmaGemmConfig cfg = {}, bool* ok = nullptr) {
  Tensor act = poisoned(DType::bf16, {M, p.c.F});
  Tensor x = p.xs(M);
  const bool ran = cuda::linear_wgmma_swiglu(gpu_ctx(), act, x, p.gw, cfg);
  if (ok) *ok = ran;
  else EXPECT_TRUE(ran) << "linear_wgmma_swiglu declined " << case_name(p.c, M) << cfg_name(cfg);
  return fetch(act);
}

// The unfused path with an explicit wgmma configuration: linear_wgmma then swiglu_forward.
std::vector<float> run_plain(GatedProblem& p, int64_t M, cuda::WgmmaGemmConfig cfg = {}) {
  Tensor gu = poisoned(DType::bf16, {M, 2 * p.c.F}), act = poisoned(DType::bf16, {M, p.c.F});
  Tensor x = p.xs(M);
  EXPECT_TRUE(cuda::linear_wgmma(gpu_ctx(), gu, x, p.gw, nullptr, false, cfg))
      << "linear_wgmma declined " << case_name(p.c, M) << cfg_name(cfg);
  cuda::swiglu_forward(gpu_ctx(), act, gu);
  return fetch(act);
}

bool has_nan(const std::vector<float>& v) {
  for (float f : v)
    if (std::isnan(f)) return true;
  return false;
}
bool all_nan(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isnan(f)) return false;
  return true;
}

const GatedCase kCases[] = {
    {896, 4864},   // Qwen2.5-0.5B (C, F)
    {1024, 3072},  // Qwen3-0.6B
    {904, 160},    // K = 14 chunks + 8 columns (a zero-filled partial chunk), F = 5 tiles of 32
    {2048, 128},   // few tiles, long K: the heuristic splits K (cluster reduction)
    {128, 96},     // F a multiple of 32 only
    {64, 32},      // one chunk, one tile
};
const int64_t kMs[] = {1, 7, 33, 64};

}  // namespace

// Every M of every case with the heuristic's configuration: within the bound of the CPU
// reference; bit for bit the unfused path with the plain heuristic's configuration (what
// linear_forward runs for the (2F, K) product); rows bitwise equal to the M = 64 run's; a
// repeated run bitwise equal.
TEST(CudaLinearSwiglu, MatchesCpuAndUnfusedAndIsBatchInvariant) {
  GRPO_SKIP_WITHOUT_WGMMA();
  uint32_t seed = 1100;
  for (const GatedCase& c : kCases) {
    GatedProblem p(c, seed += 10);
    const cuda::WgmmaGemmConfig h = cuda::wgmma_gated_config(c.F, c.K);
    const cuda::WgmmaGemmConfig hp = cuda::wgmma_gemm_config(2 * c.F, c.K);
    ASSERT_GT(h.nt, 0) << case_name(c, 64);
    EXPECT_EQ(h.split, hp.split) << case_name(c, 64) << cfg_name(h) << " plain" << cfg_name(hp);
    EXPECT_EQ(c.F % h.nt, 0) << case_name(c, 64) << cfg_name(h);
    EXPECT_TRUE(h.stages >= 2 && h.stages <= 16) << case_name(c, 64) << cfg_name(h);
    const std::vector<float> full = run_fused(p, 64);
    EXPECT_TRUE(bitwise_equal(run_fused(p, 64), full, full.size())) << "repeat differs: " << case_name(c, 64);
    for (int64_t M : kMs) {
      const std::string name = case_name(c, M) + cfg_name(h);
      const std::vector<float> got = M == 64 ? full : run_fused(p, M);
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      EXPECT_TRUE(within_bound(name, got, ref, bound));
      EXPECT_TRUE(bitwise_equal(got, full, size_t(M * c.F))) << "rows depend on M: " << name;
      EXPECT_TRUE(bitwise_equal(got, run_plain(p, M), got.size())) << "differs from linear_wgmma + swiglu: " << name;
    }
  }
}

// For each split: the unfused path (plain nt = 64, default ring) against the fused kernel
// with every tile width H (32, 64, 128: wgmma n = 64, 128, 256) and a default, shallow and
// deep ring: bit for bit. H not dividing F declines and writes nothing.
TEST(CudaLinearSwiglu, BitwiseEqualsUnfusedAllConfigurations) {
  GRPO_SKIP_WITHOUT_WGMMA();
  // K with a partial chunk; 2 chunks (splits 4 and 8 leave ranks without chunks); Qwen3-0.6B;
  // 9 chunks (uneven rank ranges).
  const GatedCase cases[] = {{904, 384}, {128, 96}, {1024, 3072}, {576, 160}};
  uint32_t seed = 1300;
  for (const GatedCase& c : cases) {
    GatedProblem p(c, seed += 10);
    for (int64_t M : {int64_t(5), int64_t(64)}) {
      std::vector<float> ref, bound;
      p.reference(M, ref, bound);
      for (int split : {1, 2, 4, 8}) {
        const std::vector<float> plain = run_plain(p, M, {64, split, 0});
        EXPECT_TRUE(within_bound(case_name(c, M) + " unfused split=" + std::to_string(split), plain, ref, bound));
        for (int half : {32, 64, 128}) {
          const int deep = half == 32 ? 12 : half == 64 ? 8 : 5;
          for (int stages : {0, 2, deep}) {
            const cuda::WgmmaGemmConfig g{half, split, stages};
            const std::string name = case_name(c, M) + cfg_name(g);
            bool ran = false;
            const std::vector<float> got = run_fused(p, M, g, &ran);
            if (c.F % half != 0) {
              EXPECT_FALSE(ran) << "should decline: " << name;
              EXPECT_TRUE(all_nan(got)) << "a declined call wrote act: " << name;
              continue;
            }
            EXPECT_TRUE(ran) << "declined: " << name;
            EXPECT_TRUE(bitwise_equal(got, plain, plain.size())) << "differs from linear_wgmma + swiglu: " << name;
          }
        }
      }
    }
  }
}

// split = 1 with more tiles than resident blocks (F = 9216: 288 tiles of 32, 72 of 128): each
// block walks several tiles with one TMA ring. Same bits as the unfused path, correct, and
// independent of M.
TEST(CudaLinearSwiglu, PersistentTileLoop) {
  GRPO_SKIP_WITHOUT_WGMMA();
  const GatedCase c{512, 9216};
  GatedProblem p(c, 1500);
  std::vector<float> full;
  for (int64_t M : {int64_t(64), int64_t(3)}) {
    std::vector<float> ref, bound;
    p.reference(M, ref, bound);
    const std::vector<float> plain = run_plain(p, M, {64, 1, 0});
    for (const cuda::WgmmaGemmConfig g : {cuda::WgmmaGemmConfig{32, 1, 2}, cuda::WgmmaGemmConfig{32, 1, 12},
                                          cuda::WgmmaGemmConfig{64, 1, 8}, cuda::WgmmaGemmConfig{128, 1, 5}}) {
      const std::string name = case_name(c, M) + cfg_name(g);
      const std::vector<float> got = run_fused(p, M, g);
      EXPECT_TRUE(within_bound(name, got, ref, bound));
      EXPECT_TRUE(bitwise_equal(got, plain, plain.size())) << "differs from linear_wgmma + swiglu: " << name;
      if (M == 64 && full.empty()) full = got;
      if (!full.empty()) EXPECT_TRUE(bitwise_equal(got, full, size_t(M * c.F))) << "rows depend on M: " << name;
    }
    EXPECT_TRUE(bitwise_equal(run_fused(p, M), run_plain(p, M), size_t(M * c.F))) << "heuristic " << case_name(c, M);
  }
}

// A cluster (split-K) launch and a persistent one captured into a CUDA graph replay to the
// same bits as direct calls, twice.
TEST(CudaLinearSwiglu, GraphReplay) {
  GRPO_SKIP_WITHOUT_WGMMA();
  GatedProblem p({896, 4864}, 1600), q({128, 9216}, 1610);
  const cuda::WgmmaGemmConfig cluster_cfg{32, 4, 0}, persistent_cfg{32, 1, 12};
  const std::vector<float> direct_p = run_fused(p, 64, cluster_cfg);
  const std::vector<float> direct_q = run_fused(q, 64, persistent_cfg);
  Tensor ap = poisoned(DType::bf16, {64, p.c.F}), aq = poisoned(DType::bf16, {64, q.c.F});
  Tensor xp = p.xs(64), xq = q.xs(64);
  auto st = static_cast<cudaStream_t>(gpu_ctx().stream());
  gpu_ctx().synchronize();
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const bool used_p = cuda::linear_wgmma_swiglu(gpu_ctx(), ap, xp, p.gw, cluster_cfg);
  const bool used_q = cuda::linear_wgmma_swiglu(gpu_ctx(), aq, xq, q.gw, persistent_cfg);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(used_p);
  ASSERT_TRUE(used_q);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_TRUE(bitwise_equal(fetch(ap), direct_p, direct_p.size())) << "replay " << rep;
    EXPECT_TRUE(bitwise_equal(fetch(aq), direct_q, direct_q.size())) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The dispatcher: where linear_forward would run linear_wgmma on (M, 2F) it runs the fused
// kernel (gate_up is left unwritten) and gives the bits of linear_forward + swiglu_forward;
// with the switch off, and where linear_forward would pick linear_small_m (M <= 16 with 2F <=
// 4096 by default), it runs the two ops (gate_up written), with the same act bits.
TEST(CudaLinearSwiglu, DispatcherFusesWherePlainUsesWgmma) {
  GRPO_SKIP_WITHOUT_WGMMA();
  const bool was_on = cuda::fused_gate_swiglu_enabled();
  struct DCase {
    GatedCase c;
    int64_t M;
  };
  const DCase cases[] = {{{896, 4864}, 7}, {{896, 4864}, 64}, {{1024, 3072}, 1}, {{1024, 1024}, 7}, {{1024, 1024}, 33}};
  uint32_t seed = 1700;
  for (const DCase& d : cases) {
    GatedProblem p(d.c, seed += 10);
    const int64_t M = d.M, F = d.c.F;
    const std::string name = case_name(d.c, M);
    Tensor x = p.xs(M);
    Tensor gu2 = poisoned(DType::bf16, {M, 2 * F}), act2 = poisoned(DType::bf16, {M, F});
    linear_forward(gpu_ctx(), gu2, x, p.gw, nullptr, false);
    swiglu_forward(gpu_ctx(), act2, gu2);
    const std::vector<float> expect = fetch(act2);
    std::vector<float> ref, bound;
    p.reference(M, ref, bound);
    EXPECT_TRUE(within_bound(name + " linear_forward + swiglu_forward", expect, ref, bound));
    // Where linear_forward sends (M, 2F) to the small-M kernel the dispatcher must not fuse.
    const bool small_m = cuda::small_m_gemm_enabled() && cuda::small_m_preferred(M, 2 * F);
    for (bool on : {true, false}) {
      cuda::set_fused_gate_swiglu_enabled(on);
      Tensor gu = poisoned(DType::bf16, {M, 2 * F}), act = poisoned(DType::bf16, {M, F});
      linear_swiglu_forward(gpu_ctx(), act, gu, x, p.gw);
      const std::vector<float> got = fetch(act), gate_up = fetch(gu);
      EXPECT_TRUE(bitwise_equal(got, expect, expect.size())) << name << " fused switch " << on;
      if (on && !small_m) EXPECT_TRUE(all_nan(gate_up)) << "not fused: " << name;
      else EXPECT_FALSE(has_nan(gate_up)) << "gate_up not written on the unfused path: " << name << " switch " << on;
    }
  }
  cuda::set_fused_gate_swiglu_enabled(was_on);
}

// Where the fused kernel does not apply the dispatcher runs linear_forward + swiglu_forward:
// M = 65 (past the decode kernels: cuBLASLt) and F = 40 (not a multiple of 32, where
// linear_wgmma_swiglu itself declines and leaves act alone).
TEST(CudaLinearSwiglu, DispatcherFallsBack) {
  GRPO_SKIP_WITHOUT_WGMMA();
  {
    const GatedCase c{896, 4864};
    const int64_t M = 65;
    GatedProblem p(c, 1800, M);
    Tensor gu = poisoned(DType::bf16, {M, 2 * c.F}), act = poisoned(DType::bf16, {M, c.F});
    linear_swiglu_forward(gpu_ctx(), act, gu, p.gx, p.gw);
    EXPECT_FALSE(has_nan(fetch(gu))) << "M=65: gate_up not written";
    std::vector<float> ref, bound;
    p.reference(M, ref, bound);
    EXPECT_TRUE(within_bound(case_name(c, M), fetch(act), ref, bound));
  }
  {
    const GatedCase c{64, 40};
    const int64_t M = 33;
    GatedProblem p(c, 1810);
    Tensor x = p.xs(M);
    Tensor act0 = poisoned(DType::bf16, {M, c.F});
    EXPECT_FALSE(cuda::linear_wgmma_swiglu(gpu_ctx(), act0, x, p.gw));
    EXPECT_TRUE(all_nan(fetch(act0))) << "a declined call wrote act";
    Tensor gu = poisoned(DType::bf16, {M, 2 * c.F}), act = poisoned(DType::bf16, {M, c.F});
    Tensor gu2 = poisoned(DType::bf16, {M, 2 * c.F}), act2 = poisoned(DType::bf16, {M, c.F});
    linear_swiglu_forward(gpu_ctx(), act, gu, x, p.gw);
    linear_forward(gpu_ctx(), gu2, x, p.gw, nullptr, false);
    swiglu_forward(gpu_ctx(), act2, gu2);
    const std::vector<float> got = fetch(act), expect = fetch(act2);
    EXPECT_FALSE(has_nan(fetch(gu))) << "F=40: gate_up not written";
    EXPECT_TRUE(bitwise_equal(got, expect, expect.size())) << "F=40: differs from linear_forward + swiglu_forward";
    std::vector<float> ref, bound;
    p.reference(M, ref, bound);
    EXPECT_TRUE(within_bound(case_name(c, M), got, ref, bound));
  }
}

#else
TEST(CudaLinearSwiglu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
