// Speculative decoding pieces (see speculative.h): options, prompt lookup, the cost
// model, adaptive k and the draft model's runner.
#include "engine/speculative.h"

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/gather.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

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

// ---- step times ----

namespace {
constexpr double kTimeDecay = 0.8;  // per sample of a bucket: step times drift (context grows)
}

int SpecStepTimes::bucket_of(double size) { return int(std::floor(4.0 * std::log2(std::max(size, 1.0)))); }

void SpecStepTimes::add(double size, double seconds) {
  const int i = bucket_of(size);
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), i, [](const auto& e, int k) { return e.first < k; });
  if (it == buckets_.end() || it->first != i) it = buckets_.insert(it, {i, Bucket{}});
  Bucket& b = it->second;
  // The first sample of a bucket is replaced by the second: first launches carry one-off
  // costs (lazy kernel loading, workspace growth) that would otherwise bias a fresh bucket.
  if (b.n <= 1) {
    b.size = size;
    b.seconds = seconds;
  } else {
    b.size = kTimeDecay * b.size + (1 - kTimeDecay) * size;
    b.seconds = kTimeDecay * b.seconds + (1 - kTimeDecay) * seconds;
  }
  ++b.n;
}

bool SpecStepTimes::measured(double size, int min_samples) const {
  const int i = bucket_of(size);
  for (const auto& [k, b] : buckets_)
    if (k == i) return b.n >= min_samples;
  return false;
}

double SpecStepTimes::predict(double size) const {
  if (buckets_.empty()) return 0;
  // Piecewise linear through the buckets' (size, seconds) points, in bucket order. A binary
  // search: the adaptive plan predicts B·k sizes every step (2,048 at 512 sequences), and a
  // scan of every bucket made that a tenth of a millisecond per step. A bucket's size EMA
  // stays inside its bucket, so the sizes ascend with the buckets.
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), size,
                             [](const std::pair<int, Bucket>& e, double x) { return e.second.size < x; });
  if (it == buckets_.end()) {
    // Up to twice the largest measured size, the slope of the last two buckets (a step of a
    // few hundred rows is latency-bound: rows cost little until the GPU fills); past that,
    // proportional to size from there (never cheaper per token). So a plan may grow into
    // sizes not yet measured, by at most a doubling, and is measured when it runs.
    const Bucket& last = buckets_.back().second;
    const double cap = 2 * std::max(last.size, 1e-12);
    double slope = last.seconds / std::max(last.size, 1e-12);
    if (buckets_.size() >= 2) {
      const Bucket& prev = std::prev(buckets_.end(), 2)->second;
      slope = std::max(0.0, (last.seconds - prev.seconds) / std::max(last.size - prev.size, 1e-12));
    }
    const double at_cap = last.seconds + slope * (cap - last.size);
    return size <= cap ? last.seconds + slope * (size - last.size) : at_cap * (size / cap);
  }
  if (it == buckets_.begin()) return it->second.seconds;
  const Bucket& lo = std::prev(it)->second;
  const Bucket& hi = it->second;
  const double t = (size - lo.size) / std::max(hi.size - lo.size, 1e-12);
  return lo.seconds + std::clamp(t, 0.0, 1.0) * (hi.seconds - lo.seconds);
}

SpecAdaptive::SpecAdaptive(int k_max, int probe_every)
    : k_max_(k_max),
      probe_every_(probe_every),
      probe_interval_(probe_every),
      alpha_(size_t(k_max) + 1, 0.8),
      n_obs_(size_t(k_max) + 1, 0) {}

void SpecAdaptive::add_overhead(double seconds) {
  constexpr double kDecay = 0.9;
  overhead_ = overhead_seen_ ? kDecay * overhead_ + (1 - kDecay) * seconds : seconds;
  overhead_seen_ = true;
}

void SpecAdaptive::observe(int k, int accepted) {
  // A bias-corrected EMA: the mean of the first 20 observations, then decay 0.95, so the
  // 0.8 it starts from is gone after the first outcomes (sequences relax toward it).
  constexpr double kDecay = 0.95;
  for (int j = 1; j <= k && j <= accepted + 1; ++j) {
    const double hit = j <= accepted ? 1.0 : 0.0;
    const double w = std::max(1 - kDecay, 1.0 / double(++n_obs_[size_t(j)]));
    alpha_[size_t(j)] = (1 - w) * alpha_[size_t(j)] + w * hit;
  }
}

