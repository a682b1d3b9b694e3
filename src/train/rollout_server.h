// Rollouts sampled by a separate server (rollout.server_url; TRL's vllm_mode = "server",
// docs/serve.md "Rollouts from a separate server"). The loop sends each generation batch
// there instead of to its own engine and gets back the same RequestOutputs. train/ does
// not speak HTTP: the CLI builds the client (server/rollout_client.h) and hands it in
// through TrainLoopOptions::make_rollout_server, as it does the HTTP front.
//
// Contract of generate(): prompt k is sampled params[k].n times with RNG keys
// (params[k].seed, j), exactly as Engine::generate would, so that a server on the same
// weights and batch-invariant kernels (the CPU with --deterministic) returns the engine's
// completions bit for bit. Outputs are prompt-major, sample-minor; each carries the prompt
// ids, the completion ids, the text, one logprob per completion token (in
// params[k].logprobs_mode) and the finish reason.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"

namespace grpo {

struct RemoteGeneration {
  std::vector<RequestOutput> outs;  // prompt-major, sample-minor
  // The policy versions (optimizer steps of the server's weights) of the answers.
  int64_t policy_version_min = -1, policy_version_max = -1;
  int64_t n_resent = 0;  // requests asked again because the answer came from a version < min_version
};

class RolloutServer {
 public:
  virtual ~RolloutServer() = default;
  virtual const std::string& url() const = 0;
  // GET /health: the server's policy version, or an error that names the URL and says how to
  // start a server.
  virtual Result<int64_t> health() = 0;
  // health() within timeout_s (connect and answer): the cheap check, once a step, whether a lost
  // server is back (rollout.server_on_failure = "local"; a refused connection fails at once).
  virtual Result<int64_t> probe(double timeout_s) = 0;
  // One request per prompt, up to the client's concurrency in flight at once. min_version >= 0
  // (a weight bridge follows the trainer): an answer from an older policy version is asked
  // again (the server is still loading the weights just sent) until the request's timeout,
  // then it is an error. Any failed or malformed answer fails the whole call, naming the URL.
  virtual Result<RemoteGeneration> generate(const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<SamplingParams>& params, int64_t min_version) = 0;
};

// Polls s.health() every poll_s until it answers or timeout_s has passed; then health()'s error,
// with how long it waited. For servers that listen only after joining a weight bridge
// (grpo serve --receive, --attach), which the trainer sets up after loading the model.
Status rollout_server_wait(RolloutServer& s, double timeout_s, double poll_s = 0.2);

}  // namespace grpo
