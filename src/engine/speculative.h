// Speculative decoding: a cheap proposer guesses the next k tokens of a sequence and
// the target model checks all k + 1 positions in one forward (a multi-token chunk over
// its paged KV), so one engine step can emit up to k + 1 tokens.
//
// Proposers:
//   draft : a second model with the same vocabulary (any size / architecture), with its
//           own paged KV pool indexed by the SAME block tables (the tandem layout,
//           engine/tandem.h). The draft runs only in steps where its sequence drafts:
//           first the committed tokens it has not seen (lazy catch-up, see Rollback),
//           then k − 1 more one-token draft steps propose d_1..d_k. The draft samples with the target's RNG key and counter for the
//           same completion position, under the same sampling settings. The rounds chain on
//           the device: each round's input ids are the previous round's samples (mapped from
//           draft-vocabulary columns by gather_ids), and the host reads all proposals after
//           the last round with one wait (GRPO_DRAFT_CHAIN=0: a wait per round).
//   ngram : prompt lookup: the longest n in [ngram_min, ngram_max] whose last-n-token
//           suffix occurred earlier in the sequence (most recent occurrence) proposes the
//           tokens that followed it. No model.
//
// Verification: the target samples every verified position j with the RNG counter plain
// decoding would use there (completion index), its own processed distribution (temperature,
// top-k, top-p, min-p, banned ids) and its own logits. Then, per SpeculativeOptions::acceptance:
//   rejection (rows at temperature > 0): speculative sampling (kernels/spec_verify.h). d_{j+1}
//     is kept with probability min(1, p(d)/q(d)) (q: the draft's processed distribution, or a
//     point mass for n-gram proposals); the first rejection emits a draw from
//     norm(max(0, p − q)). Emitted tokens follow p exactly; acceptance is 1 − TV(p, q).
//   match (and greedy rows always): d_{j+1} is kept iff it equals the target's own sample at
//     position j; the first mismatch emits that sample. Outputs equal plain decoding's token
//     for token, for any k; a draft model samples with the same uniform (inverse CDF in id
//     order), a coupling whose acceptance is at most 1 − TV(p, q).
// When all k are kept the target's own sample after d_k is emitted too. Raw and processed
// logprobs (and top-n lists) of every emitted token are the target's at its position.
//
// Rollback: rejected positions are dropped from the sequence; n_computed moves back to
// the committed tokens and blocks past the committed length are returned; the draft's
// draft_computed moves back to its accepted positions. Speculative tokens are never hashed
// into the prefix cache (BlockManager::append's n_register). The draft pool is not trusted
// for prefix-cache hits (a block may have been filled while the draft lagged): a sequence
// starts, and restarts after preemption, with draft_computed = 0.
//
// Adaptive k (SpecAdaptive::plan): per step the engine picks one k in [0, k_max] for the
// whole batch (each decode-ready sequence drafts min(k, its cap); a subset never drafts alone:
// the batch ends with its slowest sequence) to maximise expected emitted tokens per second of
// the step. A sequence's expected tokens are E_s(k) = 1 + Σ_{j≤k} α_s^j with α_s its own EMA of
// per-position acceptance (until measured: 1 + Σ_{j≤k} Π_{i≤j} α_i, the engine-wide EMA
// by draft position). Step costs are measured wall times, not a model: an EMA per size
// bucket of plain decode steps (by batch size; CUDA-graph replays), of verify forwards (by
// tokens) and of draft rounds (by tokens). k = 0 everywhere whenever no plan beats plain
// decoding by 2%; the engine then runs the step as the plain engine does (Engine::step_plain:
// no verify pass, no draft forward). The draft model lags behind and catches up lazily:
// Sequence::draft_computed counts the positions its pool holds, and the next drafting step
// runs the missing tokens through the draft in one batched prefill (round 1). While a
// sequence does not draft, its α_s relaxes toward the engine-wide α (10% a step), so a
// streak of misses does not keep it from drafting for the rest of its life. The warm-up
// (two steps after plain decoding is measured) drafts full k for up to 8 sequences, then for
// the whole batch up to 128. While off,
// a probe step (k ≤ 2 for the 8 sequences of best acceptance) re-measures α and the
// verify cost; the probe interval starts at probe_every (2·probe_every when the first
// decision after the warm-up is plain) and quadruples after every probe that does not make
// drafting win, so a workload where drafting loses converges to plain decoding's speed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/timer.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace grpo {

