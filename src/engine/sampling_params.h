// Per-request sampling parameters, validated once where a request enters the
// engine (Engine::add_request, the CLI, the HTTP server).
//
// Logprobs: every completion token carries its logprob. `logprobs_mode` picks
// the distribution reported in RequestOutput::logprobs and top_logprobs:
//   raw (default): log_softmax of the model's logits, before temperature and the
//     filters. This is what the GRPO trainer recomputes (temperature 1, full
//     vocabulary), so raw logprobs are directly comparable with the trainer's.
//   processed: the distribution actually sampled from (banned ids masked,
//     temperature, top-k, top-p, min-p; renormalised).
// Both are always computed; outputs carry both per-token arrays.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace grpo {

enum class LogprobsMode { raw, processed };
const char* logprobs_mode_name(LogprobsMode m);

struct SamplingParams {
  float temperature = 1.f;     // >= 0; 0 = greedy
  float top_p = 1.f;           // (0, 1]; 1 = off
  int top_k = 0;               // >= 0; 0 = off
  float min_p = 0.f;           // [0, 1]; 0 = off
  std::optional<uint64_t> seed;  // per-request RNG seed; unset: derived from the engine seed and request id
  int n = 1;                   // samples per prompt (sample j uses RNG key (seed, j))
  int max_tokens = 256;        // >= 1: completion tokens at most
  int min_tokens = 0;          // EOS and stop ids are banned until this many tokens exist
  std::vector<int32_t> stop_token_ids;  // finish (reason stop) when sampled; the id is kept in completion_ids
  std::vector<std::string> stop;        // stop strings on the detokenized text (needs a tokenizer);
                                        // the text is cut before the match
  bool ignore_eos = false;     // never finish on EOS (EOS stays sampleable unless min_tokens bans it)
  int top_logprobs = 0;        // >= 0: also report this many best ids per token
  LogprobsMode logprobs_mode = LogprobsMode::raw;
  int lora_slot = -1;          // >= 0: the engine's LoRA adapter slot (EngineOptions::lora_slots); -1 = EngineOptions::lora

  // Checks ranges; vocab_size > 0 also checks stop_token_ids. Messages name the field.
  Status validate(int vocab_size = 0) const;
};

}  // namespace grpo
