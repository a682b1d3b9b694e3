// Engine::step with speculative decoding (engine/speculative.h): plan drafts, schedule,
// propose, verify in one target forward, commit the accepted run and roll back the rest.
#include <algorithm>
#include <cstdint>
#include <unordered_set>

#include "core/check.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine.h"

namespace grpo {

std::vector<RequestOutput> Engine::step_speculative(std::vector<TokenEvent>* events) {
  const double t_step = now_seconds();
  std::vector<RequestOutput> done;
  const SpeculativeOptions& so = opt_.speculative;

  // 1. Plan: decode-ready running sequences get k draft slots (n-gram: the proposal
  // itself; draft model: placeholders filled after scheduling), within the step's token
  // budget and the blocks left after every running sequence's plain next token, so that
  // drafting never preempts or chunks anything. A draft model's round 1 must also fit its
  // sequences' catch-up tokens.
  int pending = 0, spare_blocks = blocks_->n_free();
  std::vector<Sequence*> ready;                 // decode-ready, in running order
  std::vector<double> ready_alpha;
  std::vector<int> ready_cap;                   // drafts each could have at most
  std::vector<int> ready_lag;                   // draft model: tokens its round 1 runs for each
  std::vector<std::vector<int32_t>> ready_prop; // n-gram proposals
  for (Sequence* s : scheduler_->running()) {
    pending += s->n_total() - s->n_computed;
    spare_blocks -= std::max(0, blocks_->blocks_for(s->n_total()) - int(s->table.blocks.size()));
    if (s->n_computed != s->n_total() - 1) continue;
    ready.push_back(s);
    ready_alpha.push_back(s->spec_alpha);
    // Drafts past the length limit could never be emitted.
    int cap = std::min({so.num_speculative_tokens, s->params.max_tokens - s->n_completion() - 1,
                        s->max_total - s->n_total() - 1});
    if (draft_ && s->n_total() - s->draft_computed + cap > draft_->max_round_tokens()) cap = 0;
    ready_cap.push_back(std::max(0, cap));
    if (draft_) ready_lag.push_back(s->n_total() - s->draft_computed);
  }
  bool ngram_looked = false;  // proposals were computed this step
  if (so.method == SpecMethod::ngram) {
    // Prompt lookup: a proposal caps its sequence's k at its length. Proposals are computed
    // only for the sequences the adaptive plan would let draft with full-length proposals
    // (none while it would not draft at all, the 8 of a probe), so plain steps cost what
    // plain ones do and a probe does not bring every sequence's index up to date (the index
    // catches up on the tokens it missed when its sequence drafts).
    // After proposals the plan turned down (too few sequences had a match for drafting to
    // pay), the next 1, 2, 4, .. 64 steps skip them and run plain: with whole-batch plans the
    // preview's full-length caps can promise a win every step that the matches then do not
    // give, and each such step looks up every sequence (at 64 greedy sequences on a random
    // target prompt lookup drafted 1 of 128 steps and ran 0.95× plain, H200; this backoff
    // is not measured on the GPU yet).
    if (so.adaptive && ngram_skip_ > 0) {
      --ngram_skip_;
      return step_plain(events);
    }
    const std::vector<int> wants = so.adaptive ? adapt_->preview(ready_alpha, false, ready_cap) : ready_cap;
    for (size_t i = 0; i < ready.size(); ++i) {
      Sequence* s = ready[i];
      const bool look = wants[i] > 0 && ready_cap[i] > 0;
      ngram_looked |= look;
      ready_prop.push_back(look ? s->ngram.propose(s->tokens, so.ngram_min, so.ngram_max, ready_cap[i])
                                : std::vector<int32_t>{});
      ready_cap[i] = int(ready_prop.back().size());
    }
  }
  int spare_tokens = opt_.max_num_batched_tokens - pending;
  int draft_tokens = draft_ ? draft_->max_round_tokens() : 0;
  std::vector<int> k_plan = so.adaptive ? adapt_->plan(ready_alpha, draft_ != nullptr, ready_cap, ready_lag) : ready_cap;
  std::vector<Sequence*> planned;
  int catch_up_tokens = 0;  // the draft's round-1 tokens and later rounds' (the debug log)
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence* s = ready[i];
    int k = std::min({k_plan[i], ready_cap[i], spare_tokens});
    if (k <= 0) {
      if (so.adaptive && k_plan[i] <= 0) s->spec_alpha = SpecAdaptive::relax_seq(s->spec_alpha, adapt_->alpha(1));
      continue;
    }
    const int catch_up = s->n_total() - s->draft_computed;
    if (draft_ && catch_up + k > draft_tokens) continue;
    const int held = std::max(int(s->table.blocks.size()), blocks_->blocks_for(s->n_total()));
    while (k > 0 && blocks_->blocks_for(s->n_total() + k) - held > spare_blocks) --k;
    if (k <= 0) continue;
    spare_blocks -= blocks_->blocks_for(s->n_total() + k) - held;
    spare_tokens -= k;
    if (draft_) draft_tokens -= catch_up + k;
    catch_up_tokens += draft_ ? catch_up + k : 0;
    if (so.method == SpecMethod::ngram) s->tokens.insert(s->tokens.end(), ready_prop[i].begin(), ready_prop[i].begin() + k);
    else s->tokens.insert(s->tokens.end(), size_t(k), 0);
    s->n_spec = k;
    planned.push_back(s);
  }
  // k = 0 everywhere: the plain engine's step (its CUDA graphs and sampler); a draft model
  // lags and catches up the next time it drafts.
  if (planned.empty()) {
    if (ngram_looked && so.adaptive) ngram_skip_ = ngram_backoff_ = std::min(64, std::max(1, 2 * ngram_backoff_));
    return step_plain(events);
  }
  ngram_backoff_ = 0;

