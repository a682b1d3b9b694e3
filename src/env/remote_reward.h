// Rewards scored outside C++ (docs/rewards.md has the full protocols).
//
// Both send each completion as the JSON object
//   {"prompt": str, "completion": str, "answer": str, "metadata": {...}}
// with metadata = {"id", "question", "n_tokens", "truncated", "row": {fields
// of the source row}} and expect one finite number back per completion.
//
//   http: url (required, http[s]://host[:port][/path]), mode = "batch" | "single",
//     batch_size = 16, max_concurrency = 4, timeout = 30 (s), retries = 2,
//     backoff = 0.5 (s, doubled per retry), headers = {}, api_key_env = ""
//     (environment variable holding a key sent as "Authorization: Bearer"),
//     on_failure = "error" | "zero".
//     batch: POST {"items": [item, ...]} -> {"scores": [number, ...]};
//     single: POST item -> {"score": number}. Connection errors, timeouts,
//     429 and 5xx are retried; other statuses and malformed bodies are not.
//   command: command (required argv; argv[0] is searched in PATH), timeout =
//     60 (s without an answer while one is due), restart = true, max_in_flight
//     = 64, on_failure = "error" | "zero". One JSON line per request on the
//     process's stdin, item plus "id" (an integer); it answers one line per
//     request, {"id": n, "score": number} or {"id": n, "error": str}, in any
//     order. It is started by RewardComposer::make, killed (with its process
//     group) when the composer goes away, and must exit on stdin EOF.
//
// on_failure = "error" turns any failure into an error naming the function,
// its target and the reason; "zero" scores the affected completions 0 and
// counts them (RewardBatchResult::n_failed).
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "env/rewards.h"

namespace grpo {

// Range and consistency checks of a complete, typed parameter table of
// "http" or "command" (called by reward_make).
Status remote_reward_check(const std::string& fn, const nlohmann::json& p);
// Builds "http" or "command" from checked parameters. Starts no process.
Result<std::unique_ptr<RewardFunction>> remote_reward_make(const std::string& fn, double weight, const nlohmann::json& p);

// The JSON object a remote function receives for one completion.
nlohmann::json reward_request_item(const RewardInput& in);
// Compact JSON text; invalid UTF-8 (a sampled completion can hold any bytes)
// becomes U+FFFD instead of throwing.
std::string reward_json_dump(const nlohmann::json& j);

// Parsed "http[s]://host[:port][/path]".
struct HttpUrl {
  bool https = false;
  std::string host;
  int port = 80;
  std::string path = "/";
};
Result<HttpUrl> http_url_parse(const std::string& url);

// Implementations (http/http_reward.cpp, remote_reward_command.cpp). The http
// one is weak: it exists only in binaries that link grpo_env_http (CMakeLists).
std::unique_ptr<RewardFunction> http_reward_make(double weight, const nlohmann::json& p, std::string api_key)
    __attribute__((weak));
std::unique_ptr<RewardFunction> command_reward_make(double weight, const nlohmann::json& p);

}  // namespace grpo