double SpecAdaptive::observe_seq(double alpha, int k, int accepted, double prior) {
  // Requests are short-lived: a fast EMA, starting from the engine-wide estimate, so that one
  // early miss cannot drop α to 0, which would keep the sequence from drafting for good.
  constexpr double kDecay = 0.8;
  if (alpha < 0) alpha = std::clamp(prior, 0.0, 1.0);
  for (int j = 1; j <= k && j <= accepted + 1; ++j) {
    const double hit = j <= accepted ? 1.0 : 0.0;
    alpha = kDecay * alpha + (1 - kDecay) * hit;
  }
  return alpha;
}

double SpecAdaptive::relax_seq(double alpha, double prior) {
  // 10% a step: a streak of misses (a run of digits the draft cannot guess) weighs for about
  // ten idle steps; a sequence's α is not measured while it does not draft.
  constexpr double kRelax = 0.1;
  if (alpha < 0) return alpha;
  return alpha + kRelax * (std::clamp(prior, 0.0, 1.0) - alpha);
}

// Plans considered: every sequence that can draft (cap > 0, α > 0: m of the B) drafts
// min(k, cap) tokens, for every k in [1, k_max], or none drafts. Plans that draft for a subset
// of the batch are not considered: the batch's rollout ends with its slowest sequence, so
// speeding up some sequences saves little while every drafting step costs more than a plain
// one (docs/speculative.md, Adaptive k, has the measurements). With n = m · k drafts the step
// costs
//   verify(B + n)              one target forward over every scheduled token (a CUDA-graph
//                              replay up to 512 rows)
//   + draft(m + lag)           draft round 1: one token per sequence, plus a quarter of the
//                              tokens the draft has not seen since they last drafted (catch_up):
//                              paid once, the catch-up serves the drafting steps that follow
//                              (the measurements behind the quarter: docs/speculative.md)
//   + draft(m) · (k − 1)       k − 1 proposal rounds over the m drafting sequences
//   + overhead                 the rest of a drafting step (add_overhead)
// and emits Σ_s E_s(k_s) tokens, against plain decoding's B tokens in plain(B): measured times
// of the plain engine's whole step at this batch size (a CUDA-graph replay), which is what
// k = 0 runs. At large B decode is no longer weight-bandwidth-bound, verify(B + n) grows with n,
// and the comparison turns drafting off there even at high acceptance. A plan must beat plain
// decoding by 2%, so noise in the measurements does not flip a step to a loss.
std::vector<int> SpecAdaptive::decide(const std::vector<double>& alpha, bool has_draft, const std::vector<int>& k_cap,
                                     const std::vector<int>& catch_up, int64_t since_spec, Branch* branch) const {
  const int B = int(alpha.size());
  std::vector<int> ks(size_t(B), 0);
  *branch = Branch::unmeasured;
  if (B == 0) return ks;
  auto cap = [&](size_t s) { return k_cap.empty() ? k_max_ : std::min(k_max_, k_cap[s]); };
  // Probes draft for the n sequences of best acceptance, at most k_probe each.
  auto probe = [&](Branch b, int n_seqs, int k_probe) {
    *branch = b;
    std::vector<size_t> by(static_cast<size_t>(B));
    for (size_t s = 0; s < by.size(); ++s) by[s] = s;
    auto a0 = [&](size_t s) { return alpha[s] >= 0 ? alpha[s] : alpha_[1]; };
    std::stable_sort(by.begin(), by.end(), [&](size_t x, size_t y) { return a0(x) > a0(y); });
    for (size_t i = 0, n = 0; i < by.size() && n < size_t(n_seqs); ++i)
      if ((ks[by[i]] = std::min(k_probe, cap(by[i]))) > 0) ++n;
    return ks;
  };
  // The warm-up measures full-k drafting for up to kWarmupSeqs sequences, then for the whole
  // batch (a verify forward of B·(k + 1) tokens and the draft model's catch-up of every context:
  // a few plain steps' time, once; without it the verify cost of whole-batch plans would be an
  // extrapolation, which over-estimated it about 2.5× at 64 sequences). A probe
  // while drafting is off re-measures acceptance cheaply: k <= kProbeK drafts for the
  // kProbeSeqs sequences with the best acceptance.
  // kWarmupWholeMax: the second warm-up step drafts the whole batch up to this many sequences
  // (128 · (k + 1) rows: the verify graphs' 512-row range at k = 3; a GRPO batch of 512 would
  // cost an eager verify of 2,560 rows and a catch-up of every context).
  constexpr int kWarmupSeqs = 8, kWarmupWholeMax = 128, kProbeSeqs = 8, kProbeK = 2;
  constexpr double kCatchUpShare = 0.25;  // of round 1's catch-up tokens charged to this step (below)
  if (has_draft && !draft_can_pay()) {
    *branch = Branch::plain;
    return ks;
  }
  // Warm-up: two samples of plain decoding at this batch size (a new size is measured by
  // running plain), then two full-k drafting steps (kWarmupSeqs) before the first decision.
  if (!plain.measured(B, 2)) {
    *branch = Branch::unmeasured;
    return ks;
  }
  if (warmup_probes_ > 0 || verify.empty() || (has_draft && draft.empty()))
    return probe(Branch::warmup_probe, warmup_probes_ == 1 ? std::min(B, kWarmupWholeMax) : kWarmupSeqs, k_max_);
  // gain: expected extra tokens of sequence s from k drafts.
  auto gain = [&](size_t s, int k) {
    double e = 0, run = 1;
    for (int j = 1; j <= std::min(k, cap(s)); ++j) {
      run *= alpha[s] >= 0 ? alpha[s] : alpha_[size_t(j)];
      e += run;
    }
    return e;
  };
  // The sequences that can draft: a cap above 0 and acceptance above 0.
  std::vector<size_t> elig;
  double lag = 0;  // round 1's tokens beyond one per drafting sequence (the draft's catch-up)
  for (size_t s = 0; s < size_t(B); ++s) {
    if (cap(s) <= 0 || (alpha[s] >= 0 ? alpha[s] : alpha_[1]) <= 0) continue;
    elig.push_back(s);
    if (s < catch_up.size()) lag += std::max(0, catch_up[s] - 1);
  }
  lag *= kCatchUpShare;
  const double m = double(elig.size());
  const double plain_t = std::max(plain.predict(B), 1e-12);
  const double plain_rate = double(B) / plain_t;
  double best_rate = plain_rate * 1.02;
  int best_k = 0;
  for (int k = 1; k <= k_max_ && !elig.empty(); ++k) {
    double e = B;
    for (size_t s : elig) e += gain(s, k);
    double cost = verify.predict(double(B) + m * k) + overhead_;
    if (has_draft) cost += draft.predict(m + lag) + (k - 1) * draft.predict(m);
    // A drafting step does a plain step's work and more: measurement noise must not make
    // it look cheaper (it would then "win" with no accepted drafts at all).
    cost = std::max(cost, plain_t);
    const double rate = e / std::max(cost, 1e-12);
    if (log_level() <= LogLevel::debug && !catch_up.empty())
      GRPO_LOG_DEBUG("speculative plan: B %d, k %d: %.1f tokens expected, %.3f ms (verify %.3f, draft round 1 "
                     "%.3f with %.0f catch-up tokens, later rounds %.3f), %.3f x plain (%.3f ms)",
                     B, k, e, 1e3 * cost, 1e3 * verify.predict(double(B) + m * k),
                     has_draft ? 1e3 * draft.predict(m + lag) : 0.0, lag, has_draft ? 1e3 * draft.predict(m) : 0.0,
                     rate / plain_rate, 1e3 * plain_t);
    if (rate > best_rate) {
      best_rate = rate;
      best_k = k;
    }
  }
  if (best_k > 0) {
    *branch = Branch::draft;
    for (size_t s : elig) ks[s] = std::min(best_k, cap(s));
    return ks;
  }
  if (since_spec >= probe_interval_) return probe(Branch::interval_probe, kProbeSeqs, kProbeK);
  *branch = Branch::plain;
  return ks;
}

