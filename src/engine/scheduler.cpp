// Continuous-batching scheduler (see scheduler.h for the policy).
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace grpo {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::eos: return "eos";
    case FinishReason::abort: return "abort";
  }
  return "?";
}

Scheduler::Scheduler(const EngineOptions& opt, BlockManager& blocks) : opt_(opt), bm_(blocks) {
  GRPO_CHECK(opt.max_num_seqs > 0 && opt.max_num_batched_tokens > 0);
}

void Scheduler::add(Sequence* seq) {
  GRPO_CHECK(seq->status == SeqStatus::waiting && seq->table.blocks.empty() && seq->n_computed == 0);
  GRPO_CHECK(seq->n_total() > 0);
  waiting_.push_back(seq);
}

void Scheduler::preempt(Sequence* seq) {
  GRPO_CHECK(!running_.empty() && running_.back() == seq);
  running_.pop_back();
  bm_.free(seq->table);
  seq->n_computed = 0;
  seq->status = SeqStatus::waiting;
  ++seq->n_preemptions;
  ++n_preemptions_;
  waiting_.push_front(seq);
}

bool Scheduler::must_wait_for_sibling(const Sequence* seq) const {
  const SeqGroup* g = seq->group.get();
  return bm_.prefix_caching() && g && !seq->admitted_once && g->n_admitted > 0 && !g->prompt_scheduled;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = opt_.max_num_batched_tokens;
  auto note = [&](Sequence* s, int n_new) {
    ScheduledSeq ss{s, n_new, s->n_computed + n_new == s->n_total()};
    out.seqs.push_back(ss);
    out.n_tokens += n_new;
    out.n_sampled += ss.sample ? 1 : 0;
    budget -= n_new;
    s->peak_blocks = std::max(s->peak_blocks, int(s->table.blocks.size()));
    if (s->group && s->n_computed + n_new >= s->n_prompt) s->group->prompt_scheduled = true;
  };

  // 1. Running sequences, oldest first; preempt from the back when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int n_new = std::min(s->n_total() - s->n_computed, budget);
    GRPO_CHECK_MSG(n_new > 0, "a running sequence has nothing to compute (sampled token not appended?)");
    const int target = s->n_computed + n_new;
    bool self_preempted = false;
    while (!bm_.can_append(s->table, target)) {
      Sequence* victim = running_.back();
      out.preempted.push_back(victim);
      preempt(victim);
      if (victim == s) { self_preempted = true; break; }
    }
    if (self_preempted) break;
    bm_.append(s->table, s->tokens, target, s->n_total() - s->n_spec);
    note(s, n_new);
    ++i;
  }

  // 2. Admissions, unless this step had to preempt.
  if (out.preempted.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                     int(running_.size()) < opt_.max_num_seqs;) {
      Sequence* s = *it;
      if (must_wait_for_sibling(s)) { ++it; continue; }
      const int n_hit = bm_.match_prefix(s->tokens, s->n_total() - 1, s->prefix_salt);
      int n_new = s->n_total() - n_hit;
      if (n_new > budget) {
        if (!opt_.enable_chunked_prefill) break;
        n_new = budget;
      }
      if (!bm_.can_allocate(s->tokens, n_hit, n_hit + n_new, s->prefix_salt)) break;
      bm_.allocate(s->table, s->tokens, n_hit, n_hit + n_new, s->prefix_salt);
      s->n_computed = n_hit;
      if (!s->admitted_once) {
        s->admitted_once = true;
        s->prefix_hit_tokens = n_hit;
        if (s->group) ++s->group->n_admitted;
      }
      s->status = SeqStatus::running;
      running_.push_back(s);
      it = waiting_.erase(it);
      note(s, n_new);
    }
  }
  return out;
}

void Scheduler::on_step_done(const SchedulerOutput& out) {
  for (const auto& ss : out.seqs) {
    ss.seq->n_computed += ss.n_new;
    GRPO_CHECK(ss.seq->n_computed <= ss.seq->n_total());
  }
}

void Scheduler::finish(Sequence* seq, FinishReason reason) {
  auto drop = [&](std::deque<Sequence*>& q) {
    auto it = std::find(q.begin(), q.end(), seq);
    if (it != q.end()) q.erase(it);
  };
  drop(running_);
  drop(waiting_);
  bm_.free(seq->table);
  if (seq->group) seq->group->prompt_scheduled = true;  // never leave siblings waiting on it
  seq->status = SeqStatus::finished;
  seq->finish = reason;
}

std::vector<Sequence*> Scheduler::abort_request(int64_t request_id) {
  std::vector<Sequence*> found;
  for (auto* q : {&running_, &waiting_})
    for (Sequence* s : *q)
      if (s->request_id == request_id) found.push_back(s);
  // Newest first, so blocks shared with an older sibling are released tail first.
  for (auto it = found.rbegin(); it != found.rend(); ++it) finish(*it, FinishReason::abort);
  return found;
}

}  // namespace grpo
