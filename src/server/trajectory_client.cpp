// HTTP client of an Atropos API server (see trajectory_client.h).
#include "server/trajectory_client.h"

#include <httplib.h>

#include <cstdio>

#include "server/trajectory_api.h"

namespace grpo {

using json = nlohmann::json;

namespace {

Result<json> answer_json(const httplib::Result& r, const std::string& what, const std::string& url) {
  if (!r) return error_status(what + " at " + url + ": " + httplib::to_string(r.error()) + " (is the API server running?)");
  if (r->status != 200)
    return error_status(what + " at " + url + ": HTTP " + std::to_string(r->status) + ": " + r->body.substr(0, 300));
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return error_status(what + " at " + url + ": the answer is not JSON: " + r->body.substr(0, 200));
  return j;
}

}  // namespace

Result<std::unique_ptr<HttpTrajectorySource>> HttpTrajectorySource::connect(const std::string& url_in, double timeout_s) {
  std::string url = url_in;
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.rfind("http://", 0) != 0)
    return error_status("remote.url = \"" + url_in + "\": must start with http:// (e.g. http://127.0.0.1:8000)");
  std::unique_ptr<HttpTrajectorySource> s(new HttpTrajectorySource());
  s->url_ = url;
  s->cli_ = std::make_unique<httplib::Client>(url);
  if (!s->cli_->is_valid()) return error_status("remote.url = \"" + url_in + "\": not a usable URL");
  const time_t sec = time_t(timeout_s);
  const time_t usec = time_t((timeout_s - double(sec)) * 1e6);
  s->cli_->set_connection_timeout(sec, usec);
  s->cli_->set_read_timeout(sec, usec);
  s->cli_->set_write_timeout(sec, usec);
  s->cli_->set_decompress(true);
  return s;
}

HttpTrajectorySource::~HttpTrajectorySource() = default;

Status HttpTrajectorySource::register_trainer(const json& registration) {
  auto r = cli_->Post("/register", registration.dump(), "application/json");
  GRPO_ASSIGN_OR_RETURN(json j, answer_json(r, "POST /register", url_));
  if (!j.contains("uuid")) return error_status("POST /register at " + url_ + ": no uuid in the answer: " + j.dump());
  return ok_status();
}

Result<std::optional<json>> HttpTrajectorySource::next_batch() {
  auto r = cli_->Get("/batch", httplib::Headers{{"Accept-Encoding", "gzip"}});
  GRPO_ASSIGN_OR_RETURN(json j, answer_json(r, "GET /batch", url_));
  if (j.value("status", std::string()) == "error")
    return error_status("GET /batch at " + url_ + ": " + j.value("message", std::string("error")));
  if (!j.is_object() || !j.contains("batch"))
    return error_status("GET /batch at " + url_ + ": the answer has no 'batch' field: " + j.dump().substr(0, 200));
  if (j["batch"].is_null()) return std::optional<json>();
  if (!j["batch"].is_array()) return error_status("GET /batch at " + url_ + ": 'batch' is not a list of groups");
  return std::optional<json>(std::move(j["batch"]));
}

std::string HttpTrajectorySource::wait_status() {
  auto r = cli_->Get("/status");
  auto j = answer_json(r, "GET /status", url_);
  if (!j.ok()) return j.status().message();
  return url_ + ": current_step " + j.value().value("current_step", json()).dump() + ", " +
         j.value().value("queue_size", json()).dump() + " groups queued";
}

namespace {

// The store, its HTTP front and the in-process reader, released together
// (the server first: it reads the store).
class HostedSource : public TrajectorySource {
 public:
  HostedSource(TrajectoryStoreOptions so, TrajectoryApiOptions ao)
      : store_(so), server_(std::make_unique<TrajectoryApiServer>(store_, std::move(ao))), reader_(store_) {}
  ~HostedSource() override { server_.reset(); }
  Status start() { return server_->start(); }
  int port() const { return server_->port(); }
  Status register_trainer(const json& reg) override { return reader_.register_trainer(reg); }
  Result<std::optional<json>> next_batch() override { return reader_.next_batch(); }
  std::string wait_status() override { return reader_.wait_status(); }
  json checkpoint_state() override { return reader_.checkpoint_state(); }
  Status restore_checkpoint_state(const json& state) override { return reader_.restore_checkpoint_state(state); }

 private:
  TrajectoryStore store_;
  std::unique_ptr<TrajectoryApiServer> server_;
  StoreTrajectorySource reader_;
};

}  // namespace

Result<std::shared_ptr<TrajectorySource>> trajectory_source_make(const RemoteSection& rm, int64_t batch_size) {
  if (!rm.url.empty()) {
    GRPO_ASSIGN_OR_RETURN(std::unique_ptr<HttpTrajectorySource> c, HttpTrajectorySource::connect(rm.url));
    std::fprintf(stderr, "grpo train: pulling batches from the Atropos API at %s\n", rm.url.c_str());
    return std::shared_ptr<TrajectorySource>(std::move(c));
  }
  TrajectoryStoreOptions so;
  so.max_queued_sequences = rm.max_queued_sequences > 0 ? rm.max_queued_sequences : 16 * batch_size;
  TrajectoryApiOptions ao;
  ao.host = rm.host;
  ao.port = int(rm.port);
  auto h = std::make_shared<HostedSource>(so, ao);
  GRPO_TRY(h->start().with_context("[remote]"));
  std::fprintf(stderr, "grpo train: trajectory API (Atropos-compatible) on http://%s:%d; environments post scored groups there\n",
               rm.host.c_str(), h->port());
  return std::shared_ptr<TrajectorySource>(h);
}

}  // namespace grpo
