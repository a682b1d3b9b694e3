// The HTTP front of an EngineService: OpenAI- and vLLM-compatible endpoints
// (/v1/completions, /v1/chat/completions, /generate, /tokenize, /detokenize,
// /v1/models, /health, /metrics, and with LoRA updates on /v1/load_lora_adapter and
// /v1/unload_lora_adapter; see docs/serve.md), with an optional bearer key,
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
#include "server/lora_registry.h"
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
  std::string model_path;           // the base's `root` in /v1/models (vLLM: the model path); empty: the name
  bool enable_lora_updates = false; // POST /v1/load_lora_adapter, /v1/unload_lora_adapter (needs a LoraRegistry)
  std::string chat_template;        // Jinja source overriding the tokenizer's
  size_t max_body_bytes = size_t(4) << 20;  // larger bodies: 413
  int max_prompt_tokens = 0;        // 0: the model's context length is the limit
  int max_tokens_limit = 4096;      // most completion tokens a request may ask for
  int max_n = 16;                   // most samples per prompt
  int max_queued_requests = 256;    // requests in flight at once; more: 429 with Retry-After
  // HTTP worker threads; each open connection (a stream, or an idle keep-alive one) holds
  // one. 0: max_queued_requests + kExtraHttpThreads (at most 4096), so that every stream
  // the queue admits has a worker; a smaller explicit value makes connections beyond it
  // wait for a worker.
  int n_threads = 0;
  int listen_backlog = 0;           // pending connections the kernel queues; 0: max(1024, worker threads)
  int read_timeout_s = 10;          // a client that stops sending for this long is dropped
  int write_timeout_s = 30;
  int keep_alive_timeout_s = 5;
  Status validate() const;
  // Worker threads the server runs with (n_threads, or the automatic size).
  int http_threads() const;
  static constexpr int kExtraHttpThreads = 32;  // /health, /metrics, idle keep-alive connections
};

class HttpServer {
 public:
  // svc, tok (may be null: ids only) and loras (may be null: no adapters by name) must
  // outlive the server. With loras, `model` may name one of its adapters.
  HttpServer(EngineService& svc, const Tokenizer* tok, ServerOptions opt, LoraRegistry* loras = nullptr);
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
  LoraRegistry* loras_ = nullptr;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket (httplib's), to raise its backlog
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> next_id_{0};
  int64_t started_at_ = 0;
};

}  // namespace grpo
