// CUDA vs CPU parity for speculative sampling's pieces: the sampler's dense `probs` output
// (kernels/sampling.h; CUDA serves it on the one-block path) and spec_verify
// (kernels/spec_verify.h), at Qwen2.5's vocabulary with plain, top-k, top-p and min-p rows,
// draft distributions and point masses. Tokens and accept flags must match exactly except
// where a uniform lands within rounding of a bucket edge (at most 2 rows of 256, so a
// systematic error cannot hide); probabilities and logprobs within f32 reduction tolerance.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <random>

#include "kernels/sampling.h"
#include "kernels/spec_verify.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

struct Dists {
  std::vector<float> z, probs_cpu, probs_gpu;
};

// R rows of V logits, sampled with a mix of filters; returns both backends' dense probs.
Dists make_probs(int64_t R, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  Dists d;
  d.z.resize(static_cast<size_t>(R * V));
  for (auto& v : d.z) v = nd(rng);
  std::vector<float> temp(static_cast<size_t>(R)), top_p(static_cast<size_t>(R)), min_p(static_cast<size_t>(R));
  std::vector<int32_t> top_k(static_cast<size_t>(R));
  std::vector<int64_t> key(static_cast<size_t>(R)), pos(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    temp[size_t(r)] = 0.7f + 0.1f * float(r % 5);
    top_k[size_t(r)] = r % 4 == 1 ? 50 : 0;
    top_p[size_t(r)] = r % 4 == 2 ? 0.9f : 1.f;
    min_p[size_t(r)] = r % 4 == 3 ? 0.05f : 0.f;
    key[size_t(r)] = int64_t(sampling_row_key(seed, uint64_t(r)));
    pos[size_t(r)] = r;
  }
  std::vector<int32_t> tok(static_cast<size_t>(R));
  std::vector<float> lr(static_cast<size_t>(R)), lp(static_cast<size_t>(R));
  d.probs_cpu.assign(size_t(R * V), -1.f);
  SamplingRows hr;
  hr.temperature = host(temp, {R});
  hr.top_p = host(top_p, {R});
  hr.min_p = host(min_p, {R});
  hr.top_k = host_i32(top_k, {R});
  hr.rng_key = tensor_borrow(key.data(), DType::i64, Device::cpu, {R});
  hr.rng_pos = tensor_borrow(pos.data(), DType::i64, Device::cpu, {R});
  SamplingOutputs ho;
  ho.tokens = host_i32(tok, {R});
  ho.logprob_raw = host(lr, {R});
  ho.logprob_processed = host(lp, {R});
  ho.probs = host(d.probs_cpu, {R, V});
  cpu::sample_tokens(cpu_ctx(), ho, host(d.z, {R, V}), hr, false);
  SamplingRows gr;
  gr.temperature = dev(temp, DType::f32, {R});
  gr.top_p = dev(top_p, DType::f32, {R});
  gr.min_p = dev(min_p, DType::f32, {R});
  gr.top_k = dev_int(top_k, DType::i32, {R});
  gr.rng_key = dev_int(key, DType::i64, {R});
  gr.rng_pos = dev_int(pos, DType::i64, {R});
  SamplingOutputs go;
  go.tokens = dev_int(std::vector<int32_t>(size_t(R), -7), DType::i32, {R});
  go.logprob_raw = poisoned(DType::f32, {R});
  go.logprob_processed = poisoned(DType::f32, {R});
  go.probs = poisoned(DType::f32, {R, V});
  cuda::sample_tokens(gpu_ctx(), go, dev(d.z, DType::f32, {R, V}), gr, false);
  d.probs_gpu = fetch(go.probs);
  return d;
}

}  // namespace

TEST(CudaSpecVerify, DenseProbsMatchCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t R = 16, V = 151936;
  const Dists d = make_probs(R, V, 5);
  EXPECT_TRUE(close("probs", d.probs_gpu, d.probs_cpu, Tol{1e-7, 1e-4}));
}

