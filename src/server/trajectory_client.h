// The trainer's side of an external Atropos API server (`[remote] url`): POST
// /register once, then GET /batch until a batch comes. Responses are asked for
// gzip-compressed (Accept-Encoding: gzip). Connection failures are errors that
// name the URL; the caller decides whether to wait and retry.
#pragma once
#include <memory>
#include <string>

#include "env/trajectory_source.h"
#include "train/run_config.h"

namespace httplib {
class Client;
}

namespace grpo {

class HttpTrajectorySource : public TrajectorySource {
 public:
  // url: "http://host:port" (a trailing slash is fine). timeout_s: per request.
  static Result<std::unique_ptr<HttpTrajectorySource>> connect(const std::string& url, double timeout_s = 30);
  ~HttpTrajectorySource() override;

  Status register_trainer(const nlohmann::json& registration) override;
  Result<std::optional<nlohmann::json>> next_batch() override;
  std::string wait_status() override;

 private:
  HttpTrajectorySource() = default;
  std::string url_;
  std::unique_ptr<httplib::Client> cli_;
};

// The source `grpo train` uses for data.env = "remote": a client of remote.url,
// or (url empty) a TrajectoryStore served on remote.host:remote.port by a
// TrajectoryApiServer that lives as long as the returned source. batch_size:
// sequences per step (sizes the default queue bound: 16 steps' worth).
Result<std::shared_ptr<TrajectorySource>> trajectory_source_make(const RemoteSection& rm, int64_t batch_size);

}  // namespace grpo
