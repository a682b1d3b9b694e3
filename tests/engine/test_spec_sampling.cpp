// Speculative sampling (acceptance = rejection, kernels/spec_verify.h) on the CPU: emitted
// tokens must follow the target's processed distribution exactly, whatever the draft. Checked
// with chi-square tests over many seeds against distributions computed here independently
// (op level) or read from the plain engine's top-n processed logprobs (engine level, whose
// sampler test_sampling.cpp checks against references). Fixed seeds make each test
// deterministic; the thresholds are the chi-square quantiles at α = 0.001, so a correct
// implementation passes for all but ~1 in 1000 seed choices, and a biased one (e.g. accepting
// with p(x) instead of p(x)/q(x), or resampling from p instead of max(0, p − q)) fails by far.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kernels/sampling.h"
#include "kernels/spec_verify.h"
#include "model/checkpoint.h"

using namespace grpo;
using namespace grpo::test;

namespace {

// Upper α = 0.001 quantile of chi-square with df degrees of freedom (Wilson–Hilferty), which
// is within 1% of the tabulated values for df >= 3 (df 4: 18.47, df 63: 103.4).
double chi2_crit(int df) {
  const double z = 3.0902;  // standard normal upper 0.001 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic of counts against expected probabilities; bins whose expected count is
// below 5 are pooled into one. Returns (statistic, degrees of freedom).
std::pair<double, int> chi2(const std::vector<double>& expect_p, const std::vector<int64_t>& counts, int64_t n) {
  double stat = 0, pool_e = 0, pool_o = 0;
  int bins = 0;
  for (size_t i = 0; i < expect_p.size(); ++i) {
    const double e = expect_p[i] * double(n);
    if (e < 5) {
      pool_e += e;
      pool_o += double(counts[i]);
      continue;
    }
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++bins;
  }
  if (pool_e >= 5) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++bins;
  } else if (pool_e > 0) {
    EXPECT_LE(pool_o, 20 + 4 * pool_e) << "tokens of (almost) zero probability were emitted";
  }
  return {stat, bins - 1};
}

// Inverse CDF in ascending id order (kernels/sampling.h's rule), written out here.
int inverse_cdf(const std::vector<double>& p, double u) {
  double cum = 0, tot = 0;
  for (double v : p) tot += v;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (p[i] > 0 && cum > u * tot) return int(i);
  }
  int last = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) last = int(i);
  return last;
}

Tensor host_f32(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor t = tensor_zeros(Device::cpu, DType::f32, {rows, cols});
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

}  // namespace

// The sampler's dense probs output is the processed distribution of kernels/sampling.h:
// softmax of z / T over the top-k ids, 0 elsewhere.
TEST(SpecSampling, SamplerProbsAreTheProcessedDistribution) {
  Context ctx;
  const std::vector<float> z = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, 1.7f};
  const int64_t V = 6;
  SamplingRows rows;
  rows.temperature = host_f32({0.8f}, 1, 1).view({1});
  rows.top_p = host_f32({1.f}, 1, 1).view({1});
  rows.min_p = host_f32({0.f}, 1, 1).view({1});
  rows.top_k = tensor_zeros(Device::cpu, DType::i32, {1});
  rows.top_k.ptr<int32_t>()[0] = 4;
  rows.rng_key = tensor_zeros(Device::cpu, DType::i64, {1});
  rows.rng_pos = tensor_zeros(Device::cpu, DType::i64, {1});
  SamplingOutputs o;
  o.tokens = tensor_zeros(Device::cpu, DType::i32, {1});
  o.logprob_raw = tensor_zeros(Device::cpu, DType::f32, {1});
  o.logprob_processed = tensor_zeros(Device::cpu, DType::f32, {1});
  o.probs = tensor_zeros(Device::cpu, DType::f32, {1, V});
  sample_tokens(ctx, o, host_f32(z, 1, V), rows, false);
  // Reference: the 4 largest logits are ids 1, 4, 5, 0.
  double s = 0;
  for (int i : {1, 4, 5, 0}) s += std::exp(double(z[size_t(i)]) / 0.8);
  for (int i = 0; i < V; ++i) {
    const bool kept = i == 1 || i == 4 || i == 5 || i == 0;
    const double want = kept ? std::exp(double(z[size_t(i)]) / 0.8) / s : 0.0;
    EXPECT_NEAR(o.probs.ptr<float>()[i], want, 1e-6) << "id " << i;
  }
  EXPECT_NEAR(std::exp(o.logprob_processed.ptr<float>()[0]), o.probs.ptr<float>()[o.tokens.ptr<int32_t>()[0]], 1e-6);
}

