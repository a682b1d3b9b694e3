// CPU reference sampler: plain loops following the definition in
// kernels/sampling.h, one row per task. Sums are in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/sampling.h"

namespace grpo::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RowParams {
  float temperature, top_p, min_p;
  int top_k;
  uint64_t key, pos;
  const int32_t* banned;
  int64_t n_banned;
};

// Orders ids by score descending, then id ascending.
struct ByScore {
  const float* s;
  bool operator()(int32_t a, int32_t b) const { return s[a] > s[b] || (s[a] == s[b] && a < b); }
};

// Writes the n best ids by `score` (ties by lower id) and score[id] - offset.
void top_n(const float* score, int64_t V, double offset, int64_t n, int32_t* ids, float* lps,
           std::vector<int32_t>& scratch) {
  scratch.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) scratch[size_t(i)] = int32_t(i);
  std::partial_sort(scratch.begin(), scratch.begin() + n, scratch.end(), ByScore{score});
  for (int64_t j = 0; j < n; ++j) {
    ids[j] = scratch[size_t(j)];
    lps[j] = score[ids[j]] == kNegInf ? kNegInf : float(double(score[ids[j]]) - offset);
  }
}

void sample_row(const float* z, int64_t V, const RowParams& p, int32_t* token, float* lp_raw, float* lp_proc,
                int64_t n_top, int32_t* top_ids, float* top_lps, bool top_processed, float* probs) {
  // Raw distribution: log_softmax(z).
  float m0 = kNegInf;
  for (int64_t i = 0; i < V; ++i) m0 = std::max(m0, z[i]);
  double s0 = 0;
  for (int64_t i = 0; i < V; ++i) s0 += std::exp(double(z[i]) - double(m0));
  const double lse0 = double(m0) + std::log(s0);

  // Processed logits y: banned -> -inf, then / temperature.
  std::vector<float> y(z, z + V);
  for (int64_t b = 0; b < p.n_banned; ++b)
    if (p.banned[b] >= 0 && p.banned[b] < V) y[size_t(p.banned[b])] = kNegInf;
  const float temp = p.temperature > 0.f ? p.temperature : 1.f;
  if (temp != 1.f)
    for (auto& v : y)
      if (v != kNegInf) v = v / temp;
  float m = kNegInf;
  int64_t n_valid = 0;
  for (int64_t i = 0; i < V; ++i)
    if (y[size_t(i)] != kNegInf) { m = std::max(m, y[size_t(i)]); ++n_valid; }
  GRPO_CHECK_MSG(n_valid > 0, "sample_tokens: every id of a row is banned");

  // q = exp(y - max y): relative probabilities; kept = ids that survive the filters.
  std::vector<float> q(static_cast<size_t>(V));
  std::vector<char> kept(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) {
    q[size_t(i)] = y[size_t(i)] == kNegInf ? 0.f : std::exp(y[size_t(i)] - m);
    kept[size_t(i)] = y[size_t(i)] != kNegInf;
  }
  const bool use_k = p.top_k > 0 && p.top_k < n_valid;
  const bool use_p = p.top_p < 1.f;
  std::vector<int32_t> order;
  if (use_k || use_p) {
    order.reserve(size_t(n_valid));
    for (int64_t i = 0; i < V; ++i)
      if (kept[size_t(i)]) order.push_back(int32_t(i));
    const int64_t n_rank = use_k ? p.top_k : n_valid;
    std::partial_sort(order.begin(), order.begin() + n_rank, order.end(), ByScore{y.data()});
    int64_t n_keep = n_rank;
    if (use_p) {
      double Q = 0;
      for (int64_t j = 0; j < n_rank; ++j) Q += q[size_t(order[size_t(j)])];
      const double target = double(p.top_p) * Q;
      double cum = 0;
      n_keep = 0;
      while (n_keep < n_rank) {
        cum += q[size_t(order[size_t(n_keep)])];
        ++n_keep;
        if (cum >= target) break;
      }
    }
    std::fill(kept.begin(), kept.end(), 0);
    for (int64_t j = 0; j < n_keep; ++j) kept[size_t(order[size_t(j)])] = 1;
  }
  int32_t best = -1;  // top id of the ranking: argmax y, lowest id on ties
  for (int64_t i = 0; i < V; ++i)
    if (y[size_t(i)] != kNegInf && (best < 0 || y[size_t(i)] > y[size_t(best)])) best = int32_t(i);
  if (p.min_p > 0.f)
    for (int64_t i = 0; i < V; ++i)
      if (kept[size_t(i)] && q[size_t(i)] < p.min_p && i != best) kept[size_t(i)] = 0;

  double S = 0;
  int64_t last_kept = -1;
  for (int64_t i = 0; i < V; ++i)
    if (kept[size_t(i)]) { S += q[size_t(i)]; last_kept = i; }
  const double log_S = std::log(S);
  if (probs)
    for (int64_t i = 0; i < V; ++i) probs[i] = kept[size_t(i)] ? float(double(q[size_t(i)]) / S) : 0.f;

  int32_t t = best;
  if (p.temperature > 0.f) {
    const double target = double(sampling_uniform(p.key, p.pos)) * S;
    double cum = 0;
    t = int32_t(last_kept);
    for (int64_t i = 0; i < V; ++i) {
      if (!kept[size_t(i)]) continue;
      cum += q[size_t(i)];
      if (cum > target) { t = int32_t(i); break; }
    }
  }
  *token = t;
  *lp_raw = float(double(z[t]) - lse0);
  *lp_proc = float(double(y[size_t(t)]) - double(m) - log_S);

  if (n_top > 0) {
    std::vector<int32_t> scratch;
    if (!top_processed) {
      top_n(z, V, lse0, n_top, top_ids, top_lps, scratch);
    } else {
      for (int64_t i = 0; i < V; ++i)
        if (!kept[size_t(i)]) y[size_t(i)] = kNegInf;
      top_n(y.data(), V, double(m) + log_S, n_top, top_ids, top_lps, scratch);
    }
  }
}

}  // namespace

void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits, const SamplingRows& rows,
                   bool top_processed) {
  const int64_t R = logits.shape[0], V = logits.shape[1];
  const int64_t NB = rows.banned.defined() ? rows.banned.shape[1] : 0;
  const int64_t n_top = out.top_ids.defined() ? out.top_ids.shape[1] : 0;
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      RowParams p;
      p.temperature = rows.temperature.ptr<float>()[r];
      p.top_p = rows.top_p.ptr<float>()[r];
      p.top_k = rows.top_k.ptr<int32_t>()[r];
      p.min_p = rows.min_p.ptr<float>()[r];
      p.key = uint64_t(rows.rng_key.ptr<int64_t>()[r]);
      p.pos = uint64_t(rows.rng_pos.ptr<int64_t>()[r]);
      p.banned = NB ? rows.banned.ptr<int32_t>() + r * NB : nullptr;
      p.n_banned = NB;
      sample_row(logits.ptr<float>() + r * V, V, p, out.tokens.ptr<int32_t>() + r,
                 out.logprob_raw.ptr<float>() + r, out.logprob_processed.ptr<float>() + r, n_top,
                 n_top ? out.top_ids.ptr<int32_t>() + r * n_top : nullptr,
                 n_top ? out.top_logprobs.ptr<float>() + r * n_top : nullptr, top_processed,
                 out.probs.defined() ? out.probs.ptr<float>() + r * V : nullptr);
    }
  });
}

}  // namespace grpo::cpu
