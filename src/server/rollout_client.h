// The HTTP client behind rollout.server_url (train/rollout_server.h): each prompt of a
// generation batch is one POST /v1/completions to a `grpo serve` (or a vLLM-compatible
// server) with the prompt's token ids, n = its group size, the loop's sampling parameters
// and its seed, asking for the completion token ids (`return_token_ids`) and each sampled
// token's logprob (`logprobs: 0`, in the loop's `logprobs_mode`). Requests run on up to
// max_concurrency threads, each with its own keep-alive connection, so the server batches
// them. docs/serve.md ("Rollouts from a separate server") is the user's view.
//
// Failures name the URL: no connection, a request that fails or has no answer within
// timeout_s (the socket read timeout: the server answers a non-streaming request only when
// it is done), a non-200 status (with the body), an answer without token ids or logprobs.
// 429 (the server's queue is full) is retried after a second until the request's deadline.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/rollout_server.h"
#include "train/run_config.h"

namespace grpo {

struct RolloutClientOptions {
  std::string url;             // http://HOST:PORT (validated by RunConfig::validate)
  double timeout_s = 600;      // per request, and the deadline of its retries
  int max_concurrency = 64;    // requests in flight at once
  std::string model_path;      // the run's model, for the "start a server" hint
};

// From rollout.server_url, server_timeout_s, server_max_concurrency and model.path.
RolloutClientOptions rollout_client_options(const RunConfig& cfg);

Result<std::unique_ptr<RolloutServer>> rollout_client_make(const RolloutClientOptions& o);

// The body of the /v1/completions request for one prompt (exposed for tests).
nlohmann::json rollout_request_body(const std::vector<int32_t>& prompt, const SamplingParams& p);
// Parses a /v1/completions answer to that request into p.n outputs (sample order) and the
// answer's policy_version (-1 when the server reports none). Errors say what is missing.
Status rollout_answer_parse(const nlohmann::json& j, const std::vector<int32_t>& prompt, const SamplingParams& p,
                            std::vector<RequestOutput>* outs, int64_t* policy_version);

}  // namespace grpo