bool SpecAdaptive::draft_can_pay() const {
  const double best = double(k_max_ + 1) / (1.0 + double(k_max_) * draft_ratio_);  // increasing in k
  return best >= 1.05;
}

double spec_draft_read_ratio(const ModelConfig& target, const ModelConfig& draft, int64_t draft_head_rows) {
  auto read = [](const ModelConfig& c, int64_t head_rows) {
    const double table = double(c.vocab_size) * double(c.hidden_size);
    const double embed = c.tie_word_embeddings ? 0.0 : table;
    // A kept-rows head reads head_rows rows instead of the whole table (tied: the table is the head).
    const double head = head_rows > 0 ? table - double(head_rows) * double(c.hidden_size) : 0.0;
    return std::max(1.0, double(c.n_params()) - embed - head);
  };
  return read(draft, draft_head_rows) / read(target, 0);
}

Status spec_resolve_draft_vocab(SpeculativeOptions& o, int vocab_size) {
  if (o.draft_vocab.empty() || !o.draft_vocab_ids.empty()) return ok_status();
  const std::string key = "engine.speculative.draft_vocab = \"" + o.draft_vocab + "\": ";
  auto text = read_file(o.draft_vocab);
  if (!text.ok()) return error_status(key + text.status().message() + " (a JSON array of token ids; `grpo draft-vocab` writes one)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.value());
  } catch (const std::exception& e) {
    return error_status(key + "invalid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("token_ids")) j = j["token_ids"];
  if (!j.is_array() || j.empty())
    return error_status(key + "expected a non-empty JSON array of token ids, or an object whose \"token_ids\" is one");
  std::vector<int32_t> ids;
  std::vector<char> seen(size_t(std::max(0, vocab_size)), 0);
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer())
      return error_status(key + "entry " + std::to_string(i) + " is not an integer token id");
    const int64_t id = j[i].get<int64_t>();
    if (id < 0 || id >= vocab_size)
      return error_status(key + "token id " + std::to_string(id) + " (entry " + std::to_string(i) +
                          ") is outside the vocabulary [0, " + std::to_string(vocab_size) +
                          "); was the file made with another tokenizer?");
    if (seen[size_t(id)]) return error_status(key + "token id " + std::to_string(id) + " appears twice");
    seen[size_t(id)] = 1;
    ids.push_back(int32_t(id));
  }
  if (o.draft_vocab_size > 0) {
    if (size_t(o.draft_vocab_size) > ids.size())
      return error_status("engine.speculative.draft_vocab_size = " + std::to_string(o.draft_vocab_size) + ": the file " +
                          o.draft_vocab + " holds only " + std::to_string(ids.size()) +
                          " ids; lower it or make a larger file (grpo draft-vocab --size)");
    ids.resize(size_t(o.draft_vocab_size));
  }
  std::sort(ids.begin(), ids.end());
  o.draft_vocab_ids = std::move(ids);
  return ok_status();
}

