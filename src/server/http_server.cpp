// HTTP endpoints over the engine service (see http_server.h, docs/serve.md).
#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "server/http_conn.h"
#include "server/openai_protocol.h"

namespace grpo {

namespace {

constexpr const char* kJson = "application/json";

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), kJson);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(e.to_json()), kJson);
}

ApiError api_error(int status, const std::string& type, const std::string& msg, const std::string& code = "") {
  return ApiError{status, msg, type, "", code};
}

// The bearer token of an Authorization header ("" if none).
std::string bearer(const httplib::Request& req) {
  const std::string h = req.get_header_value("Authorization");
  const std::string p = "Bearer ";
  return h.size() > p.size() && h.compare(0, p.size(), p) == 0 ? h.substr(p.size()) : std::string();
}

// One X-Policy-Version header (httplib's set_header appends).
void set_version(httplib::Response& res, int64_t v) {
  res.headers.erase("X-Policy-Version");
  res.set_header("X-Policy-Version", std::to_string(v));
}

std::string fmt_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

bool equal_const_time(const std::string& a, const std::string& b) {
  unsigned char d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) d |= uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0);
  return d == 0;
}

}  // namespace

Status ServerOptions::validate() const {
  auto bad = [](const std::string& m) { return error_status("server options: " + m); };
  if (host.empty()) return bad("host is empty (use 127.0.0.1, or 0.0.0.0 to listen on every interface)");
  if (port < 0 || port > 65535) return bad("port must be in [0, 65535] (0 = any free port), got " + std::to_string(port));
  if (max_body_bytes < 1024) return bad("max_body_bytes must be >= 1024");
  if (max_prompt_tokens < 0) return bad("max_prompt_tokens must be >= 0 (0 = the model's context length)");
  if (max_tokens_limit < 1) return bad("max_tokens_limit must be >= 1");
  if (max_n < 1) return bad("max_n must be >= 1");
  if (max_queued_requests < 1) return bad("max_queued_requests must be >= 1");
  if (n_threads != 0 && (n_threads < 2 || n_threads > 4096))
    return bad("n_threads must be 0 (automatic: max_queued_requests + " + std::to_string(kExtraHttpThreads) +
               ") or in [2, 4096]");
  if (listen_backlog < 0) return bad("listen_backlog must be >= 0 (0 = automatic)");
  if (read_timeout_s < 1 || write_timeout_s < 1 || keep_alive_timeout_s < 1) return bad("timeouts must be >= 1 second");
  return ok_status();
}

int ServerOptions::http_threads() const {
  if (n_threads > 0) return n_threads;
  return int(std::min<int64_t>(4096, int64_t(max_queued_requests) + kExtraHttpThreads));
}

HttpServer::HttpServer(EngineService& svc, const Tokenizer* tok, ServerOptions opt, LoraRegistry* loras)
    : svc_(svc), tok_(tok), opt_(std::move(opt)), loras_(loras), http_(std::make_unique<ConnServer>()) {
  started_at_ = int64_t(std::time(nullptr));
  // Every stream holds a worker for its whole life: with fewer workers than streams the
  // queue admits, the rest wait unserved in httplib's task queue.
  const int n_threads = opt_.http_threads();
  if (n_threads < opt_.max_queued_requests)
    GRPO_LOG_WARN("server: %d HTTP worker threads for up to %d requests in flight: streams beyond %d wait for a "
                  "worker (--http-threads 0 sizes the pool from --max-queued-requests)",
                  n_threads, opt_.max_queued_requests, n_threads);
  http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(size_t(n_threads)); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_read_timeout(opt_.read_timeout_s, 0);
  http_->set_write_timeout(opt_.write_timeout_s, 0);
  http_->set_keep_alive_timeout(opt_.keep_alive_timeout_s);
  // httplib's default of 5 requests per connection makes keep-alive clients reconnect
  // every 5 requests; the idle timeout is what bounds an idle connection.
  http_->set_keep_alive_max_count(100000);
  // One small write per streamed token: without TCP_NODELAY, Nagle holds each one back
  // until the previous is acknowledged (accepted sockets inherit it from the listener).
  http_->set_tcp_nodelay(true);
  // httplib 0.11 listens with a backlog of 5: a burst of clients overflows the accept
  // queue, and the kernel drops their handshakes (SYN retransmitted after 1 s, then 3 s,
  // ...; connections half-open on the client side). Remember the listening socket so
  // that start() can listen again with a real backlog.
  http_->set_socket_options([this](int sock) {
    httplib::default_socket_options(sock);
    if (listen_fd_ < 0) listen_fd_ = sock;
  });
  install_routes();
}