// SpecMethod and SpeculativeOptions ([engine.speculative]) live in engine/engine_options.h.
// "engine.speculative.method = ...: must be one of ..." for an unknown name.
Result<SpecMethod> spec_method_from_string(const std::string& s);
const char* spec_method_name(SpecMethod m);  // canonical name (spec_method_names())

// Prompt lookup: up to k tokens proposed for `tokens` (empty when no suffix of length
// in [n_min, n_max] occurred earlier).
std::vector<int32_t> spec_ngram_propose(const std::vector<int32_t>& tokens, int n_min, int n_max, int k);

// Checks that a draft model can propose for the target (same vocabulary, long enough
// context). Errors say what differs.
Status spec_check_draft(const ModelConfig& target, const ModelConfig& draft, int max_model_len);

// Loads the draft model of method draft (nullptr for the other methods) on ctx's device
// in dtype dt, checked against the target (spec_check_draft). Errors name
// engine.speculative.draft_model.
Result<std::unique_ptr<ModelWeights>> spec_load_draft(const SpeculativeOptions& o, const ModelConfig& target,
                                                     int max_model_len, Context& ctx, DType dt);

// Reads o.draft_vocab (a JSON array of token ids, or an object whose "token_ids" is one, as
// `grpo draft-vocab` writes), keeps the first o.draft_vocab_size (0: all) and stores them in
// ascending order in o.draft_vocab_ids; nothing to do when draft_vocab is empty or the ids are
// already resolved. Errors name engine.speculative.draft_vocab and say what is wrong (a missing
// file, an id outside [0, vocab_size), a repeated id).
Status spec_resolve_draft_vocab(SpeculativeOptions& o, int vocab_size);

// Measured wall time of one kind of step, by size (batch size or tokens): an EMA of size and
// seconds per bucket of four per octave. predict() is piecewise linear through the buckets'
// points; past the largest, up to twice its size, it follows the last two buckets' slope, and
// beyond that scales by size (never cheaper per token); below the smallest it keeps that
// bucket's time.
class SpecStepTimes {
 public:
  void add(double size, double seconds);
  // Measured at least `min_samples` times in size's bucket.
  bool measured(double size, int min_samples = 1) const;
  bool empty() const { return buckets_.empty(); }
  double predict(double size) const;

 private:
  struct Bucket {
    int n = 0;
    double size = 0, seconds = 0;  // EMAs
  };
  static int bucket_of(double size);
  std::vector<std::pair<int, Bucket>> buckets_;  // sorted by bucket index
};

class SpecAdaptive {
 public:
  SpecAdaptive(int k_max, int probe_every);
  // k per decode-ready sequence from its own acceptance EMA (alpha[s] < 0: not measured yet,
  // the engine-wide per-position α is used); k_cap[s] (optional): drafts s can have at most
  // (prompt lookup: its proposal's length). catch_up[s] (optional, draft models): tokens the
  // draft must run for s before it can propose (Sequence::draft_computed's lag, at least 1).
  // All zeros = run a plain step. See plan() in speculative.cpp for the rule.
  std::vector<int> plan(const std::vector<double>& alpha, bool has_draft, const std::vector<int>& k_cap = {},
                        const std::vector<int>& catch_up = {});
  // What plan() with these caps would return this step, without counting the step. With
  // caps at their upper bound it tells which sequences' proposals are worth computing at all
  // (prompt lookup: its index upkeep), all zeros when none is.
  std::vector<int> preview(const std::vector<double>& alpha, bool has_draft, const std::vector<int>& k_cap = {},
                           const std::vector<int>& catch_up = {}) const;
  // Outcome of one verified sequence: it proposed k and the first `accepted` matched.
  void observe(int k, int accepted);
  // A sequence's own acceptance EMA (Sequence::spec_alpha; < 0 = none yet: it starts from
  // prior, the engine-wide α of position 1) after such an outcome.
  static double observe_seq(double alpha, int k, int accepted, double prior);
  // A sequence that did not draft this step: its own EMA moves a step toward the engine-wide
  // α (prior), so stale evidence fades and a sequence whose α fell after a few misses drafts
  // again later without waiting for a probe.
  static double relax_seq(double alpha, double prior);
  SpecStepTimes plain;   // whole plain decode steps (scheduling to commit), by batch size
  SpecStepTimes verify;  // target verify forwards (with sampling and the acceptance test), by tokens
  SpecStepTimes draft;   // draft rounds, by tokens
  // The rest of a drafting step's wall time (scheduling, proposals' bookkeeping, commits,
  // rollback): an EMA over drafting steps, added to every drafting plan's cost, so that
  // plans compare whole steps with whole plain steps.
  void add_overhead(double seconds);
  double overhead() const { return overhead_; }
  double alpha(int pos) const { return alpha_[size_t(pos)]; }
  int probe_interval() const { return probe_interval_; }
  // The draft model's weights read per decoded token over the target's (spec_draft_read_ratio),
  // a lower bound on a draft round's cost in plain decode steps: a verify forward costs at least
  // a plain step, so k drafts emit at best k + 1 tokens for 1 + k·ratio steps. When that bound
  // is below 1.05 for every k, drafting cannot pay even at full acceptance and the engine never
  // drafts: no warm-up, no probes (a draft as large as the target).
  void set_draft_read_ratio(double ratio) { draft_ratio_ = ratio; }
  bool draft_can_pay() const;