std::vector<int> SpecAdaptive::plan(const std::vector<double>& alpha, bool has_draft, const std::vector<int>& k_cap,
                                    const std::vector<int>& catch_up) {
  ++since_spec_;
  Branch b;
  std::vector<int> ks = decide(alpha, has_draft, k_cap, catch_up, since_spec_, &b);
  switch (b) {
    case Branch::unmeasured:
      break;
    case Branch::plain:
      // The first decision after the warm-up probes went against drafting: they count as
      // lost probes, so the first interval probe comes later.
      if (!decided_) probe_interval_ = std::min(probe_every_ * 2, probe_every_ * 256);
      decided_ = true;
      break;
    case Branch::warmup_probe:
      warmup_probes_ = std::max(0, warmup_probes_ - 1);
      since_spec_ = 0;
      break;
    case Branch::draft:
      decided_ = true;
      probe_interval_ = probe_every_;
      since_spec_ = 0;
      break;
    case Branch::interval_probe:
      // Each probe that drafting does not follow quadruples the wait for the next one: a
      // lost probe costs a few plain steps, so their share of the run shrinks geometrically.
      probe_interval_ = std::min(probe_interval_ * 4, probe_every_ * 256);
      since_spec_ = 0;
      break;
  }
  return ks;
}

std::vector<int> SpecAdaptive::preview(const std::vector<double>& alpha, bool has_draft,
                                      const std::vector<int>& k_cap, const std::vector<int>& catch_up) const {
  Branch b;
  return decide(alpha, has_draft, k_cap, catch_up, since_spec_ + 1, &b);
}

// ---- draft runner ----

