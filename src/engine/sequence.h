// One sequence (one sample of a request) as the scheduler and engine see it:
// its tokens (prompt, then completion), how many of them have K/V in the cache,
// its block table, and the per-sample record the engine fills while decoding.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/block_manager.h"
#include "engine/ngram_index.h"
#include "engine/sampling_params.h"

namespace grpo {

struct LoraWeights;  // model/lora.h

enum class SeqStatus { waiting, running, finished };
enum class FinishReason { none, stop, length, eos, abort };
const char* finish_reason_name(FinishReason r);

// Shared by the n samples of one request: the first admitted sample prefills the
// prompt; its siblings wait until that prefill has been scheduled in full and then
// take the prompt's full blocks from the prefix cache.
struct SeqGroup {
  int n_admitted = 0;         // samples admitted at least once
  bool prompt_scheduled = false;  // some sample's scheduled range has covered the whole prompt
};

struct Sequence {
  int64_t seq_id = 0;
  int64_t request_id = 0;
  int sample_index = 0;                 // j in [0, n)
  std::vector<int32_t> tokens;          // prompt, then completion
  int n_prompt = 0;
  int max_total = 0;                    // finish with reason length when tokens reach this
  int n_computed = 0;                   // leading tokens whose K/V are in the cache
  SeqStatus status = SeqStatus::waiting;
  FinishReason finish = FinishReason::none;
  BlockTable table;
  std::shared_ptr<SeqGroup> group;      // may be null (scheduler tests)
  uint64_t prefix_salt = 0;             // prefix-cache namespace (BlockManager::match_prefix): the LoRA slot + 1
  const LoraWeights* lora = nullptr;    // adapter its rows run with (null: the base alone)

  // Scheduling record.
  int prefix_hit_tokens = 0;            // cached tokens at the first admission
  int n_preemptions = 0;
  int peak_blocks = 0;                  // most blocks held at once
  bool admitted_once = false;

  // Engine record (unused by the scheduler).
  SamplingParams params;
  uint64_t rng_key = 0;
  std::vector<float> logprobs_raw, logprobs_processed;  // per completion token
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::vector<uint8_t> model_mask;      // tandem decoding: per completion token, 1 = the trained model wrote it
  std::vector<float> logprobs_trained;  // tandem decoding: the trained model's logprob of each completion token
  // Speculative decoding (engine/speculative.h): n_spec trailing ids of `tokens` are
  // drafts under verification this step (not committed); the draft model's pool holds
  // K/V of positions [0, draft_computed) (it catches up lazily when the sequence drafts).
  int n_spec = 0;
  int draft_computed = 0;
  NgramIndex ngram;                     // prompt lookup over the committed tokens (method ngram)
  double spec_alpha = -1;               // adaptive k: EMA of this sample's per-position acceptance (< 0: none yet)
  std::vector<int> spec_q_rows;         // speculative sampling: the draft's q row of each draft position (SpecDraft::q)
  int64_t spec_proposed = 0, spec_accepted = 0, engine_steps = 0;
  std::vector<int64_t> spec_accepted_by_pos, spec_proposed_by_pos;  // per draft position
  std::string text;                     // detokenized completion (stop strings cut)
  size_t text_checked = 0;              // bytes of text already scanned for stop strings
  int n_engine_steps = 0;               // engine steps that scheduled this sequence (prefill chunks and decodes)
  size_t text_emitted = 0;              // bytes of text already reported in TokenEvents
  double t_arrival = 0, t_first_scheduled = -1, t_first_token = -1, t_finished = -1;

  int n_total() const { return int(tokens.size()); }
  int n_completion() const { return int(tokens.size()) - n_prompt; }
  bool finished() const { return status == SeqStatus::finished; }
};

}  // namespace grpo
