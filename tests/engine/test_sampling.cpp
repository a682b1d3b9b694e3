// CPU sampler against hand-derived distributions: raw logprobs equal
// log_softmax in double, the kept sets of top-k / top-p / min-p on small
// logits, greedy ties, banned ids, seeded reproducibility, batch independence,
// and the RNG against splitmix64's published first outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/sampling_params.h"
#include "kernels/sampling.h"

using namespace grpo;

namespace {

struct RowSpec {
  float temperature = 1.f, top_p = 1.f, min_p = 0.f;
  int top_k = 0;
  uint64_t key = 1, pos = 0;
  std::vector<int32_t> banned;
};

struct Result1 {
  std::vector<int32_t> tokens;
  std::vector<float> lp_raw, lp_proc;
  std::vector<int32_t> top_ids;
  std::vector<float> top_lps;
};

// Runs sample_tokens on R rows of V logits each.
Result1 run(const std::vector<std::vector<float>>& logits, const std::vector<RowSpec>& specs, int n_top = 0,
            bool top_processed = false) {
  Context ctx;
  const int64_t R = int64_t(logits.size()), V = int64_t(logits[0].size());
  std::vector<float> flat;
  for (auto& r : logits) flat.insert(flat.end(), r.begin(), r.end());
  Tensor lg = tensor_from_f32(Device::cpu, DType::f32, flat, {R, V});
  SamplingRows rows;
  rows.temperature = tensor_empty(Device::cpu, DType::f32, {R});
  rows.top_p = tensor_empty(Device::cpu, DType::f32, {R});
  rows.top_k = tensor_empty(Device::cpu, DType::i32, {R});
  rows.min_p = tensor_empty(Device::cpu, DType::f32, {R});
  rows.rng_key = tensor_empty(Device::cpu, DType::i64, {R});
  rows.rng_pos = tensor_empty(Device::cpu, DType::i64, {R});
  size_t nb = 0;
  for (auto& s : specs) nb = std::max(nb, s.banned.size());
  if (nb) rows.banned = tensor_empty(Device::cpu, DType::i32, {R, int64_t(nb)});
  for (int64_t r = 0; r < R; ++r) {
    const RowSpec& s = specs[size_t(r)];
    rows.temperature.ptr<float>()[r] = s.temperature;
    rows.top_p.ptr<float>()[r] = s.top_p;
    rows.top_k.ptr<int32_t>()[r] = s.top_k;
    rows.min_p.ptr<float>()[r] = s.min_p;
    rows.rng_key.ptr<int64_t>()[r] = int64_t(s.key);
    rows.rng_pos.ptr<int64_t>()[r] = int64_t(s.pos);
    for (size_t b = 0; b < nb; ++b) rows.banned.ptr<int32_t>()[r * int64_t(nb) + int64_t(b)] = b < s.banned.size() ? s.banned[b] : -1;
  }
  SamplingOutputs out;
  out.tokens = tensor_empty(Device::cpu, DType::i32, {R});
  out.logprob_raw = tensor_empty(Device::cpu, DType::f32, {R});
  out.logprob_processed = tensor_empty(Device::cpu, DType::f32, {R});
  if (n_top) {
    out.top_ids = tensor_empty(Device::cpu, DType::i32, {R, n_top});
    out.top_logprobs = tensor_empty(Device::cpu, DType::f32, {R, n_top});
  }
  sample_tokens(ctx, out, lg, rows, top_processed);
  Result1 res;
  res.tokens.assign(out.tokens.ptr<int32_t>(), out.tokens.ptr<int32_t>() + R);
  res.lp_raw.assign(out.logprob_raw.ptr<float>(), out.logprob_raw.ptr<float>() + R);
  res.lp_proc.assign(out.logprob_processed.ptr<float>(), out.logprob_processed.ptr<float>() + R);
  if (n_top) {
    res.top_ids.assign(out.top_ids.ptr<int32_t>(), out.top_ids.ptr<int32_t>() + R * n_top);
    res.top_lps.assign(out.top_logprobs.ptr<float>(), out.top_logprobs.ptr<float>() + R * n_top);
  }
  return res;
}

// log_softmax in double over the ids in `keep` (others: -inf), of z / T.
std::vector<double> log_softmax_ref(const std::vector<float>& z, double T, const std::vector<int>& keep) {
  double m = -1e300;
  for (int i : keep) m = std::max(m, double(z[size_t(i)]) / T);
  double s = 0;
  for (int i : keep) s += std::exp(double(z[size_t(i)]) / T - m);
  std::vector<double> out(z.size(), -std::numeric_limits<double>::infinity());
  for (int i : keep) out[size_t(i)] = double(z[size_t(i)]) / T - m - std::log(s);
  return out;
}

// The kept set, read from processed top-V logprobs (kept ids are finite).
std::vector<int> kept_set(const std::vector<float>& z, const RowSpec& spec) {
  auto r = run({z}, {spec}, int(z.size()), true);
  std::vector<int> k;
  for (size_t j = 0; j < z.size(); ++j)
    if (std::isfinite(r.top_lps[j])) k.push_back(r.top_ids[j]);
  std::sort(k.begin(), k.end());
  return k;
}

// z = [2, 1, 0.5, 0, -1, 3]; at T = 1, q_i = exp(z_i - 3) relative to the best id 5:
//   id:   5      0       1       2       3       4
//   q:    1    .36788  .13534  .08208  .04979  .01832     Σ = 1.65341
//   cum/Σ .60481 .82731 .90917 .95881 .98892 1
const std::vector<float> kZ = {2.f, 1.f, 0.5f, 0.f, -1.f, 3.f};

}  // namespace

