// CUDA vs CPU parity for the sampler (kernels/sampling.h): per-row parameter mixes
// (greedy, plain, top-k, top-p, min-p, combined, banned ids), logits with many exact
// ties (quantised) to exercise the rank-prefix tie rules, raw and processed top-n lists.
// Tokens must match exactly (a mismatch is possible in principle only when u lands
// within f64 rounding of a bucket edge, which random data does not hit).
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include "kernels/sampling.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

struct RowCfg {
  float temp, top_p;
  int32_t top_k;
  float min_p;
};

const RowCfg kRows[] = {
    {0.f, 1.f, 0, 0.f},     {1.f, 1.f, 0, 0.f},      {0.7f, 1.f, 50, 0.f},   {1.f, 0.9f, 0, 0.f},
    {1.f, 1.f, 0, 0.05f},   {0.8f, 0.95f, 40, 0.02f}, {1.3f, 0.5f, 1000, 0.f}, {0.f, 0.9f, 5, 0.1f},
    {1.f, 0.3f, 0, 0.f},    {0.6f, 1.f, 1, 0.f},      {1.f, 0.99f, 3, 0.f},    {1.f, 1.f, 4999, 0.f},
};

// n_top = 0: no top-n lists, so unfiltered rows take the split (multi-block) path.
void run_case(int64_t V, bool quantised, bool top_processed, uint32_t seed, int64_t n_top = 5) {
  const int64_t R = int64_t(sizeof(kRows) / sizeof(kRows[0])), NB = 3;
  auto z = randn(static_cast<size_t>(R * V), seed, 3.f);
  if (quantised)
    for (float& x : z) x = std::round(x * 2.f) / 2.f;  // many exact ties
  std::vector<float> temp, tp, mp;
  std::vector<int32_t> tk, banned(static_cast<size_t>(R * NB), -1);
  std::vector<int64_t> key, pos;
  for (int64_t r = 0; r < R; ++r) {
    const RowCfg& c = kRows[r];
    temp.push_back(c.temp);
    tp.push_back(c.top_p);
    tk.push_back(c.top_k);
    mp.push_back(c.min_p);
    key.push_back(int64_t(sampling_row_key(1234, uint64_t(r))));
    pos.push_back(r * 7);
    if (r % 3 == 1) {  // ban the argmax and one more id
      int64_t am = 0;
      for (int64_t i = 1; i < V; ++i)
        if (z[static_cast<size_t>(r * V + i)] > z[static_cast<size_t>(r * V + am)]) am = i;
      banned[static_cast<size_t>(r * NB)] = int32_t(am);
      banned[static_cast<size_t>(r * NB + 1)] = int32_t(V / 2);
    }
  }
  // CPU reference
  SamplingRows hr;
  hr.temperature = host(temp, {R});
  hr.top_p = host(tp, {R});
  hr.min_p = host(mp, {R});
  hr.top_k = host_i32(tk, {R});
  hr.rng_key = tensor_borrow(key.data(), DType::i64, Device::cpu, {R});
  hr.rng_pos = tensor_borrow(pos.data(), DType::i64, Device::cpu, {R});
  hr.banned = host_i32(banned, {R, NB});
  std::vector<int32_t> tok(static_cast<size_t>(R)), top_ids(static_cast<size_t>(R * n_top));
  std::vector<float> lr(static_cast<size_t>(R)), lp(static_cast<size_t>(R)), top_lp(static_cast<size_t>(R * n_top));
  SamplingOutputs ho;
  ho.tokens = host_i32(tok, {R});
  ho.logprob_raw = host(lr, {R});
  ho.logprob_processed = host(lp, {R});
  if (n_top > 0) {
    ho.top_ids = host_i32(top_ids, {R, n_top});
    ho.top_logprobs = host(top_lp, {R, n_top});
  }
  Tensor hz = host(z, {R, V});
  cpu::sample_tokens(cpu_ctx(), ho, hz, hr, top_processed);

  SamplingRows gr;
  gr.temperature = dev(temp, DType::f32, {R});
  gr.top_p = dev(tp, DType::f32, {R});
  gr.min_p = dev(mp, DType::f32, {R});
  gr.top_k = dev_int(tk, DType::i32, {R});
  gr.rng_key = dev_int(key, DType::i64, {R});
  gr.rng_pos = dev_int(pos, DType::i64, {R});
  gr.banned = dev_int(banned, DType::i32, {R, NB});
  SamplingOutputs go;
  go.tokens = dev_int(std::vector<int32_t>(static_cast<size_t>(R), -7), DType::i32, {R});
  go.logprob_raw = poisoned(DType::f32, {R});
  go.logprob_processed = poisoned(DType::f32, {R});
  if (n_top > 0) {
    go.top_ids = dev_int(std::vector<int32_t>(static_cast<size_t>(R * n_top), -7), DType::i32, {R, n_top});
    go.top_logprobs = poisoned(DType::f32, {R, n_top});
  }
  Tensor gz = dev(z, DType::f32, {R, V});
  cuda::sample_tokens(gpu_ctx(), go, gz, gr, top_processed);

  const std::string nm = "sample_tokens V=" + std::to_string(V) + (quantised ? " quantised" : "") +
                         (top_processed ? " top=processed" : " top=raw") + " n_top=" + std::to_string(n_top);
  auto gtok = fetch_i32(go.tokens);
  for (int64_t r = 0; r < R; ++r)
    EXPECT_EQ(gtok[static_cast<size_t>(r)], tok[static_cast<size_t>(r)]) << nm << " token of row " << r;
  EXPECT_TRUE(close(nm + " logprob_raw", fetch(go.logprob_raw), lr, Tol{2e-5, 1e-5}));
  EXPECT_TRUE(close(nm + " logprob_processed", fetch(go.logprob_processed), lp, Tol{2e-5, 1e-5}));
  if (n_top == 0) return;
  auto gids = fetch_i32(go.top_ids);
  for (size_t i = 0; i < gids.size(); ++i)
    EXPECT_EQ(gids[i], top_ids[i]) << nm << " top id " << i % n_top << " of row " << i / n_top;
  EXPECT_TRUE(close(nm + " top_logprobs", fetch(go.top_logprobs), top_lp, Tol{2e-5, 1e-5}));
}

}  // namespace

TEST(CudaSampling, MatchesCpuReference) {
  GRPO_SKIP_WITHOUT_CUDA();
  run_case(5000, false, false, 60);
  run_case(5000, true, true, 61);
  run_case(151936, false, true, 62);  // Qwen2.5 vocabulary size
  run_case(777, true, false, 63);
  // Split path (no top-n lists): chunks of 8192 ids, one chunk and a partial last chunk.
  run_case(151936, false, false, 64, 0);
  run_case(5000, true, false, 65, 0);
  run_case(20000, false, false, 66, 0);
}

#else
TEST(CudaSampling, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