 private:
  enum class Branch { unmeasured, plain, warmup_probe, draft, interval_probe };
  std::vector<int> decide(const std::vector<double>& alpha, bool has_draft, const std::vector<int>& k_cap,
                          const std::vector<int>& catch_up, int64_t since_spec, Branch* branch) const;
  int k_max_, probe_every_, probe_interval_, warmup_probes_ = 2;
  bool decided_ = false;  // a decision after the warm-up probes was made
  std::vector<double> alpha_;
  std::vector<int64_t> n_obs_;  // observations behind each alpha_ (bias-corrected EMA)
  int64_t since_spec_ = 0;
  double overhead_ = 0;
  bool overhead_seen_ = false;
  double draft_ratio_ = 0;
};

// Bytes of weights a decode token reads in `draft` over those in `target` (parameters less an
// untied input embedding, of which a token reads one row). draft_head_rows > 0: the draft's LM
// head keeps only that many rows (a draft vocabulary).
double spec_draft_read_ratio(const ModelConfig& target, const ModelConfig& draft, int64_t draft_head_rows = 0);

class Tokenizer;

// The draft model's runner and the per-step draft rounds (method draft).
class SpecDraft {
 public:
  // eo, geo: the target runner's options and geometry (the draft gets the same pool shape
  // in its own KV dtype).
  SpecDraft(Context& ctx, const ModelWeights& draft, EngineOptions eo, EngineGeometry geo);
  ~SpecDraft();
  // Round 1 over the drafting sequences (n_spec > 0) of the step: each one's missing
  // committed tokens (from Sequence::draft_computed, the lazy catch-up) up to its last
  // committed token, whose logits propose d_1; then k − 1 one-token rounds. Writes the
  // proposals into the placeholders and advances draft_computed past the committed tokens.
  // rows_of(seq, j): sampling settings of the sequence's committed completion index + j.
  template <class RowsOf>
  void propose(const SchedulerOutput& step, RowsOf&& rows_of);
  // Tokens round 1 may carry in all (catch-up included).
  int max_round_tokens() const { return max_round_tokens_; }
  size_t kv_bytes_per_block() const { return runner_->kv_bytes_per_block(); }
  // Speculative sampling needs q: from now on every round keeps its rows' processed
  // distributions (draft position j of a sequence: row Sequence::spec_q_rows[j] of q()).
  // on = false: the next rounds skip it (a step without rows at temperature > 0).
  void keep_distributions(bool on);
  const Tensor& q() const { return q_; }
  // With a draft vocabulary (SpeculativeOptions::draft_vocab_ids): q() has one column per kept
  // id and q_index() maps every token id to its column (-1: not kept), spec_verify's q_index.
  // Empty otherwise.
  const Tensor& q_index() const { return q_index_; }
  // Rows of the draft's LM head (the vocabulary size, or the draft vocabulary's).
  int64_t head_rows() const { return runner_->vocab_size(); }