TEST(Sampling, Splitmix64MatchesPublishedOutputs) {
  // splitmix64 seeded with 0 yields 0xe220a8397b1dcdaf, then 0x6e789e6aa1b965f4;
  // sampling_mix64(k·γ) is its k+1-th output.
  EXPECT_EQ(sampling_mix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(sampling_mix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
  for (uint64_t pos = 0; pos < 1000; ++pos) {
    float u = sampling_uniform(42, pos);
    ASSERT_GE(u, 0.f);
    ASSERT_LT(u, 1.f);
  }
}

TEST(Sampling, RawLogprobIsLogSoftmaxInDouble) {
  std::vector<int> all = {0, 1, 2, 3, 4, 5};
  auto ref = log_softmax_ref(kZ, 1.0, all);
  RowSpec s;
  s.temperature = 0.7f;
  s.top_k = 2;
  s.banned = {5};
  for (uint64_t pos = 0; pos < 20; ++pos) {
    s.pos = pos;
    auto r = run({kZ}, {s}, 6, false);
    // Raw ignores temperature, filters and bans.
    EXPECT_NEAR(r.lp_raw[0], ref[size_t(r.tokens[0])], 1e-6);
    for (int j = 0; j < 6; ++j) EXPECT_NEAR(r.top_lps[size_t(j)], ref[size_t(r.top_ids[size_t(j)])], 1e-6);
    // Raw top list: ids by z descending.
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{5, 0, 1, 2, 3, 4}));
  }
}

TEST(Sampling, TopKKeepsTheKBest) {
  RowSpec s;
  s.top_k = 2;  // ids 5 and 0
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 5}));
  s.top_k = 10;  // more than V: off
  EXPECT_EQ(kept_set(kZ, s).size(), 6u);
}

TEST(Sampling, TopPKeepsTheShortestPrefixReachingP) {
  RowSpec s;
  s.top_p = 0.8f;  // cum .60481 < .8 <= .82731: ids 5, 0
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 5}));
  s.top_p = 0.85f;  // .82731 < .85 <= .90917: ids 5, 0, 1
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 1, 5}));
  s.top_p = 0.5f;  // the top id alone already reaches .5
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{5}));
  // Top-p applies to the top-k renormalised mass: with k = 3, Σ = 1.50321 and
  // cum = .66524, .90997, 1: p = .9 keeps 2 ids, p = .95 keeps 3 (without top-k,
  // p = .95 would keep 4: .90917 < .95 <= .95881).
  s.top_k = 3;
  s.top_p = 0.9f;
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 5}));
  s.top_p = 0.95f;
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 1, 5}));
  s.top_k = 0;
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 1, 2, 5}));
}

TEST(Sampling, MinPDropsIdsBelowAFractionOfTheBest) {
  RowSpec s;
  s.min_p = 0.1f;  // q >= .1: ids 5 (1), 0 (.368), 1 (.135)
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 1, 5}));
  // At T = 2 the q are exp((z - 3)/2): 1, .60653, .36788, .28650, .22313, .13534:
  // min_p = .25 keeps ids 5, 0, 1, 2.
  s.temperature = 2.f;
  s.min_p = 0.25f;
  EXPECT_EQ(kept_set(kZ, s), (std::vector<int>{0, 1, 2, 5}));
}

TEST(Sampling, ProcessedLogprobIsRenormalisedOverTheKeptSet) {
  RowSpec s;
  s.temperature = 0.5f;
  s.top_k = 3;
  auto ref = log_softmax_ref(kZ, 0.5, {5, 0, 1});
  for (uint64_t pos = 0; pos < 30; ++pos) {
    s.pos = pos;
    auto r = run({kZ}, {s}, 3, true);
    ASSERT_TRUE(r.tokens[0] == 5 || r.tokens[0] == 0 || r.tokens[0] == 1);
    EXPECT_NEAR(r.lp_proc[0], ref[size_t(r.tokens[0])], 1e-6);
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{5, 0, 1}));
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.top_lps[size_t(j)], ref[size_t(r.top_ids[size_t(j)])], 1e-6);
  }
}

