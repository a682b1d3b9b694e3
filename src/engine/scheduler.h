// Continuous-batching scheduler: decides, step by step, which tokens of which
// sequences go into the next forward, under a token budget
// (max_num_batched_tokens) and a sequence cap (max_num_seqs) of EngineOptions;
// enable_chunked_prefill off admits a prompt only whole (it must fit the budget).
//
// One step:
// 1. Running sequences, oldest admission first: each gets its next tokens (1 for
//    decode; the next chunk of a prefill that was cut). When blocks run out, the
//    most recently admitted running sequence is preempted by recompute: its blocks
//    are freed, n_computed drops to 0 and it goes to the FRONT of the waiting queue;
//    on resume it recomputes prompt + generated tokens (largely from the prefix
//    cache, whose freed blocks it left behind). Sequences scheduled earlier in the
//    pass are never preempted, so blocks registered this step are written this step.
// 2. If nothing was preempted, waiting sequences are admitted in FCFS order: the
//    prefix cache supplies the leading full blocks (at least one token is always
//    computed, for the logits), the rest is computed, cut to the remaining budget
//    when chunked prefill is on. Samples 2..n of a request wait until the first
//    admitted sample's prompt prefill has been scheduled in full; then they hit its
//    blocks in the prefix cache (sharing, no fork), computing only the prompt's
//    last partial block.
// The caller runs the forward, then calls on_step_done(), appends sampled tokens
// and calls finish() for sequences that end.
#pragma once
#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine_options.h"
#include "engine/sequence.h"

namespace grpo {

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int n_new = 0;       // tokens [seq->n_computed, seq->n_computed + n_new) are computed
  bool sample = false; // the step reaches the end of the known tokens: sample the next one
  // Speculative decoding (engine/speculative.h) only: the range starts here instead of at
  // seq->n_computed (a draft model's own progress), and a verify step wants logits for
  // the last 1 + n_extra_logits positions of the range (sample must be set).
  int pos0 = -1;
  int n_extra_logits = 0;
  int start() const { return pos0 >= 0 ? pos0 : seq->n_computed; }
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;  // decodes/continuations first, then admissions
  int n_tokens = 0;                // Σ n_new
  int n_sampled = 0;               // rows that need logits (Σ over sampled seqs of 1 + n_extra_logits)
  std::vector<Sequence*> preempted;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const EngineOptions& opt, BlockManager& blocks);

  // Queues a sequence (status waiting, no blocks, n_computed 0) at the back.
  void add(Sequence* seq);
  // Plans the next step; allocates the blocks it needs. Empty when nothing can run.
  SchedulerOutput schedule();
  // After the forward: n_computed += n_new for every scheduled sequence.
  void on_step_done(const SchedulerOutput& out);
  // Ends a sequence wherever it is (running or waiting) and frees its blocks.
  void finish(Sequence* seq, FinishReason reason);
  // Ends every sequence of a request wherever it is (reason abort) and frees its
  // blocks; returns them (empty, and nothing changed, when none is queued or running).
  std::vector<Sequence*> abort_request(int64_t request_id);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::deque<Sequence*>& running() const { return running_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  const EngineOptions& options() const { return opt_; }

 private:
  void preempt(Sequence* seq);
  bool must_wait_for_sibling(const Sequence* seq) const;

  EngineOptions opt_;
  BlockManager& bm_;
  std::deque<Sequence*> waiting_, running_;
  int64_t n_preemptions_ = 0;
};

}  // namespace grpo