namespace {

// spec_verify on the CPU with a dense Q (Rp, V) and on CUDA with Q_gpu: the same dense Q, or
// (q_index given) its kept columns (Rp, V_q) with q_index mapping ids to columns.
void verify_parity(const Dists& p, const std::vector<float>& Q, const std::vector<float>& Q_gpu, int64_t Vq,
                   const std::vector<int32_t>* q_index) {
  const int64_t Rp = 8, V = 151936, N = 256;
  std::mt19937 rng(3);
  std::vector<int32_t> pr(static_cast<size_t>(N)), qr(static_cast<size_t>(N)), dr(static_cast<size_t>(N));
  std::vector<int64_t> key(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    pr[size_t(i)] = int32_t(i % Rp);
    qr[size_t(i)] = i % 3 == 0 ? -1 : int32_t((i / 3) % Rp);
    // Drafts: the CPU p row's most likely ids, so both accepts and rejections occur.
    const float* row = p.probs_cpu.data() + size_t(pr[size_t(i)]) * size_t(V);
    int32_t best = 0;
    for (int64_t v = 0; v < V; ++v)
      if (row[v] > row[best]) best = int32_t(v);
    dr[size_t(i)] = i % 2 ? best : int32_t(rng() % uint32_t(V));
    key[size_t(i)] = int64_t(sampling_row_key(99, uint64_t(i)));
    pos[size_t(i)] = i;
  }
  std::vector<int32_t> tc(static_cast<size_t>(N), -7), ac(static_cast<size_t>(N), -7);
  std::vector<float> lrc(static_cast<size_t>(N)), lpc(static_cast<size_t>(N));
  {
    std::vector<float> z = p.z, Pm = p.probs_cpu, Qm = Q;
    SpecVerifyRows r{host_i32(pr, {N}), host_i32(qr, {N}), host_i32(dr, {N}),
                     tensor_borrow(key.data(), DType::i64, Device::cpu, {N}),
                     tensor_borrow(pos.data(), DType::i64, Device::cpu, {N})};
    SpecVerifyOutputs o{host_i32(tc, {N}), host_i32(ac, {N}), host(lrc, {N}), host(lpc, {N})};
    cpu::spec_verify(cpu_ctx(), o, host(z, {Rp, V}), host(Pm, {Rp, V}), host(Qm, {Rp, V}), r);
  }
  SpecVerifyRows r{dev_int(pr, DType::i32, {N}), dev_int(qr, DType::i32, {N}), dev_int(dr, DType::i32, {N}),
                   dev_int(key, DType::i64, {N}), dev_int(pos, DType::i64, {N})};
  if (q_index) r.q_index = dev_int(*q_index, DType::i32, {V});
  SpecVerifyOutputs o{dev_int(std::vector<int32_t>(size_t(N), -7), DType::i32, {N}),
                      dev_int(std::vector<int32_t>(size_t(N), -7), DType::i32, {N}), poisoned(DType::f32, {N}),
                      poisoned(DType::f32, {N})};
  cuda::spec_verify(gpu_ctx(), o, dev(p.z, DType::f32, {Rp, V}), dev(p.probs_cpu, DType::f32, {Rp, V}),
                    dev(Q_gpu, DType::f32, {Rp, Vq}), r);
  const std::vector<int32_t> tg = fetch_i32(o.token), ag = fetch_i32(o.accepted);
  const std::vector<float> lrg = fetch(o.lp_raw), lpg = fetch(o.lp_proc);
  int n_diff = 0, n_acc = 0, n_rej = 0;
  for (int64_t i = 0; i < N; ++i) {
    EXPECT_EQ(ac[size_t(i)], ag[size_t(i)]) << "accept flag of row " << i;
    n_acc += ac[size_t(i)] == 1;
    n_rej += ac[size_t(i)] == 0;
    if (tc[size_t(i)] != tg[size_t(i)]) {
      ++n_diff;
      continue;
    }
    EXPECT_NEAR(lrg[size_t(i)], lrc[size_t(i)], 2e-4) << "row " << i;
    EXPECT_NEAR(lpg[size_t(i)], lpc[size_t(i)], 2e-4) << "row " << i;
  }
  EXPECT_LE(n_diff, 2) << "residual draws differ in more rows than bucket-edge rounding explains";
  EXPECT_GT(n_acc, 0);
  EXPECT_GT(n_rej, 0);
}

}  // namespace

TEST(CudaSpecVerify, VerifyMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const Dists p = make_probs(8, 151936, 11), q = make_probs(8, 151936, 12);
  // Both backends get the same (CPU) distributions, so only spec_verify itself is compared.
  verify_parity(p, q.probs_cpu, q.probs_cpu, 151936, nullptr);
}

// A draft vocabulary (FR-Spec): q over a third of the ids (those of q's rows' top ids among
// them), renormalised, given to CUDA as (Rp, V_q) columns with a q_index, to the CPU as the
// dense (Rp, V) rows with zeros elsewhere: the same test either way.
TEST(CudaSpecVerify, DraftVocabularyColumnsMatchDenseRows) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t Rp = 8, V = 151936;
  const Dists p = make_probs(Rp, V, 11), q = make_probs(Rp, V, 12);
  std::vector<int32_t> q_index(size_t(V), -1), ids;
  for (int64_t v = 0; v < V; ++v)
    if (v % 3 == 0 || p.probs_cpu[size_t(v)] > 0) {  // keep row 0's support too, so drafts are accepted
      q_index[size_t(v)] = int32_t(ids.size());
      ids.push_back(int32_t(v));
    }
  const int64_t Vq = int64_t(ids.size());
  std::vector<float> dense(size_t(Rp * V), 0.f), cols(size_t(Rp * Vq), 0.f);
  for (int64_t r = 0; r < Rp; ++r) {
    double sum = 0;
    for (int32_t id : ids) sum += q.probs_cpu[size_t(r * V + id)];
    for (int64_t c = 0; c < Vq; ++c) {
      const float v = sum > 0 ? float(q.probs_cpu[size_t(r * V + ids[size_t(c)])] / sum) : 0.f;
      cols[size_t(r * Vq + c)] = v;
      dense[size_t(r * V + ids[size_t(c)])] = v;
    }
  }
  verify_parity(p, dense, cols, Vq, &q_index);
}

#else
TEST(CudaSpecVerify, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