TEST(Sampling, GreedyTakesArgmaxLowestIdOnTiesAndRespectsBans) {
  RowSpec g;
  g.temperature = 0.f;
  std::vector<float> tie = {1.f, 3.f, 0.f, 3.f};
  EXPECT_EQ(run({tie}, {g}).tokens[0], 1);
  g.banned = {1};
  auto r = run({tie}, {g});
  EXPECT_EQ(r.tokens[0], 3);
  // Processed at greedy: temperature treated as 1, id 1 masked: softmax over {0, 2, 3}.
  auto ref = log_softmax_ref(tie, 1.0, {0, 2, 3});
  EXPECT_NEAR(r.lp_proc[0], ref[3], 1e-6);
  auto raw = log_softmax_ref(tie, 1.0, {0, 1, 2, 3});
  EXPECT_NEAR(r.lp_raw[0], raw[3], 1e-6);
}

TEST(Sampling, InverseCdfInIdOrderWithTheCounterRng) {
  // Expected token re-derived from the definition in kernels/sampling.h.
  RowSpec s;
  s.key = sampling_row_key(1234, 0);
  auto ref = log_softmax_ref(kZ, 1.0, {0, 1, 2, 3, 4, 5});
  for (uint64_t pos = 0; pos < 200; ++pos) {
    s.pos = pos;
    const double u = sampling_uniform(s.key, pos);
    double cum = 0;
    int expect = 5;
    for (int i = 0; i < 6; ++i) {
      cum += std::exp(ref[size_t(i)]);
      if (cum > u) { expect = i; break; }
    }
    EXPECT_EQ(run({kZ}, {s}).tokens[0], expect) << "pos " << pos << " u " << u;
  }
}

TEST(Sampling, SeededDrawsFollowTheDistributionAndRepeat) {
  RowSpec s;
  s.key = sampling_row_key(7, 3);
  auto ref = log_softmax_ref(kZ, 1.0, {0, 1, 2, 3, 4, 5});
  const int N = 4000;
  std::vector<std::vector<float>> rows(size_t(N), kZ);
  std::vector<RowSpec> specs(size_t(N), s);
  for (int i = 0; i < N; ++i) specs[size_t(i)].pos = uint64_t(i);
  auto a = run(rows, specs);
  auto b = run(rows, specs);
  EXPECT_EQ(a.tokens, b.tokens);
  std::vector<int> count(6, 0);
  for (int t : a.tokens) ++count[size_t(t)];
  for (int i = 0; i < 6; ++i) {
    const double p = std::exp(ref[size_t(i)]);
    EXPECT_NEAR(double(count[size_t(i)]) / N, p, 4 * std::sqrt(p * (1 - p) / N) + 1e-3) << "id " << i;
  }
}

TEST(Sampling, RowsDoNotDependOnTheirNeighbours) {
  RowSpec s1, s2, s3;
  s1.key = 11; s1.pos = 5; s1.top_p = 0.9f;
  s2.key = 12; s2.pos = 9; s2.temperature = 0.f;
  s3.key = 13; s3.pos = 2; s3.min_p = 0.05f; s3.banned = {5, 0};
  std::vector<float> z2 = {0.1f, -0.2f, 4.f, 0.f, 1.f, 2.f};
  auto batch = run({kZ, z2, kZ}, {s1, s2, s3});
  EXPECT_EQ(run({kZ}, {s1}).tokens[0], batch.tokens[0]);
  EXPECT_EQ(run({z2}, {s2}).tokens[0], batch.tokens[1]);
  auto alone3 = run({kZ}, {s3});
  EXPECT_EQ(alone3.tokens[0], batch.tokens[2]);
  EXPECT_EQ(alone3.lp_proc[0], batch.lp_proc[2]);
  EXPECT_NE(batch.tokens[2], 5);
  EXPECT_NE(batch.tokens[2], 0);
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.validate(100).ok());
  p.temperature = -0.1f;
  EXPECT_NE(p.validate().message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0.f;
  EXPECT_NE(p.validate().message().find("top_p"), std::string::npos);
  p.top_p = 1.5f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.min_p = 2.f;
  EXPECT_NE(p.validate().message().find("min_p"), std::string::npos);
  p = {};
  p.top_k = -1;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.n = 0;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.min_tokens = 300;
  EXPECT_NE(p.validate().message().find("min_tokens"), std::string::npos);
  p = {};
  p.stop_token_ids = {100};
  EXPECT_NE(p.validate(100).message().find("stop token id"), std::string::npos);
}
