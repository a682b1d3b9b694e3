// The HTTP front of an EngineService: OpenAI- and vLLM-compatible endpoints
// (/v1/completions, /v1/chat/completions, /generate, /tokenize, /detokenize,
// /v1/models, /health, /metrics; see docs/serve.md), with an optional bearer key,
// request limits, a bounded worker pool and socket timeouts.
//
// Workers parse and validate, submit to the service and wait on the request's
// channel (or stream it as server-sent events); they never touch the engine.
// Every response carries the header X-Policy-Version, and JSON bodies of the
// generation endpoints a `policy_version` field: the optimizer step of the weights
// that produced the answer.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "engine/engine_service.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace grpo {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (see HttpServer::port())
  std::string api_key;              // non-empty: every endpoint but /health needs "Authorization: Bearer <key>"
  std::string served_model_name;    // the `model` clients name; empty: the model directory's name
  std::string chat_template;        // Jinja source overriding the tokenizer's
  size_t max_body_bytes = size_t(4) << 20;  // larger bodies: 413
  int max_prompt_tokens = 0;        // 0: the model's context length is the limit
  int max_tokens_limit = 4096;      // most completion tokens a request may ask for
  int max_n = 16;                   // most samples per prompt
  int max_queued_requests = 256;    // requests in flight at once; more: 429 with Retry-After
  int n_threads = 64;               // HTTP worker threads (each open connection holds one)
  int read_timeout_s = 10;          // a client that stops sending for this long is dropped
  int write_timeout_s = 30;
  int keep_alive_timeout_s = 5;
  Status validate() const;
};

class HttpServer {
 public:
  // svc and tok (may be null: ids only) must outlive the server.
  HttpServer(EngineService& svc, const Tokenizer* tok, ServerOptions opt);
  ~HttpServer();

  // Binds the socket (port 0: any free port) and serves on a background thread.
  Status start();
  int port() const { return port_; }
  // Answers new generation requests with 503, waits until the requests being served
  // have been answered (at most `timeout_s`), then closes the socket. Idempotent.
  void drain_and_stop(double timeout_s = 600);
  int n_in_flight() const { return in_flight_; }

 private:
  void install_routes();

  EngineService& svc_;
  const Tokenizer* tok_;
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> next_id_{0};
  int64_t started_at_ = 0;
};

}  // namespace grpo