HttpServer::~HttpServer() { drain_and_stop(0); }

Status HttpServer::start() {
  GRPO_TRY(opt_.validate());
  if (opt_.port == 0) {
    port_ = http_->bind_to_any_port(opt_.host);
    if (port_ <= 0) return error_status("server: cannot bind " + opt_.host + " to any port; check --host");
  } else {
    if (!http_->bind_to_port(opt_.host, opt_.port))
      return error_status("server: cannot bind " + opt_.host + ":" + std::to_string(opt_.port) +
                          " (in use, or a privileged port); pick another --port or 0 for any free port");
    port_ = opt_.port;
  }
  if (listen_fd_ >= 0) {
    const int backlog = opt_.listen_backlog > 0 ? opt_.listen_backlog : std::max(1024, opt_.http_threads());
    if (::listen(listen_fd_, backlog) != 0)
      GRPO_LOG_WARN("server: cannot raise the listen backlog to %d: %s", backlog, std::strerror(errno));
  }
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return ok_status();
}

void HttpServer::drain_and_stop(double timeout_s) {
  draining_ = true;
  const double t0 = now_seconds();
  while (in_flight_ > 0 && now_seconds() - t0 < timeout_s) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (http_->is_running() || thread_.joinable()) http_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::install_routes() {
  httplib::Server& s = *http_;
  const std::string model_name =
      !opt_.served_model_name.empty() ? opt_.served_model_name : std::string("grpo");
  ApiLimits lim;
  lim.max_prompt_tokens = opt_.max_prompt_tokens;
  lim.max_tokens_limit = opt_.max_tokens_limit;
  lim.max_n = opt_.max_n;
  lim.max_model_len = svc_.engine().max_model_len();
  lim.vocab_size = svc_.engine().vocab_size();

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    set_version(res, svc_.policy_version());
    if (const HttpBodyError* be = http_body_error()) {
      send_error(res, api_error(be->status, "invalid_request_error", req.method + " " + req.path + ": " + be->message));
      svc_.metrics().count_http(req.path, be->status);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opt_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (equal_const_time(bearer(req), opt_.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, api_error(401, "invalid_request_error",
                              "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key "
                              "the server was started with (--api-key)",
                              "invalid_api_key"));
    svc_.metrics().count_http(req.path, 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    set_version(res, svc_.policy_version());
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e = api_error(res.status, "invalid_request_error", "");
    if (res.status == 404) e.message = "no such endpoint: " + req.method + " " + req.path + " (see docs/serve.md)";
    else if (res.status == 413)
      e.message = "the request body is larger than this server's limit of " + std::to_string(opt_.max_body_bytes) +
                  " bytes (--max-body-bytes)";
    else if (res.status == 400) e.message = "malformed HTTP request";
    else if (res.status >= 500) {
      e.type = "server_error";
      e.message = "internal server error";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    send_error(res, e);
    svc_.metrics().count_http(req.path, res.status);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, api_error(500, "server_error", "internal server error: " + what));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (svc_.stopping() || draining_) return send_error(res, api_error(503, "server_error", "the server is shutting down"));
    send_json(res, 200, json{{"status", "ok"}, {"policy_version", svc_.policy_version()}});
  });

  // vLLM's model cards: the base (root = its path), then each adapter (root = its path,
  // parent = the base's id, no max_model_len).
  s.Get("/v1/models", [this, model_name](const httplib::Request&, httplib::Response& res) {
    const std::string root = opt_.model_path.empty() ? model_name : opt_.model_path;
    json data = json::array();
    data.push_back(json{{"id", model_name}, {"object", "model"}, {"created", started_at_}, {"owned_by", "grpo.cpp"},
                        {"root", root}, {"parent", nullptr}, {"max_model_len", svc_.engine().max_model_len()}});
    if (loras_)
      for (const auto& a : loras_->list())
        data.push_back(json{{"id", a.name}, {"object", "model"}, {"created", a.created}, {"owned_by", "grpo.cpp"},
                            {"root", a.path}, {"parent", model_name}, {"max_model_len", nullptr}});
    send_json(res, 200, json{{"object", "list"}, {"data", data}, {"policy_version", svc_.policy_version()}});
  });

  // vLLM's runtime adapter updates (VLLM_ALLOW_RUNTIME_LORA_UPDATING): plain-text "Success: ..."
  // on 200, vLLM's error types otherwise.
  auto lora_update = [this, model_name](bool load) {
    return [this, model_name, load](const httplib::Request& req, httplib::Response& res) {
      const std::string endpoint = req.path;
      auto fail = [&](int status, const std::string& type, const std::string& msg, const std::string& param) {
        send_error(res, ApiError{status, msg, type, param, ""});
        svc_.metrics().count_http(endpoint, status);
      };
      if (!opt_.enable_lora_updates || !loras_)
        return fail(404, "NotFoundError",
                    "runtime LoRA updates are off: start grpo serve with --enable-lora-updates (vLLM: "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)",
                    "");
      if (draining_ || svc_.stopping()) return fail(503, "server_error", "the server is shutting down", "");
      ApiError err;
      json j = parse_body(req.body, &err);
      if (j.is_null()) return fail(400, "InvalidUserInput", err.message, "");
      auto str = [&](const char* k) {
        auto it = j.find(k);
        return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
      };
      const std::string name = str("lora_name"), path = str("lora_path");
      if (load && (name.empty() || path.empty()))
        return fail(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.",
                    name.empty() ? "lora_name" : "lora_path");
      if (!load && name.empty())
        return fail(400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.", "lora_name");
      bool inplace = false;
      if (auto it = j.find("load_inplace"); load && it != j.end() && !it->is_null()) {
        if (!it->is_boolean()) return fail(400, "InvalidUserInput", "'load_inplace' must be true or false", "load_inplace");
        inplace = it->get<bool>();
      }
      if (name == model_name)
        return fail(400, "InvalidUserInput", "'" + name + "' is the base model's name, not a LoRA adapter", "lora_name");
      LoraOpError why = LoraOpError::none;
      Status st = load ? loras_->load(name, path, inplace, &why) : loras_->unload(name, &why);
      if (!st.ok()) {
        const bool nf = why == LoraOpError::not_found;
        return fail(nf ? 404 : 400, nf ? "NotFoundError" : load ? "BadRequestError" : "InvalidUserInput",
                    st.message(), load ? (nf ? "lora_path" : "") : "lora_name");
      }
      res.status = 200;
      res.set_content("Success: LoRA adapter '" + name + (load ? "' added successfully." : "' removed successfully."),
                      "text/plain");
      svc_.metrics().count_http(endpoint, 200);
    };
  };
  s.Post("/v1/load_lora_adapter", lora_update(true));
  s.Post("/v1/unload_lora_adapter", lora_update(false));

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const ServiceGauges g = svc_.gauges();
    ServiceMetrics& m = svc_.metrics();
    std::string out;
    auto gauge = [&](const char* name, const char* help, double v) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + fmt_num(v) + "\n";
    };
    auto counter = [&](const char* name, const char* help, double v) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + fmt_num(v) + "\n";
    };
    gauge("grpo_policy_version", "Optimizer step of the served weights.", double(svc_.policy_version()));
    gauge("grpo_requests_pending", "Requests submitted and not yet in the engine.", g.n_pending);
    gauge("grpo_requests_active", "Requests in the engine.", g.n_active_requests);
    gauge("grpo_num_requests_waiting", "Sequences waiting for admission in the engine.", g.n_waiting_seqs);
    gauge("grpo_num_requests_running", "Sequences in the engine's running batch.", g.n_running_seqs);
    gauge("grpo_kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).",
          g.n_kv_blocks > 0 ? 1.0 - double(g.n_free_kv_blocks) / double(g.n_kv_blocks) : 0.0);
    gauge("grpo_kv_blocks_total", "KV blocks in the pool.", g.n_kv_blocks);
    gauge("grpo_kv_blocks_free", "KV blocks obtainable now.", g.n_free_kv_blocks);
    gauge("grpo_http_in_flight", "HTTP requests being served.", in_flight_);
    counter("grpo_engine_steps_total", "Engine steps run.", double(g.engine_steps));
    counter("grpo_prefix_cache_hit_tokens_total", "Prompt tokens served by the prefix cache.", double(g.prefix_hit_tokens));
    counter("grpo_preemptions_total", "Sequences preempted by recompute.", double(g.preemptions));
    {
      std::lock_guard<std::mutex> lk(m.mu);
      counter("grpo_prompt_tokens_total", "Prompt tokens of finished requests.", double(m.prompt_tokens));
      counter("grpo_generation_tokens_total", "Generated tokens.", double(m.generation_tokens));
      counter("grpo_requests_finished_total", "Requests answered in full.", double(m.requests_finished));
      counter("grpo_requests_aborted_total", "Requests aborted because the client left.", double(m.requests_aborted));
      counter("grpo_requests_failed_total", "Requests the engine rejected.", double(m.requests_failed));
      out += "# HELP grpo_request_success_total Finished samples by finish reason.\n"
             "# TYPE grpo_request_success_total counter\n";
      for (const auto& [r, n] : m.finish_reasons)
        out += "grpo_request_success_total{finished_reason=\"" + prometheus_label(r) + "\"} " + std::to_string(n) + "\n";
      out += "# HELP grpo_requests_by_model_total Generation requests accepted, by the model they named (base or adapter).\n"
             "# TYPE grpo_requests_by_model_total counter\n";
      for (const auto& [k, n] : m.model_requests)
        out += "grpo_requests_by_model_total{model=\"" + prometheus_label(k) + "\"} " + std::to_string(n) + "\n";
      out += "# HELP grpo_http_requests_total HTTP requests by endpoint and status.\n"
             "# TYPE grpo_http_requests_total counter\n";
      for (const auto& [k, n] : m.http_requests)
        out += "grpo_http_requests_total{endpoint=\"" + prometheus_label(k.first) + "\",status=\"" +
               std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
    }
    if (loras_) {
      const auto list = loras_->list();
      gauge("grpo_lora_slots_total", "LoRA adapter slots of the engine (--max-loras).", loras_->n_slots());
      gauge("grpo_lora_adapters_loaded", "LoRA adapters served by name.", double(list.size()));
      out += "# HELP grpo_lora_requests_in_flight Requests running or queued on each LoRA adapter.\n"
             "# TYPE grpo_lora_requests_in_flight gauge\n";
      for (const auto& a : list)
        out += "grpo_lora_requests_in_flight{model=\"" + prometheus_label(a.name) + "\"} " +
               std::to_string(a.n_in_flight) + "\n";
    }
    m.ttft_s.render("grpo_time_to_first_token_seconds", "Submission to first token, per sample.", out);
    m.inter_token_s.render("grpo_inter_token_latency_seconds", "Time between consecutive tokens of a sample.", out);
    m.e2e_s.render("grpo_e2e_request_latency_seconds", "Submission to the last sample's end, per request.", out);
    res.status = 200;
    res.set_content(out, "text/plain; version=0.0.4");
  });

  s.Post("/tokenize", [this, lim](const httplib::Request& req, httplib::Response& res) {
    ApiError err;
    json j = parse_body(req.body, &err);
    if (j.is_null()) return send_error(res, err);
    std::vector<int32_t> ids;
    if (j.contains("messages")) {
      GenRequest g;
      ApiLimits l2 = lim;
      l2.max_model_len = 1 << 30;  // counting tokens is not generating: no context limit
      l2.max_prompt_tokens = 0;
      json jc = j;
      jc.erase("max_tokens");
      jc.erase("max_completion_tokens");
      if (auto e = parse_chat_request(jc, tok_, opt_.chat_template, l2, g)) return send_error(res, *e);
      ids = g.prompts[0];
    } else {
      auto p = j.find("prompt");
      if (p == j.end() || !p->is_string())
        return send_error(res, ApiError{400, "'prompt' (a string) or 'messages' is required", "invalid_request_error", "prompt", ""});
      bool add_special = true;
      if (auto it = j.find("add_special_tokens"); it != j.end() && !it->is_null()) {
        if (!it->is_boolean())
          return send_error(res, ApiError{400, "'add_special_tokens' must be true or false", "invalid_request_error", "add_special_tokens", ""});
        add_special = it->get<bool>();
      }
      if (!tok_) return send_error(res, ApiError{400, "this server has no tokenizer", "invalid_request_error", "prompt", ""});
      auto r = tok_->encode_checked(p->get<std::string>(), add_special);
      if (!r.ok()) return send_error(res, ApiError{400, "'prompt': " + r.status().message(), "invalid_request_error", "prompt", ""});
      ids.assign(r.value().begin(), r.value().end());
    }
    json out{{"count", ids.size()}, {"max_model_len", lim.max_model_len}, {"tokens", ids}};
    bool strs = false;
    if (auto it = j.find("return_token_strs"); it != j.end() && it->is_boolean()) strs = it->get<bool>();
    if (strs) {
      json ts = json::array();
      for (int32_t id : ids) ts.push_back(tok_->id_to_token(id));
      out["token_strs"] = ts;
    } else {
      out["token_strs"] = nullptr;
    }
    out["policy_version"] = svc_.policy_version();
    send_json(res, 200, out);
  });

  s.Post("/detokenize", [this, lim](const httplib::Request& req, httplib::Response& res) {
    ApiError err;
    json j = parse_body(req.body, &err);
    if (j.is_null()) return send_error(res, err);
    auto t = j.find("tokens");
    if (t == j.end() || !t->is_array())
      return send_error(res, ApiError{400, "'tokens' (a list of token ids) is required", "invalid_request_error", "tokens", ""});
    std::vector<int> ids;
    for (const auto& v : *t) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= lim.vocab_size)
        return send_error(res, ApiError{400, "'tokens' must hold token ids in [0, " + std::to_string(lim.vocab_size) + ")",
                                        "invalid_request_error", "tokens", ""});
      ids.push_back(int(v.get<int64_t>()));
    }
    if (!tok_) return send_error(res, ApiError{400, "this server has no tokenizer", "invalid_request_error", "tokens", ""});
    send_json(res, 200, json{{"prompt", tok_->decode(ids)}, {"policy_version", svc_.policy_version()}});
  });

  // One handler for the three generation endpoints.
  auto generation = [this, lim, model_name](ApiKind kind) {
    return [this, lim, model_name, kind](const httplib::Request& req, httplib::Response& res) {
      const std::string endpoint = req.path;
      struct Count {
        std::atomic<int>& n;
        explicit Count(std::atomic<int>& c) : n(c) { ++n; }
        ~Count() { --n; }
      };
      auto count = std::make_shared<Count>(in_flight_);
      auto finish = [&](int status) { svc_.metrics().count_http(endpoint, status); };
      if (draining_ || svc_.stopping()) {
        send_error(res, api_error(503, "server_error", "the server is shutting down; retry against another instance"));
        return finish(503);
      }
      ApiError err;
      json j = parse_body(req.body, &err);
      if (j.is_null()) {
        send_error(res, err);
        return finish(400);
      }
      auto g = std::make_shared<GenRequest>();
      std::optional<ApiError> perr;
      if (kind == ApiKind::completion) perr = parse_completion_request(j, tok_, lim, *g);
      else if (kind == ApiKind::chat) perr = parse_chat_request(j, tok_, opt_.chat_template, lim, *g);
      else perr = parse_generate_request(j, tok_, lim, *g);
      // `model`: the base's name (or none) = the default adapter; an adapter's name = its
      // slot, held until the answer is complete (an unload waits for it).
      std::shared_ptr<LoraRegistry::Lease> lease;
      if (!perr && !g->model.empty() && g->model != model_name) {
        if (auto l = loras_ ? loras_->acquire(g->model) : std::nullopt) {
          lease = std::make_shared<LoraRegistry::Lease>(std::move(*l));
          g->params.lora_slot = lease->slot();
        } else {
          std::string names = "'" + model_name + "'";
          if (loras_)
            for (const auto& a : loras_->list()) names += ", '" + a.name + "'";
          perr = ApiError{404, "the model '" + g->model + "' does not exist; this server serves " + names,
                          "invalid_request_error", "model", "model_not_found"};
        }
      }
      if (perr) {
        send_error(res, *perr);
        return finish(perr->status);
      }
      std::vector<std::shared_ptr<RequestChannel>> chans;
      for (auto& p : g->prompts) {
        EngineService::SubmitError why;
        auto ch = svc_.submit(p, g->params, g->stream, &why);
        if (!ch.ok()) {
          for (auto& c : chans) c->cancel();
          if (why == EngineService::SubmitError::queue_full) {
            res.set_header("Retry-After", "1");
            send_error(res, api_error(429, "rate_limit_error",
                                      "the server is busy: " + ch.status().message() + " (--max-queued-requests)",
                                      "rate_limit_exceeded"));
            return finish(429);
          }
          send_error(res, api_error(503, "server_error", ch.status().message()));
          return finish(503);
        }
        chans.push_back(ch.value());
      }
      ResponseMeta meta;
      const char* prefix = kind == ApiKind::chat ? "chatcmpl-" : kind == ApiKind::completion ? "cmpl-" : "gen-";
      char idbuf[48];
      std::snprintf(idbuf, sizeof(idbuf), "%s%llx%06llx", prefix, (unsigned long long)started_at_,
                    (unsigned long long)next_id_++);
      meta.id = idbuf;
      meta.model = g->model.empty() ? model_name : g->model;
      svc_.metrics().count_model(meta.model);
      meta.created = int64_t(std::time(nullptr));

      if (!g->stream) {
        std::vector<RequestOutput> outs;
        for (auto& ch : chans) {
          // The client's socket is probed between waits: one that closed its connection
          // gets its request aborted and its KV blocks freed, as a stream's would.
          while (!ch->wait(nullptr, std::chrono::milliseconds(250))) {
            if (http_client_gone()) {
              for (auto& c : chans) c->cancel();
              // nginx's "client closed request": nobody reads it; the body keeps the error
              // handler from counting it twice.
              send_error(res, api_error(499, "invalid_request_error", "the client closed the connection"));
              return finish(499);
            }
          }
          Status st = ch->error();
          if (!st.ok()) {
            for (auto& c : chans) c->cancel();
            send_error(res, ApiError{400, st.message(), "invalid_request_error", "", ""});
            return finish(400);
          }
          meta.policy_version = ch->policy_version();
          for (auto& o : ch->take_outputs()) outs.push_back(std::move(o));
        }
        set_version(res, meta.policy_version);
        json body = kind == ApiKind::completion ? completion_response(*g, outs, tok_, meta)
                    : kind == ApiKind::chat     ? chat_response(*g, outs, tok_, meta)
                                                : generate_response(*g, outs, meta);
        send_json(res, 200, body);
        return finish(200);
      }

      // Streaming: wait for admission so that engine-side rejections still get a status.
      for (auto& ch : chans) {
        while (!ch->wait_admitted(std::chrono::milliseconds(250)) && ch->error().ok()) {
          if (http_client_gone()) {
            for (auto& c : chans) c->cancel();
            send_error(res, api_error(499, "invalid_request_error", "the client closed the connection"));
            return finish(499);
          }
        }
        Status st = ch->error();
        if (!st.ok()) {
          for (auto& c : chans) c->cancel();
          send_error(res, ApiError{400, st.message(), "invalid_request_error", "", ""});
          return finish(400);
        }
        meta.policy_version = ch->policy_version();
      }
      set_version(res, meta.policy_version);
      res.set_header("Cache-Control", "no-cache");
      finish(200);
      auto state = std::make_shared<std::vector<std::shared_ptr<RequestChannel>>>(chans);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, g, state, meta, kind, count, lease](size_t, httplib::DataSink& sink) {
            auto write = [&](const json& j) {
              const std::string s = "data: " + dump_json(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            auto& chs = *state;
            const int n = g->params.n;
            if (kind == ApiKind::chat)
              for (int k = 0; k < int(chs.size()) * n; ++k)
                if (!write(chat_chunk(*g, k, nullptr, true, tok_, meta))) {
                  for (auto& c : chs) c->cancel();
                  return false;
                }
            std::vector<size_t> offsets(chs.size() * size_t(n), 0);
            std::vector<bool> over(chs.size(), false);
            size_t n_over = 0;
            std::vector<RequestOutput> outs;
            std::vector<TokenEvent> evs;
            std::string pending;
            double last_write = now_seconds();
            while (n_over < chs.size()) {
              for (size_t i = 0; i < chs.size(); ++i) {
                if (over[i]) continue;
                evs.clear();
                const bool done = chs[i]->wait(&evs, std::chrono::milliseconds(chs.size() == 1 ? 200 : 5));
                // Everything delivered since the last wake goes out in one write (one syscall,
                // one chunk) however many tokens it holds.
                pending.clear();
                for (const auto& e : evs) {
                  const int index = int(i) * n + e.sample_index;
                  const json c = kind == ApiKind::chat ? chat_chunk(*g, index, &e, false, tok_, meta)
                                                       : completion_chunk(*g, index, e, tok_, meta, offsets[size_t(index)]);
                  offsets[size_t(index)] += token_text(tok_, e.token).size();
                  pending += "data: ";
                  pending += dump_json(c);
                  pending += "\n\n";
                }
                if (!pending.empty()) {
                  if (!sink.write(pending.data(), pending.size())) {
                    for (auto& ch : chs) ch->cancel();  // the client left: free its KV blocks
                    return false;
                  }
                  last_write = now_seconds();
                }
                if (done) {
                  over[i] = true;
                  ++n_over;
                  for (auto& o : chs[i]->take_outputs()) outs.push_back(std::move(o));
                }
              }
              // A client that closed its socket is seen at once; one that vanished without a
              // FIN only when a write fails, so a comment line probes it while the engine is
              // busy elsewhere.
              if (n_over < chs.size() && now_seconds() - last_write > 0.25) {
                if (http_client_gone()) {
                  for (auto& ch : chs) ch->cancel();
                  return false;
                }
                if (now_seconds() - last_write > 1.0) {
                  if (!sink.write(": ping\n\n", 8)) {
                    for (auto& ch : chs) ch->cancel();
                    return false;
                  }
                  last_write = now_seconds();
                }
              }
            }
            if (g->include_usage) {
              json u{{"id", meta.id},
                     {"object", kind == ApiKind::chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", meta.created},
                     {"model", meta.model},
                     {"choices", json::array()},
                     {"usage", usage_json(outs)},
                     {"policy_version", meta.policy_version}};
              if (!write(u)) return false;
            }
            const std::string done = "data: [DONE]\n\n";
            if (!sink.write(done.data(), done.size())) return false;
            sink.done();
            return true;
          },
          [state, count, lease](bool success) {
            if (!success)
              for (auto& c : *state) c->cancel();
          });
    };
  };
  s.Post("/v1/completions", generation(ApiKind::completion));
  s.Post("/v1/chat/completions", generation(ApiKind::chat));
  s.Post("/generate", generation(ApiKind::generate));
}

}  // namespace grpo
