// Per-completion inference telemetry that the engine reports and that
// inference-aware rewards consume. Plain data; the engine fills it, the env
// layer only reads it. Zero means "not measured" for every field.
#pragma once
#include <cstdint>

namespace grpo {

struct Telemetry {
  double latency_s = 0;          // request admitted -> last token, seconds
  double ttft_s = 0;             // request admitted -> first token, seconds
  int64_t n_tokens = 0;          // completion tokens generated (EOS included if sampled)
  int64_t kv_peak_bytes = 0;     // peak KV-cache bytes held by this request (shared prefix pages counted once per request)
  double spec_accept_rate = 0;   // spec_accepted / spec_proposed in [0, 1]; 0 when nothing was drafted
  int64_t spec_proposed = 0;     // draft tokens proposed for this request
  int64_t spec_accepted = 0;     // of those, accepted by the target
  int64_t engine_steps = 0;      // engine steps that scheduled this request (prefill chunks + decodes)
  int64_t prefix_hit_tokens = 0; // prompt tokens served from the prefix cache
  int64_t prompt_tokens = 0;     // prompt length in tokens
  bool truncated = false;        // stopped by max_new_tokens rather than EOS/stop string
};

}  // namespace grpo