namespace {

struct VerifyDraws {
  std::vector<int64_t> counts;
  int64_t accepted = 0, old_rule_accepted = 0;
};

// n rows of one position: x ~ q drawn here with the sampler's uniform of (key_i, pos 0);
// q empty = point mass at x_fixed. old_rule: accepted iff x equals the target's seeded sample
// (inverse CDF of p at the same uniform), the rule speculative sampling replaces.
VerifyDraws draw(const std::vector<float>& z, const std::vector<double>& p, const std::vector<double>& q,
                 int x_fixed, int64_t n) {
  Context ctx;
  const int64_t V = int64_t(p.size());
  std::vector<float> pf(p.begin(), p.end()), qf(q.begin(), q.end());
  const Tensor logits = host_f32(z, 1, V), P = host_f32(pf, 1, V);
  const Tensor Q = q.empty() ? Tensor{} : host_f32(qf, 1, V);
  SpecVerifyRows rows{tensor_zeros(Device::cpu, DType::i32, {n}), tensor_zeros(Device::cpu, DType::i32, {n}),
                      tensor_zeros(Device::cpu, DType::i32, {n}), tensor_zeros(Device::cpu, DType::i64, {n}),
                      tensor_zeros(Device::cpu, DType::i64, {n})};
  SpecVerifyOutputs out{tensor_zeros(Device::cpu, DType::i32, {n}), tensor_zeros(Device::cpu, DType::i32, {n}),
                        tensor_zeros(Device::cpu, DType::f32, {n}), tensor_zeros(Device::cpu, DType::f32, {n})};
  VerifyDraws d;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = sampling_row_key(1234, uint64_t(i));
    const double u = sampling_uniform(key, 0);
    const int x = q.empty() ? x_fixed : inverse_cdf(q, u);
    rows.q_rows.ptr<int32_t>()[i] = q.empty() ? -1 : 0;
    rows.draft.ptr<int32_t>()[i] = x;
    rows.rng_key.ptr<int64_t>()[i] = int64_t(key);
    d.old_rule_accepted += x == inverse_cdf(p, u);
  }
  spec_verify(ctx, out, logits, P, Q, rows);
  d.counts.assign(size_t(V), 0);
  double m = -1e30, s = 0;
  for (float v : z) m = std::max(m, double(v));
  for (float v : z) s += std::exp(double(v) - m);
  for (int64_t i = 0; i < n; ++i) {
    const int t = out.token.ptr<int32_t>()[i];
    ++d.counts[size_t(t)];
    d.accepted += out.accepted.ptr<int32_t>()[i];
    if (out.accepted.ptr<int32_t>()[i]) EXPECT_EQ(t, rows.draft.ptr<int32_t>()[i]);
    EXPECT_NEAR(out.lp_raw.ptr<float>()[i], double(z[size_t(t)]) - m - std::log(s), 1e-5);
    EXPECT_NEAR(out.lp_proc.ptr<float>()[i], std::log(p[size_t(t)]), 1e-5);
  }
  return d;
}

}  // namespace

TEST(SpecSampling, EmittedTokensFollowTheTargetForADraftDistribution) {
  const std::vector<float> z = {0.2f, 1.1f, -0.4f, 0.9f, 0.0f, 0.5f};  // only for the raw logprobs
  const std::vector<double> p = {0.05, 0.30, 0.0, 0.25, 0.15, 0.25};
  const std::vector<double> q = {0.30, 0.10, 0.20, 0.25, 0.05, 0.10};  // also proposes id 2, p(2) = 0
  const int64_t n = 20000;
  const VerifyDraws d = draw(z, p, q, 0, n);
  EXPECT_EQ(d.counts[2], 0) << "an id the target never samples was emitted";
  const auto [stat, df] = chi2(p, d.counts, n);
  EXPECT_LT(stat, chi2_crit(df)) << "emitted tokens do not follow p (df " << df << ")";
  // Acceptance of speculative sampling is Σ min(p, q) = 1 − TV(p, q) = 0.55 here.
  double overlap = 0;
  for (size_t i = 0; i < p.size(); ++i) overlap += std::min(p[i], q[i]);
  const double rate = double(d.accepted) / double(n), sd = std::sqrt(overlap * (1 - overlap) / double(n));
  EXPECT_NEAR(rate, overlap, 4 * sd);
  EXPECT_GE(d.accepted, d.old_rule_accepted) << "speculative sampling kept fewer drafts than the match rule";
  std::printf("[spec] draft q: acceptance %.4f (1 - TV %.4f), match rule on the same draws %.4f, chi2 %.2f (df %d, "
              "limit %.2f)\n",
              rate, overlap, double(d.old_rule_accepted) / double(n), stat, df, chi2_crit(df));
}