  auto strip = [](Sequence* s) {
    if (s->n_spec == 0) return;
    s->tokens.resize(size_t(s->n_total() - s->n_spec));
    s->n_spec = 0;
  };
  SchedulerOutput out = scheduler_->schedule();
  auto after_schedule = [&](const SchedulerOutput& o) {
    std::unordered_set<const Sequence*> in_step;
    for (const ScheduledSeq& ss : o.seqs) in_step.insert(ss.seq);
    for (Sequence* s : planned)
      if (!in_step.count(s)) strip(s);
    for (Sequence* s : o.preempted) s->draft_computed = 0;  // its K/V is gone from both pools
  };
  after_schedule(out);
  if (out.empty() && !out.preempted.empty()) {
    out = scheduler_->schedule();  // admissions wait a pass after preemption
    after_schedule(out);
  }
  if (out.empty()) {
    GRPO_CHECK_MSG(!scheduler_->has_work(), "engine: requests are queued but none can be scheduled");
    return done;
  }
  for (ScheduledSeq& ss : out.seqs) {
    if (ss.seq->n_spec == 0) continue;
    GRPO_CHECK_MSG(ss.sample && ss.n_new == ss.seq->n_spec + 1, "engine: a speculative range was cut by the scheduler");
    ss.n_extra_logits = ss.seq->n_spec;
    out.n_sampled += ss.seq->n_spec;
  }

  double now = now_seconds();
  for (const auto& ss : out.seqs)
    if (ss.seq->t_first_scheduled < 0) ss.seq->t_first_scheduled = now;

  // Speculative sampling applies to drafted sequences at temperature > 0; greedy rows keep the
  // match rule, which is the same test there (p is a point mass at the argmax).
  bool rejection = false;
  if (so.acceptance == SpecAcceptance::rejection)
    for (const ScheduledSeq& ss : out.seqs) rejection |= ss.seq->n_spec > 0 && ss.seq->params.temperature > 0.f;
  if (rejection && !spec_p_.defined())
    spec_p_ = tensor_zeros(ctx_.device(), DType::f32,
                           {int64_t(opt_.max_num_seqs) * (so.num_speculative_tokens + 1), int64_t(w_.config.vocab_size)});
  if (draft_) draft_->keep_distributions(rejection);

  // 2. Proposals of the draft model (also keeps its pool in step with the target's).
  if (draft_) {
    draft_->round_seconds = 0;
    draft_->propose(out, [&](const Sequence& s, int j) {
      RowSampling r = row_sampling(s, s.n_completion() - s.n_spec + j);
      r.n_top = 0;
      return r;
    });
  }