SpecDraft::SpecDraft(Context& ctx, const ModelWeights& draft, EngineOptions eo, EngineGeometry geo) : ctx_(ctx) {
  const ModelWeights* run_w = &draft;
  if (const std::vector<int32_t>& ids = eo.speculative.draft_vocab_ids; !ids.empty()) {
    const int64_t V = draft.config.vocab_size, n = int64_t(ids.size());
    GRPO_CHECK_MSG(std::is_sorted(ids.begin(), ids.end()) && ids.front() >= 0 && ids.back() < V &&
                       std::adjacent_find(ids.begin(), ids.end()) == ids.end(),
                   "speculative: draft_vocab_ids must be ascending, distinct ids of the vocabulary");
    head_ids_ = ids;
    head_col_.assign(size_t(V), -1);
    for (int64_t c = 0; c < n; ++c) head_col_[size_t(ids[size_t(c)])] = int32_t(c);
    head_w_ = draft;
    head_w_.config.vocab_size = int(n);
    head_w_.lm_head = tensor_empty(ctx.device(), draft.dtype, {n, int64_t(draft.config.hidden_size)});
    Tensor idx = tensor_empty(ctx.device(), DType::i32, {n});
    tensor_copy(idx, tensor_borrow(head_ids_.data(), DType::i32, Device::cpu, {n}));
    gather_rows_forward(ctx, head_w_.lm_head, draft.lm_head, idx);
    q_index_ = tensor_empty(ctx.device(), DType::i32, {V});
    tensor_copy(q_index_, tensor_borrow(head_col_.data(), DType::i32, Device::cpu, {V}));
    head_ids_dev_ = tensor_empty(ctx.device(), DType::i32, {n});
    tensor_copy(head_ids_dev_, tensor_borrow(head_ids_.data(), DType::i32, Device::cpu, {n}));
    ctx.synchronize();  // idx is freed on return
    run_w = &head_w_;
  }
  if (geo.kv_dtype != DType::f8e4m3) geo.kv_dtype = draft.dtype;
  // Round 1 carries catch-up tokens (bounded by the engine's planning to the target's step
  // budget) plus one token per drafting sequence.
  eo.max_num_batched_tokens += eo.max_num_seqs;
  max_round_tokens_ = eo.max_num_batched_tokens;
  geo.max_logit_rows = 0;
  max_seqs_ = eo.max_num_seqs;
  k_max_ = eo.speculative.num_speculative_tokens;
  runner_ = std::make_unique<ModelRunner>(ctx, *run_w, eo, geo);
  // Round 1's catch-up tokens replay the decode graphs (GRPO_DRAFT_CATCHUP_GRAPHS=0: eager, to compare).
  const char* e = std::getenv("GRPO_DRAFT_CATCHUP_GRAPHS");
  runner_->set_graph_short_chunks(!(e && std::string(e) == "0"));
  // Rounds chain on the device with one wait at the end (GRPO_DRAFT_CHAIN=0: a wait per round, to compare).
  const char* c = std::getenv("GRPO_DRAFT_CHAIN");
  chain_on_ = !(c && std::string(c) == "0");
}

void SpecDraft::keep_distributions(bool on) {
  keep_q_ = on;
  if (!on || q_.defined()) return;
  q_ = tensor_zeros(ctx_.device(), DType::f32, {int64_t(k_max_) * max_seqs_, int64_t(runner_->vocab_size())});
}

SpecDraft::~SpecDraft() = default;

void SpecDraft::run_round(const SchedulerOutput& round, std::vector<RowSampling>& rows, int j) {
  GRPO_CHECK(j < k_max_ && int(rows.size()) <= max_seqs_);
  const int64_t R = int64_t(rows.size());
  Tensor qj;
  if (keep_q_) qj = q_.slice0(int64_t(j) * max_seqs_, int64_t(j + 1) * max_seqs_);
  if (!head_ids_.empty())
    for (RowSampling& r : rows) {
      std::vector<int32_t> cols;
      for (int32_t id : r.banned)
        if (id >= 0 && size_t(id) < head_col_.size() && head_col_[size_t(id)] >= 0) cols.push_back(head_col_[size_t(id)]);
      r.banned = std::move(cols);
    }
  if (!chain_.defined()) chain_ = tensor_zeros(ctx_.device(), DType::i32, {int64_t(k_max_) * max_seqs_});
  Tensor dst = chain_.slice0(int64_t(j) * max_seqs_, int64_t(j) * max_seqs_ + R);
  if (j > 0) runner_->set_next_tokens(chain_.slice0(int64_t(j - 1) * max_seqs_, int64_t(j - 1) * max_seqs_ + R));
  runner_->forward(round);
  if (chain_on_ && runner_->sample_rows_async(rows, keep_q_ ? &qj : nullptr)) {
    const Tensor ids = runner_->sampled_tokens(R);  // columns with a draft vocabulary
    if (!head_ids_.empty()) gather_ids(ctx_, dst, head_ids_dev_, ids);
    else runner_->copy_ids(dst, ids);
    return;
  }
  // The general sampler (bitwise logprobs, or GRPO_DRAFT_CHAIN=0): a wait, then the ids go up again.
  runner_->sample_rows(rows, sampled_, keep_q_ ? &qj : nullptr);
  std::vector<int32_t> h;
  for (const SampledRow& r : sampled_) h.push_back(head_ids_.empty() ? r.token : head_ids_[size_t(r.token)]);
  tensor_copy(dst, tensor_borrow(h.data(), DType::i32, Device::cpu, {R}));
}

void SpecDraft::finish_rounds(const std::vector<int>& live) {
  const int64_t n = int64_t(live.size()) * max_seqs_;
  h_chain_.resize(size_t(n));
  Tensor host = tensor_borrow(h_chain_.data(), DType::i32, Device::cpu, {n});
  runner_->download_ids(host, chain_.slice0(0, n));
}

}  // namespace grpo