TEST(SpecSampling, EmittedTokensFollowTheTargetForAPointMassDraft) {
  const std::vector<float> z = {0.2f, 1.1f, -0.4f, 0.9f, 0.0f, 0.5f};
  const std::vector<double> p = {0.05, 0.30, 0.0, 0.25, 0.15, 0.25};
  const int64_t n = 20000;
  for (int x : {3, 2}) {  // a likely proposal, then one the target never samples
    const VerifyDraws d = draw(z, p, {}, x, n);
    const auto [stat, df] = chi2(p, d.counts, n);
    EXPECT_LT(stat, chi2_crit(df)) << "prompt-lookup draft " << x;
    const double sd = std::sqrt(p[size_t(x)] * (1 - p[size_t(x)]) / double(n)) + 1e-12;
    EXPECT_NEAR(double(d.accepted) / double(n), p[size_t(x)], 4 * sd) << "acceptance must be p(x)";
  }
}

namespace {

// The target with its final norm scaled by 0.6: the same ranking (so the same top-8 set) but
// flatter logits, so q differs from p everywhere and both acceptance and the residual draw
// are exercised.
const ModelWeights& related_draft() {
  static ModelWeights* p = [] {
    auto w = model_load(stories().dir, Device::cpu, DType::f32);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    auto* d = new ModelWeights(std::move(w).value());
    float* g = d->final_norm.ptr<float>();
    for (int64_t i = 0; i < d->final_norm.numel(); ++i) g[i] *= 0.6f;
    return d;
  }();
  return *p;
}

EngineOptions engine_opts() {
  EngineOptions o;
  o.block_size = 4;
  o.n_kv_blocks = 4096;
  o.max_num_seqs = 256;
  o.max_num_batched_tokens = 2048;
  return o;
}

SamplingParams sp(uint64_t seed, int max_tokens, int top_n = 0, bool processed = true) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 8;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.seed = seed;
  p.top_logprobs = top_n;
  p.logprobs_mode = processed ? LogprobsMode::processed : LogprobsMode::raw;
  return p;
}

// The kept distribution of the next token after `prompt` (top-8 processed logprobs of the
// plain engine: with top_k = 8 they are the whole processed distribution).
std::map<int32_t, double> next_dist(Engine& eng, const std::vector<int32_t>& prompt) {
  auto out = eng.generate({prompt}, sp(0, 1, 8));
  GRPO_CHECK(out.ok());
  std::map<int32_t, double> d;
  for (auto [id, lp] : out.value()[0].top_logprobs[0]) d[id] = std::exp(double(lp));
  return d;
}

// The target's joint distribution of the first two completion tokens after a prompt that
// repeats itself after the likely next tokens (so that prompt lookup finds the sampled token 0
// earlier in the sequence and proposes token 1, a point-mass q), read from the plain engine.
struct JointCase {
  std::vector<int32_t> prompt;
  std::map<std::pair<int32_t, int32_t>, double> joint;
  std::map<std::pair<int32_t, int32_t>, float> raw_lp;
  std::vector<std::pair<int32_t, int32_t>> keys;
  std::vector<double> expect;
};

const JointCase& joint_case() {
  static JointCase* c = [] {
    const std::vector<int32_t> base = {1, 403, 407, 261, 378};
    ContextOptions co;
    co.deterministic = true;
    Context ctx(co);
    auto* jc = new JointCase;
    jc->prompt = base;
    Engine plain(ctx, stories().w, stories().tok.get(), engine_opts());
    for (auto [t, pt] : next_dist(plain, base)) jc->prompt.push_back(t);
    jc->prompt.insert(jc->prompt.end(), base.begin(), base.end());
    for (auto [t0, p0] : next_dist(plain, jc->prompt)) {
      std::vector<int32_t> pr = jc->prompt;
      pr.push_back(t0);
      for (auto [t1, p1] : next_dist(plain, pr)) jc->joint[{t0, t1}] = p0 * p1;
      auto raw = plain.generate({pr}, sp(0, 1, 8, /*processed=*/false));
      for (auto [id, lp] : raw.value()[0].top_logprobs[0]) jc->raw_lp[{t0, id}] = lp;
    }
    for (auto& [k, v] : jc->joint) {
      jc->keys.push_back(k);
      jc->expect.push_back(v);
    }
    return jc;
  }();
  return *c;
}

