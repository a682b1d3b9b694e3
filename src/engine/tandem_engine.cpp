// Engine::step with tandem decoding (engine/tandem.h): the partner's phase (prompt ranges and
// the sequences whose next token may be the partner's, each caught up first), then the trained
// model's (every scheduled range, extended by the partner's new token where the trained model
// may write the one after), then the commits.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/timer.h"
#include "engine/engine.h"

namespace grpo {

namespace {

// One sampled sequence of the step.
struct TandemRow {
  size_t seq = 0;       // index into the step's seqs
  int i = 0;            // the completion index it samples first
  int prev_owner = -1;  // owner of token i − 1 (-1: i = 0)
  int32_t prev_token = 0;
  uint64_t key = 0;     // tandem_key
  bool have_partner = false;
  SampledRow partner;   // the partner's sample of token i
  bool partner_first = false;  // the partner's token i was emitted before the trained phase
  bool extended = false;       // the trained range also takes token i and samples token i + 1
  int t_row = -1;              // the trained model's logits row that predicts token i
  std::vector<SampledRow> emit;  // tokens emitted this step, in order
};

}  // namespace

std::vector<RequestOutput> Engine::step_tandem(std::vector<TokenEvent>* events) {
  std::vector<RequestOutput> done;
  SchedulerOutput out = schedule_step();
  if (out.empty()) {
    GRPO_CHECK_MSG(!scheduler_->has_work(), "engine: requests are queued but none can be scheduled");
    return done;
  }
  const TandemOptions& to = tandem_->options();
  double now = now_seconds();
  std::vector<TandemRow> rows;
  for (size_t k = 0; k < out.seqs.size(); ++k) {
    Sequence& s = *out.seqs[k].seq;
    if (s.t_first_scheduled < 0) s.t_first_scheduled = now;
    ++s.n_engine_steps;
    // Admitted (again): the prefix-cache hit holds prompt blocks, which both pools computed.
    if (s.partner_computed < 0) s.partner_computed = s.n_computed;
    if (!out.seqs[k].sample) continue;
    TandemRow r;
    r.seq = k;
    r.i = s.n_completion();
    r.prev_owner = s.model_mask.empty() ? -1 : int(s.model_mask.back());
    r.prev_token = s.tokens.back();
    r.key = tandem_key(to.seed, s.rng_key);
    rows.push_back(std::move(r));
  }

  // 1. The partner: prompt ranges as scheduled (both pools must hold every prompt block), then
  // every decoding sequence from where its pool stops, sampled where its token may be the
  // partner's, within the step's token budget (a longer catch-up, after preemption, continues
  // next step). Catching up every sequence every step keeps each one's range at the one or two
  // tokens of the last step, which the decode graphs replay (a lagging sequence's longer range
  // would make the whole forward eager, H200: 1.6x the vanilla step instead of 1.36x).
  ModelRunner& partner = tandem_->partner();
  int budget = opt_.max_num_batched_tokens;
  for (const ScheduledSeq& ss : out.seqs)
    if (ss.start() < ss.seq->n_prompt) budget -= ss.n_new;
  SchedulerOutput pout;
  std::vector<RowSampling> prows;
  std::vector<size_t> prow_of;  // rows[] index of each sampled partner row
  for (size_t k = 0, ri = 0; k < out.seqs.size(); ++k) {
    const ScheduledSeq& ss = out.seqs[k];
    Sequence& s = *ss.seq;
    TandemRow* r = ss.sample ? &rows[ri++] : nullptr;
    const int end = ss.start() + ss.n_new;
    const bool prompt = ss.start() < s.n_prompt;
    const bool need = r && tandem_may_need(to, r->key, r->i, r->prev_owner, false);
    if (!prompt && !need && s.partner_computed >= end) continue;
    ScheduledSeq ps;
    ps.seq = &s;
    if (prompt) {
      GRPO_CHECK_MSG(s.partner_computed == ss.start(), "tandem: the partner's pool lags inside a prompt");
      ps.pos0 = ss.start();
      ps.n_new = ss.n_new;
    } else {
      ps.pos0 = need ? std::min(s.partner_computed, end - 1) : s.partner_computed;  // a sample needs the last row
      ps.n_new = std::min(end - ps.pos0, budget);
      if (ps.n_new <= 0) continue;
      budget -= ps.n_new;
    }
    ps.sample = need && ps.pos0 + ps.n_new == end;
    pout.seqs.push_back(ps);
    pout.n_tokens += ps.n_new;
    if (ps.sample) {
      ++pout.n_sampled;
      prows.push_back(row_sampling(s, r->i));
      prow_of.push_back(size_t(r - rows.data()));
    }
  }
  if (!pout.empty()) {
    std::vector<SampledRow> psampled;
    partner.forward(pout);
    partner.sample_rows(prows, psampled);
    for (const ScheduledSeq& ps : pout.seqs) ps.seq->partner_computed = ps.start() + ps.n_new;
    for (size_t j = 0; j < prow_of.size(); ++j) {
      rows[prow_of[j]].partner = std::move(psampled[j]);
      rows[prow_of[j]].have_partner = true;
    }
  }

  // 2. Tokens the partner's sample decides alone are emitted now; where the trained model may
  // write the next token, its range takes the new token too (when a block slot and the token
  // budget allow), so that it samples that one in this step as well.
  for (TandemRow& r : rows) {
    if (!r.have_partner) continue;
    if (tandem_resolve(to, r.key, r.i, r.prev_owner, r.prev_token, nullptr, &r.partner.token) != 0) continue;
    ScheduledSeq& ss = out.seqs[r.seq];
    Sequence& s = *ss.seq;
    r.partner_first = true;
    r.partner.by_trained = false;
    on_token(s, r.partner, now);  // its logprob_trained comes from the trained phase
    if (s.finish != FinishReason::none || !tandem_may_need(to, r.key, r.i + 1, 0, true)) continue;
    if (out.n_tokens >= opt_.max_num_batched_tokens || !blocks_->can_append(s.table, s.n_total())) continue;
    blocks_->append(s.table, s.tokens, s.n_total(), s.n_prompt);
    ++ss.n_new;
    ss.n_extra_logits = 1;
    ++out.n_tokens;
    ++out.n_sampled;
    r.extended = true;
  }

  // 3. The trained model over every scheduled range; its logits score every emitted token.
  // Each row is scored at its own sample and at the partner's token (where there is one).
  std::vector<RowSampling> trows;
  std::vector<int32_t> given;
  for (TandemRow& r : rows) {
    const Sequence& s = *out.seqs[r.seq].seq;
    r.t_row = int(trows.size());
    trows.push_back(row_sampling(s, r.i));
    given.push_back(r.have_partner ? r.partner.token : 0);
    if (r.extended) {
      trows.push_back(row_sampling(s, r.i + 1));
      given.push_back(0);
    }
  }
  std::vector<SampledRow> tsampled;
  std::vector<float> lp_own, lp_given;
  runner_->forward(out);
  runner_->sample_and_score(trows, given, tsampled, lp_own, lp_given);
  auto trained_row = [&](size_t t) {
    SampledRow e = tsampled[t];
    e.logprob_trained = lp_own[t];
    return e;
  };
  for (TandemRow& r : rows) {
    const size_t t = size_t(r.t_row);
    r.partner.logprob_trained = r.have_partner ? lp_given[t] : 0.f;
    r.partner.by_trained = false;
    if (r.partner_first) {
      r.emit.push_back(r.partner);
      if (r.extended &&
          tandem_resolve(to, r.key, r.i + 1, 0, r.partner.token, &tsampled[t + 1].token, nullptr) == 1)
        r.emit.push_back(trained_row(t + 1));
      continue;
    }
    const int owner = tandem_resolve(to, r.key, r.i, r.prev_owner, r.prev_token, &tsampled[t].token,
                                     r.have_partner ? &r.partner.token : nullptr);
    if (owner == 1) r.emit.push_back(trained_row(t));
    if (owner == 0) r.emit.push_back(r.partner);
  }

  // 4. Commits. A sequence whose trained range reached its last token (nothing emitted after
  // it) gives that token back, so that the next step has a token to compute and logits to sample.
  scheduler_->on_step_done(out);
  ++stats_.steps;
  stats_.tokens_computed += out.n_tokens;
  stats_.preemptions = scheduler_->n_preemptions();
  stats_.graph_replays = runner_->n_graph_replays() + tandem_->n_graph_replays();
  now = now_seconds();
  for (TandemRow& r : rows) {
    Sequence& s = *out.seqs[r.seq].seq;
    if (r.i == 0) stats_.prefix_hit_tokens += s.prefix_hit_tokens;
    if (!r.emit.empty()) ++s.engine_steps;
    TokenEvent* ev = nullptr;
    for (size_t j = 0; j < r.emit.size(); ++j) {
      const SampledRow& e = r.emit[j];
      if (j == 0 && r.partner_first) s.logprobs_trained[size_t(r.i)] = e.logprob_trained;
      else on_token(s, e, now);
      ++stats_.tokens_generated;
      ev = add_event(s, e, events);
      if (s.finish != FinishReason::none) break;
      after_token(s, ev, now, done);  // streams the text that became final
    }
    if (s.finish != FinishReason::none) {
      after_token(s, ev, now, done);  // s is gone from here
      continue;
    }
    if (s.n_computed >= s.n_total()) s.n_computed = s.n_total() - 1;
  }
  return done;
}

}  // namespace grpo