  // 3. Verify: the target samples every position of each range with plain decoding's counters.
  std::vector<RowSampling> rows;
  std::vector<int> old_nc;
  for (const auto& ss : out.seqs) {
    old_nc.push_back(ss.seq->n_computed);
    if (!ss.sample) continue;
    const int c0 = ss.seq->n_completion() - ss.seq->n_spec;
    for (int j = 0; j <= ss.seq->n_spec; ++j) rows.push_back(row_sampling(*ss.seq, c0 + j));
  }
  std::vector<SampledRow> sampled;
  const double t0 = now_seconds();
  runner_->execute(out, rows, sampled, rejection ? &spec_p_ : nullptr);
  // Speculative sampling's test at every draft position of the rows at temperature > 0
  // (positions after a sequence's first rejection are tested too and ignored: one launch).
  std::vector<SpecVerifyRow> vrows;
  std::vector<size_t> vfirst(out.seqs.size(), SIZE_MAX);  // first vrows entry of each sequence
  if (rejection) {
    size_t r = 0;
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSeq& ss = out.seqs[i];
      if (!ss.sample) continue;
      const Sequence& s = *ss.seq;
      const int k = s.n_spec, c0 = s.n_completion() - k;
      if (k > 0 && s.params.temperature > 0.f) {
        vfirst[i] = vrows.size();
        for (int j = 0; j < k; ++j) {
          SpecVerifyRow v;
          v.p_row = int(r) + j;
          v.q_row = draft_ ? s.spec_q_rows[size_t(j)] : -1;
          v.draft = s.tokens[size_t(s.n_total() - k + j)];
          v.rng_key = rows[r + size_t(j)].rng_key;
          v.rng_pos = uint64_t(c0 + j);
          vrows.push_back(v);
        }
      }
      r += size_t(k) + 1;
    }
  }
  std::vector<SpecVerifyResult> vres;
  if (!vrows.empty())
    runner_->spec_verify_rows(spec_p_, draft_ ? draft_->q() : Tensor{}, vrows, vres,
                              draft_ ? draft_->q_index() : Tensor{});
  const double t_verify = now_seconds() - t0;
  adapt_->verify.add(double(out.n_tokens), t_verify);
  scheduler_->on_step_done(out);
  ++stats_.steps;
  stats_.tokens_computed += out.n_tokens;
  stats_.preemptions = scheduler_->n_preemptions();
  stats_.graph_replays = runner_->n_graph_replays();
  bool any_spec = false;

  // 4. Commit the accepted run plus the target's own next sample; roll back the rest.
  now = now_seconds();
  size_t r = 0;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& ss = out.seqs[i];
    Sequence& s = *ss.seq;
    if (!ss.sample) continue;
    const int k = s.n_spec;
    if (s.n_completion() - k == 0) stats_.prefix_hit_tokens += s.prefix_hit_tokens;
    ++s.engine_steps;
    std::vector<int32_t> drafts(s.tokens.end() - k, s.tokens.end());
    strip(&s);
    // The emitted run: accepted drafts, then the target's token at the first rejection (its
    // seeded sample, or speculative sampling's residual draw), or after all k the target's
    // own sample. Logprobs are always the target's at that position; top-n lists too.
    int acc = 0;
    std::vector<SampledRow> run;
    if (vfirst[i] != SIZE_MAX) {
      const SpecVerifyResult* v = vres.data() + vfirst[i];
      while (acc < k && v[acc].accepted) ++acc;
      for (int j = 0; j <= acc; ++j) {
        SampledRow row = sampled[r + size_t(j)];
        if (j < k) {
          row.token = v[j].token;
          row.logprob_raw = v[j].logprob_raw;
          row.logprob_processed = v[j].logprob_processed;
        }
        run.push_back(std::move(row));
      }
    } else {
      while (acc < k && sampled[r + size_t(acc)].token == drafts[size_t(acc)]) ++acc;
      run.assign(sampled.begin() + std::ptrdiff_t(r), sampled.begin() + std::ptrdiff_t(r) + acc + 1);
    }
    int emitted = 0;
    TokenEvent* ev = nullptr;  // the last emitted token's (events only)
    for (int j = 0; j <= acc; ++j) {
      on_token(s, run[size_t(j)], now);
      ++emitted;
      ++stats_.tokens_generated;
      ev = add_event(s, run[size_t(j)], events);
      if (s.finish != FinishReason::none) break;
      after_token(s, ev, now, done);  // streams the text that became final
    }
    r += size_t(k) + 1;
    if (k > 0) {
      any_spec = true;
      const int acc_emitted = std::min(acc, emitted);
      s.spec_proposed += k;
      s.spec_accepted += acc_emitted;
      if (int(s.spec_proposed_by_pos.size()) < k) {
        s.spec_proposed_by_pos.resize(size_t(k), 0);
        s.spec_accepted_by_pos.resize(size_t(k), 0);
      }
      for (int j = 0; j < k; ++j) ++s.spec_proposed_by_pos[size_t(j)];
      for (int j = 0; j < acc_emitted; ++j) ++s.spec_accepted_by_pos[size_t(j)];
      stats_.spec_proposed += k;
      stats_.spec_accepted += acc_emitted;
      adapt_->observe(k, acc);
      s.spec_alpha = SpecAdaptive::observe_seq(s.spec_alpha, k, acc, adapt_->alpha(1));
    }
    if (s.finish != FinishReason::none) {
      after_token(s, ev, now, done);  // s is gone from here
      continue;
    }
    if (k == 0) continue;
    // K/V is valid for the committed tokens before the last one (which the next step computes).
    s.n_computed = old_nc[i] + emitted;
    GRPO_CHECK(s.n_computed == s.n_total() - 1);
    // The draft wrote positions up to old_nc + k − 1 (round 1 up to the last committed
    // token, then d_1..d_{k−1}); its K/V is valid up to the last accepted one.
    if (draft_) s.draft_computed = std::min(s.n_computed, old_nc[i] + k);
    blocks_->truncate(s.table, s.n_total());
  }
  GRPO_CHECK(r == sampled.size());
  if (any_spec) ++stats_.spec_steps;
  const double t_total = now_seconds() - t_step, t_draft = draft_ ? draft_->round_seconds : 0.0;
  adapt_->add_overhead(std::max(0.0, t_total - t_verify - t_draft));
  if (log_level() <= LogLevel::debug) {
    GRPO_LOG_DEBUG("speculative step: %zu ready, %zu drafting, %d catch-up + draft tokens, %d verified rows; "
                   "draft %.3f ms, verify %.3f ms, step %.3f ms",
                   ready.size(), planned.size(), catch_up_tokens, out.n_tokens, 1e3 * t_draft, 1e3 * t_verify,
                   1e3 * t_total);
  }
  return done;
}

}  // namespace grpo