 private:
  // Round j: the forward (rounds j >= 1 take their input tokens from round j - 1's samples on
  // the device), the sampler (q rows kept when asked) and the sampled ids into row j of chain_,
  // without waiting for the device where the runner allows (else one wait per round).
  void run_round(const SchedulerOutput& round, std::vector<RowSampling>& rows, int j);
  // Reads chain_'s rows of the rounds (live[j] sequences in round j) into h_chain_.
  void finish_rounds(const std::vector<int>& live);
  Context& ctx_;
  // With a draft vocabulary the runner runs head_w_: the draft's weights with an LM head of the
  // kept ids' rows (config.vocab_size = their count); it samples a column, run_round maps it
  // back to the token id (head_ids_) and banned ids to columns (head_col_).
  ModelWeights head_w_;
  std::vector<int32_t> head_ids_, head_col_;
  Tensor q_index_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<SampledRow> sampled_;
  int max_seqs_ = 0, k_max_ = 0, max_round_tokens_ = 0;
  bool keep_q_ = false;
  Tensor q_;  // (k_max · max_seqs, V) f32: round j's rows from row j · max_seqs (empty: not kept)
  Tensor chain_;          // (k_max · max_seqs) i32: round j's proposed ids from j · max_seqs
  Tensor head_ids_dev_;   // head_ids_ on the device (a draft vocabulary)
  std::vector<int32_t> h_chain_;
  bool chain_on_ = true;

 public:
  SpecStepTimes* times = nullptr;  // receives (tokens, seconds) of every draft round
  double round_seconds = 0;        // seconds of the rounds since the caller last zeroed it
};

template <class RowsOf>
void SpecDraft::propose(const SchedulerOutput& step, RowsOf&& rows_of) {
  std::vector<Sequence*> spec;
  for (const ScheduledSeq& ss : step.seqs)
    if (ss.seq->n_spec > 0) spec.push_back(ss.seq);
  if (spec.empty()) return;
  // Longest drafts first, so that every round's sequences are a prefix of the previous round's
  // (rows i of round j take their input token from row i of round j - 1's samples on the device).
  std::stable_sort(spec.begin(), spec.end(), [](const Sequence* a, const Sequence* b) { return a->n_spec > b->n_spec; });
  const double t0 = now_seconds();
  std::vector<int> live;  // sequences of each round
  SchedulerOutput round;
  std::vector<RowSampling> rows;
  for (Sequence* s : spec) {
    const int committed = s->n_total() - s->n_spec;
    ScheduledSeq d;
    d.seq = s;
    d.pos0 = s->draft_computed;
    d.n_new = committed - s->draft_computed;
    d.sample = true;
    rows.push_back(rows_of(*s, 0));
    round.seqs.push_back(d);
    round.n_tokens += d.n_new;
    ++round.n_sampled;
    s->draft_computed = committed;
  }
  const int round1_tokens = round.n_tokens;  // catch-up included
  run_round(round, rows, 0);
  live.push_back(int(spec.size()));
  for (int j = 1; j < spec.front()->n_spec; ++j) {
    round = SchedulerOutput{};
    rows.clear();
    for (Sequence* s : spec) {
      if (s->n_spec <= j) break;  // sorted: the rest draft fewer
      const int committed = s->n_total() - s->n_spec;
      ScheduledSeq d;
      d.seq = s;
      d.pos0 = committed + j - 1;  // d_j's position: its logits propose d_{j+1}
      d.n_new = 1;
      d.sample = true;
      round.seqs.push_back(d);
      ++round.n_tokens;
      ++round.n_sampled;
      rows.push_back(rows_of(*s, j));
    }
    run_round(round, rows, j);
    live.push_back(int(round.seqs.size()));
  }
  // One wait for every round's proposals.
  finish_rounds(live);
  for (size_t j = 0; j < live.size(); ++j)
    for (int i = 0; i < live[j]; ++i) {
      Sequence* s = spec[size_t(i)];
      s->tokens[size_t(s->n_total() - s->n_spec) + j] = h_chain_[j * size_t(max_seqs_) + size_t(i)];
      if (j == 0) s->spec_q_rows.clear();
      s->spec_q_rows.push_back(int(j) * max_seqs_ + i);
    }
  const double dt = now_seconds() - t0;
  if (times)
    for (size_t j = 0; j < live.size(); ++j) times->add(double(j == 0 ? round1_tokens : live[j]), dt / double(live.size()));
  round_seconds += dt;
}

}  // namespace grpo
