// Speculative decoding pieces (see speculative.h): options, prompt lookup, the cost
// model, adaptive k and the draft model's runner.
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/timer.h"
#include "model/checkpoint.h"

namespace grpo {

std::span<const EnumName<SpecMethod>> spec_method_names() {
  static constexpr EnumName<SpecMethod> names[] = {
      {"off", SpecMethod::off}, {"draft", SpecMethod::draft}, {"ngram", SpecMethod::ngram}};
  return names;
}

Result<SpecMethod> spec_method_from_string(const std::string& s) {
  if (auto m = enum_parse(spec_method_names(), s)) return *m;
  return error_status("engine.speculative.method = \"" + s + "\": must be one of " + enum_allowed(spec_method_names()) +
                      " (off, a draft model, or n-gram prompt lookup)");
}

const char* spec_method_name(SpecMethod m) { return enum_name(spec_method_names(), m); }

std::span<const EnumName<SpecAcceptance>> spec_acceptance_names() {
  static constexpr EnumName<SpecAcceptance> names[] = {{"rejection", SpecAcceptance::rejection},
                                                       {"match", SpecAcceptance::match}};
  return names;
}

Status SpeculativeOptions::validate(const std::string& prefix) const {
  auto bad = [&](const std::string& m) { return error_status(prefix + m); };
  if (method == SpecMethod::off) return ok_status();
  if (num_speculative_tokens < 1 || num_speculative_tokens > 16)
    return bad("num_speculative_tokens = " + std::to_string(num_speculative_tokens) + ": must be in [1, 16]");
  if (method == SpecMethod::ngram && (ngram_min < 1 || ngram_max < ngram_min))
    return bad("ngram_min = " + std::to_string(ngram_min) + ": need 1 <= ngram_min <= ngram_max (ngram_max = " +
               std::to_string(ngram_max) + ")");
  if (probe_every < 1) return bad("probe_every = " + std::to_string(probe_every) + ": must be >= 1");
  return ok_status();
}

Result<std::unique_ptr<ModelWeights>> spec_load_draft(const SpeculativeOptions& o, const ModelConfig& target,
                                                     int max_model_len, Context& ctx, DType dt) {
  if (o.method != SpecMethod::draft) return std::unique_ptr<ModelWeights>{};
  if (o.draft_model.empty())
    return error_status("engine.speculative.draft_model is required with engine.speculative.method = \"draft\"");
  auto w = model_load(o.draft_model, ctx.device(), dt, &ctx);
  if (!w.ok()) return w.status().with_context("engine.speculative.draft_model " + o.draft_model);
  GRPO_TRY(spec_check_draft(target, w.value().config, max_model_len));
  return std::make_unique<ModelWeights>(std::move(w).value());
}

std::vector<int32_t> spec_ngram_propose(const std::vector<int32_t>& tokens, int n_min, int n_max, int k) {
  const int N = int(tokens.size());
  for (int n = std::min(n_max, N - 1); n >= n_min; --n) {
    const int32_t* suffix = tokens.data() + (N - n);
    // Most recent earlier occurrence: start i < N − n with tokens[i, i + n) == suffix.
    for (int i = N - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int from = i + n, to = std::min(N, from + k);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

Status spec_check_draft(const ModelConfig& target, const ModelConfig& draft, int max_model_len) {
  if (target.vocab_size != draft.vocab_size)
    return error_status("engine.speculative.draft_model: its vocab_size is " + std::to_string(draft.vocab_size) +
                        " but the target's is " + std::to_string(target.vocab_size) +
                        "; a draft must share the target's vocabulary (same tokenizer)");
  if (draft.max_position_embeddings > 0 && draft.max_position_embeddings < max_model_len)
    return error_status("engine.speculative.draft_model: its max_position_embeddings (" +
                        std::to_string(draft.max_position_embeddings) + ") is shorter than the engine's context (" +
                        std::to_string(max_model_len) + "); use a draft with a longer context or lower max_model_len");
  return ok_status();
}

// ---- cost model ----

namespace {
constexpr double kForget = 0.98;  // per observation: the fit follows drifting step times
}

void SpecCostFit::add(double x, double y) {
  w_ = w_ * kForget + 1;
  sx_ = sx_ * kForget + x;
  sy_ = sy_ * kForget + y;
  sxx_ = sxx_ * kForget + x * x;
  sxy_ = sxy_ * kForget + x * y;
  x_min_ = std::min(x_min_, x);
  x_max_ = std::max(x_max_, x);
}

bool SpecCostFit::ready() const { return w_ >= 3 && x_max_ > x_min_; }

double SpecCostFit::predict(double x) const {
  if (w_ <= 0) return 0;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double vxx = sxx_ / w_ - mx * mx;
  // Slope clamped at 0: more tokens never make a forward cheaper.
  const double b = vxx > 1e-12 ? std::max(0.0, (sxy_ / w_ - mx * my) / vxx) : 0.0;
  return std::max(0.0, my + b * (x - mx));
}

SpecAdaptive::SpecAdaptive(int k_max, int probe_every)
    : k_max_(k_max), probe_every_(probe_every), alpha_(size_t(k_max) + 1, 0.8) {}

void SpecAdaptive::observe(int k, int accepted) {
  constexpr double kDecay = 0.95;
  for (int j = 1; j <= k && j <= accepted + 1; ++j) {
    const double hit = j <= accepted ? 1.0 : 0.0;
    alpha_[size_t(j)] = kDecay * alpha_[size_t(j)] + (1 - kDecay) * hit;
  }
}

double SpecAdaptive::observe_seq(double alpha, int k, int accepted) {
  // Requests are short-lived: a fast EMA, seeded by the first outcome.
  constexpr double kDecay = 0.8;
  for (int j = 1; j <= k && j <= accepted + 1; ++j) {
    const double hit = j <= accepted ? 1.0 : 0.0;
    alpha = alpha < 0 ? hit : kDecay * alpha + (1 - kDecay) * hit;
  }
  return alpha;
}

int SpecAdaptive::choose(int n_decode, bool has_draft) {
  const std::vector<int> k = plan(std::vector<double>(size_t(std::max(0, n_decode)), -1.0), has_draft);
  return k.empty() ? 0 : *std::max_element(k.begin(), k.end());
}

// Plans considered: the m sequences of highest expected acceptance draft k tokens each, the
// others none, for every k in [1, k_max] and m in [1, B]. With n = m · k drafts the step costs
//   t_target(B + n)                       one verify forward over every scheduled token
//   + t_draft(B) + (k − 1) · t_draft(m)   draft round 1 (every sequence: it keeps the draft's
//                                         cache in step, so plain decoding pays it too) and
//                                         k − 1 proposal rounds over the m drafting sequences
// and emits Σ_s E_s(k_s) tokens. The plan with the most tokens per second wins if it beats
// plain decoding (B tokens in t_target(B) [+ t_draft(B)]) by 2%, so noise in the fits does
// not flip a step to a loss. Larger batches make the verify forward compute-bound (the fit's
// slope b grows relative to its intercept a), which is how batch size lowers k.
std::vector<int> SpecAdaptive::plan(const std::vector<double>& alpha, bool has_draft) {
  ++steps_;
  ++since_spec_;
  const int B = int(alpha.size());
  std::vector<int> ks(size_t(B), 0);
  if (B == 0) return ks;
  // Until both fits have seen two batch shapes, draft at full k (that also calibrates).
  if (!target.ready() || (has_draft && !draft.ready())) {
    since_spec_ = 0;
    std::fill(ks.begin(), ks.end(), k_max_);
    return ks;
  }
  // gain[s][k-1]: expected extra tokens of sequence s from k drafts.
  auto gain = [&](size_t s, int k) {
    double e = 0, run = 1;
    for (int j = 1; j <= k; ++j) {
      run *= alpha[s] >= 0 ? alpha[s] : alpha_[size_t(j)];
      e += run;
    }
    return e;
  };
  std::vector<size_t> order(static_cast<size_t>(B));
  for (size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::vector<double> a1(static_cast<size_t>(B));
  for (size_t s = 0; s < a1.size(); ++s) a1[s] = alpha[s] >= 0 ? alpha[s] : alpha_[1];
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return a1[x] > a1[y]; });
  const double round1 = has_draft ? draft.predict(B) : 0.0;
  const double plain_rate = double(B) / std::max(target.predict(B) + round1, 1e-12);
  double best_rate = plain_rate * 1.02;
  int best_k = 0, best_m = 0;
  for (int k = 1; k <= k_max_; ++k) {
    double e = B;
    for (int m = 1; m <= B; ++m) {
      e += gain(order[size_t(m - 1)], k);
      double cost = target.predict(double(B + m * k)) + round1;
      if (has_draft) cost += (k - 1) * draft.predict(m);
      const double rate = e / std::max(cost, 1e-12);
      if (rate > best_rate) {
        best_rate = rate;
        best_k = k;
        best_m = m;
      }
    }
  }
  if (best_k == 0 && since_spec_ >= probe_every_) {  // probe: keep the acceptance estimates alive
    best_k = 1;
    best_m = B;
  }
  for (int m = 0; m < best_m; ++m) ks[order[size_t(m)]] = best_k;
  if (best_k > 0) since_spec_ = 0;
  return ks;
}

// ---- draft runner ----

SpecDraft::SpecDraft(Context& ctx, const ModelWeights& draft, EngineOptions eo, EngineGeometry geo) : ctx_(ctx) {
  if (geo.kv_dtype != DType::f8e4m3) geo.kv_dtype = draft.dtype;
  // Round 1 carries the target's tokens minus its drafts plus at most one catch-up token per sequence.
  eo.max_num_batched_tokens += eo.max_num_seqs;
  geo.max_logit_rows = 0;
  max_seqs_ = eo.max_num_seqs;
  k_max_ = eo.speculative.num_speculative_tokens;
  runner_ = std::make_unique<ModelRunner>(ctx, draft, eo, geo);
}

void SpecDraft::keep_distributions(bool on) {
  keep_q_ = on;
  if (!on || q_.defined()) return;
  q_ = tensor_zeros(ctx_.device(), DType::f32, {int64_t(k_max_) * max_seqs_, int64_t(runner_->vocab_size())});
}

SpecDraft::~SpecDraft() = default;

void SpecDraft::run_round(const SchedulerOutput& round, const std::vector<RowSampling>& rows, int j) {
  const double t0 = now_seconds();
  GRPO_CHECK(j < k_max_ && int(rows.size()) <= max_seqs_);
  Tensor qj;
  if (keep_q_) qj = q_.slice0(int64_t(j) * max_seqs_, int64_t(j + 1) * max_seqs_);
  runner_->execute(round, rows, sampled_, keep_q_ ? &qj : nullptr);
  if (fit) fit->add(double(round.n_tokens), now_seconds() - t0);
}

}  // namespace grpo
