// HTTP routes of the trajectory API (see trajectory_api.h).
#include "server/trajectory_api.h"

#include <httplib.h>

#include "core/log.h"
#include "server/http_conn.h"

namespace grpo {

using json = nlohmann::json;

namespace {

void send(httplib::Response& res, const ApiReply& r) {
  res.status = r.status;
  if (r.retry_after_s > 0) res.set_header("Retry-After", std::to_string(r.retry_after_s));
  if (!r.text.empty()) {
    res.set_content(r.text, "text/plain; charset=utf-8");
    return;
  }
  res.set_content(r.body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The parsed JSON body, or a 400 reply naming the problem.
bool parse_body(const httplib::Request& req, httplib::Response& res, json* out) {
  *out = json::parse(req.body, nullptr, false);
  if (out->is_discarded()) {
    send(res, ApiReply{400, json{{"status", "error"}, {"message", "the request body is not valid JSON"}}, "", 0});
    return false;
  }
  return true;
}

}  // namespace

Status TrajectoryApiOptions::validate() const {
  if (host.empty()) return error_status("host is empty (use 127.0.0.1, or 0.0.0.0 to listen on every interface)");
  if (port < 0 || port > 65535) return error_status("port " + std::to_string(port) + " is outside 0..65535");
  if (n_threads < 1) return error_status("n_threads must be >= 1");
  if (max_body_bytes < 1024) return error_status("max_body_bytes must be >= 1024");
  return ok_status();
}

TrajectoryApiServer::TrajectoryApiServer(TrajectoryStore& store, TrajectoryApiOptions opt)
    : store_(store), opt_(std::move(opt)) {}

TrajectoryApiServer::~TrajectoryApiServer() { stop(); }

Status TrajectoryApiServer::start() {
  GRPO_TRY(opt_.validate());
  http_ = std::make_unique<ConnServer>();
  const int n_threads = opt_.n_threads;
  http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(size_t(n_threads)); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  // httplib's default closes a connection after 5 requests; environments poll
  // /status-env and post on one kept-alive session, so the idle timeout bounds it.
  http_->set_keep_alive_max_count(100000);
  // A body ConnServer could not read for a GET (too large, no Content-Length, ...):
  // answered before routing, in the API's error shape.
  http_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const HttpBodyError* be = http_body_error();
    if (!be) return httplib::Server::HandlerResponse::Unhandled;
    send(res, ApiReply{be->status, json{{"status", "error"}, {"message", req.method + " " + req.path + ": " + be->message}},
                       "", 0});
    return httplib::Server::HandlerResponse::Handled;
  });
  TrajectoryStore& s = store_;
  auto post = [this](const char* path, ApiReply (TrajectoryStore::*fn)(const json&)) {
    http_->Post(path, [this, fn](const httplib::Request& req, httplib::Response& res) {
      json body;
      if (parse_body(req, res, &body)) send(res, (store_.*fn)(body));
    });
  };
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    send(res, ApiReply{200, json{{"message", "AtroposLib API"}}, "", 0});
  });
  post("/register", &TrajectoryStore::register_trainer);
  post("/register-env", &TrajectoryStore::register_env);
  post("/disconnect-env", &TrajectoryStore::disconnect_env);
  post("/scored_data", &TrajectoryStore::scored_data);
  post("/scored_data_list", &TrajectoryStore::scored_data_list);
  http_->Get("/info", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.info()); });
  http_->Get("/wandb_info", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.wandb_info()); });
  http_->Get("/batch", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.batch()); });
  http_->Get("/status", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.status()); });
  http_->Get("/latest_example", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.latest_example()); });
  http_->Get("/reset_data", [&s](const httplib::Request&, httplib::Response& res) { send(res, s.reset_data()); });
  http_->Get("/status-env", [&s](const httplib::Request& req, httplib::Response& res) {
    json body = json::object();
    if (req.has_param("env_id")) {
      const std::string v = req.get_param_value("env_id");
      char* end = nullptr;
      const long long id = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') {
        send(res, ApiReply{400, json{{"status", "error"}, {"message", "GET /status-env: env_id '" + v + "' is not an integer"}}, "", 0});
        return;
      }
      body["env_id"] = int64_t(id);
    } else if (!req.body.empty()) {  // read by ConnServer: httplib reads no GET bodies
      if (!parse_body(req, res, &body)) return;
    }
    send(res, s.status_env(body));
  });
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404 ? "no route " + req.method + " " + req.path + " (see docs/environments.md)"
                          : res.status == 413 ? "the request body is larger than the server's limit"
                                              : "request failed with HTTP " + std::to_string(res.status);
    res.set_content(json{{"status", "error"}, {"message", msg}}.dump(), "application/json");
  });
  if (opt_.port == 0) {
    port_ = http_->bind_to_any_port(opt_.host);
    if (port_ <= 0) return error_status("trajectory API: cannot bind any port on " + opt_.host);
  } else {
    if (!http_->bind_to_port(opt_.host, opt_.port))
      return error_status("trajectory API: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                          " (in use? pick another port, or 0 for any free one)");
    port_ = opt_.port;
  }
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return ok_status();
}

void TrajectoryApiServer::stop() {
  if (!http_) return;
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace grpo
