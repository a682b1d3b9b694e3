// Validation of SamplingParams at the engine boundary.
#include "engine/sampling_params.h"

#include <cmath>

namespace grpo {

const char* logprobs_mode_name(LogprobsMode m) { return m == LogprobsMode::raw ? "raw" : "processed"; }

Status SamplingParams::validate(int vocab_size) const {
  auto bad = [](const std::string& m) { return error_status("sampling params: " + m); };
  if (!std::isfinite(temperature) || temperature < 0.f)
    return bad("temperature must be >= 0 (0 = greedy), got " + std::to_string(temperature));
  if (!(top_p > 0.f && top_p <= 1.f)) return bad("top_p must be in (0, 1] (1 = off), got " + std::to_string(top_p));
  if (top_k < 0) return bad("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (lora_slot < -1) return bad("lora_slot must be >= 0 (an adapter slot) or -1 (the default), got " + std::to_string(lora_slot));
  if (!(min_p >= 0.f && min_p <= 1.f)) return bad("min_p must be in [0, 1] (0 = off), got " + std::to_string(min_p));
  if (n < 1) return bad("n (samples per prompt) must be >= 1, got " + std::to_string(n));
  if (max_tokens < 1) return bad("max_tokens must be >= 1, got " + std::to_string(max_tokens));
  if (min_tokens < 0 || min_tokens > max_tokens)
    return bad("min_tokens must be in [0, max_tokens=" + std::to_string(max_tokens) + "], got " +
               std::to_string(min_tokens));
  if (top_logprobs < 0) return bad("top_logprobs must be >= 0, got " + std::to_string(top_logprobs));
  if (vocab_size > 0 && top_logprobs > vocab_size)
    return bad("top_logprobs (" + std::to_string(top_logprobs) + ") exceeds the vocabulary size " +
               std::to_string(vocab_size));
  for (int32_t id : stop_token_ids)
    if (id < 0 || (vocab_size > 0 && id >= vocab_size))
      return bad("stop token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                 std::to_string(vocab_size) + ")");
  for (const auto& s : stop)
    if (s.empty()) return bad("stop strings must not be empty");
  return ok_status();
}

}  // namespace grpo