// 8000 seeds through a speculative engine with k = 1: the (token 0, token 1) counts must follow
// the target's joint (chi-square), the logprobs of token 1 must be the target's. Returns the
// acceptance rate.
double check_joint(const EngineOptions& eo, const ModelWeights* draft, const std::string& label) {
  const JointCase& jc = joint_case();
  ContextOptions co;
  co.deterministic = true;
  Context ctx(co);
  const int64_t n = 8000;
  Engine eng(ctx, stories().w, stories().tok.get(), eo, nullptr, draft);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(eng.add_request(jc.prompt, sp(uint64_t(i) + 77, 3)).value());
  std::vector<RequestOutput> outs;
  while (eng.has_unfinished())
    for (auto& o : eng.step()) outs.push_back(std::move(o));
  EXPECT_EQ(int64_t(outs.size()), n) << label;
  std::vector<int64_t> counts(jc.keys.size(), 0);
  for (const RequestOutput& o : outs) {
    const std::pair<int32_t, int32_t> k{o.completion_ids[0], o.completion_ids[1]};
    auto it = std::lower_bound(jc.keys.begin(), jc.keys.end(), k);
    if (it == jc.keys.end() || *it != k) {
      ADD_FAILURE() << label << ": a pair outside the target's support was emitted";
      return 0;
    }
    ++counts[size_t(it - jc.keys.begin())];
    double p0 = 0;
    for (auto& [kk, v] : jc.joint)
      if (kk.first == k.first) p0 += v;
    EXPECT_NEAR(o.logprobs_processed[1], std::log(jc.joint.at(k) / p0), 1e-4) << label;
    EXPECT_NEAR(o.logprobs_raw[1], jc.raw_lp.at(k), 1e-4) << label;
  }
  const auto [stat, df] = chi2(jc.expect, counts, n);
  const double r = double(eng.stats().spec_accepted) / double(std::max<int64_t>(1, eng.stats().spec_proposed));
  std::printf("[spec] %s: chi2 %.1f (df %d, limit %.1f), proposed %lld, acceptance %.4f\n", label.c_str(), stat, df,
              chi2_crit(df), (long long)eng.stats().spec_proposed, r);
  EXPECT_LT(stat, chi2_crit(df)) << label;
  EXPECT_GT(eng.stats().spec_proposed, n / 4) << label << ": too few drafted positions to test anything";
  return r;
}

EngineOptions spec_opts(SpecMethod m, SpecAcceptance acc) {
  EngineOptions eo = engine_opts();
  eo.speculative.method = m;
  eo.speculative.num_speculative_tokens = 1;
  eo.speculative.adaptive = false;
  eo.speculative.acceptance = acc;
  return eo;
}

}  // namespace

// At the first drafted position (completion token 1; token 0 comes from the prefill step),
// the joint distribution of (token 0, token 1) over 8000 seeds must be the target's, with a
// related draft model (speculative sampling's residual path) and prompt lookup (point mass).
TEST(SpecSampling, EngineOutputsFollowTheTargetAtADraftedPosition) {
  for (SpecMethod m : {SpecMethod::draft, SpecMethod::ngram}) {
    double rate[2] = {0, 0};
    for (SpecAcceptance acc : {SpecAcceptance::rejection, SpecAcceptance::match}) {
      const std::string label = std::string(spec_method_name(m)) + (acc == SpecAcceptance::rejection ? ", rejection" : ", match");
      rate[acc == SpecAcceptance::rejection ? 0 : 1] =
          check_joint(spec_opts(m, acc), m == SpecMethod::draft ? &related_draft() : nullptr, label);
    }
    EXPECT_GE(rate[0], rate[1]) << spec_method_name(m) << ": speculative sampling accepted less than the match rule";
  }
}

// A draft vocabulary (FR-Spec) that leaves out half of the target's likely second tokens: the
// draft's q is 0 there, so those tokens can only come from the residual draw (rejection) or
// the target's own sample (match); the outputs must still follow the target exactly.
TEST(SpecSampling, EngineOutputsFollowTheTargetWithADraftVocabulary) {
  const JointCase& jc = joint_case();
  std::set<int32_t> second;
  for (auto& [k, v] : jc.joint) second.insert(k.second);
  std::set<int32_t> dropped;
  int i = 0;
  for (int32_t t : second)
    if (i++ % 2 == 0) dropped.insert(t);
  std::vector<int32_t> kept;
  for (int32_t id = 0; id < stories().w.config.vocab_size; ++id)
    if (!dropped.count(id)) kept.push_back(id);
  for (SpecAcceptance acc : {SpecAcceptance::rejection, SpecAcceptance::match}) {
    EngineOptions eo = spec_opts(SpecMethod::draft, acc);
    eo.speculative.draft_vocab_ids = kept;
    check_joint(eo, &related_draft(), acc == SpecAcceptance::rejection ? "draft vocabulary, rejection"
                                                                        : "draft vocabulary, match");
  }
}
