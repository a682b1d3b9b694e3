// The Atropos-compatible trajectory API over HTTP (docs/environments.md): the
// routes of NousResearch/atropos atroposlib/api/server.py mapped onto a
// TrajectoryStore (env/trajectory_store.h), which holds all the state and rules.
// Served by `grpo api` on its own and by `grpo train` when data.env = "remote".
//
// Compression, as Atropos: request bodies sent with Content-Encoding: gzip are
// inflated before parsing (a body that is not valid gzip gets 400), and JSON
// responses are gzip-compressed when the client sends Accept-Encoding: gzip
// (cpp-httplib, built with zlib, does both; ConnServer inflates GET bodies).
// GET /status-env takes {"env_id": n} as a JSON body (Atropos's signature: aiohttp
// sends it with Content-Length on a kept-alive connection, and ConnServer reads it;
// see server/http_conn.h) or as the query parameter ?env_id=n.
#pragma once
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "env/trajectory_store.h"

namespace httplib {
class Server;
}

namespace grpo {

struct TrajectoryApiOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (see port())
  size_t max_body_bytes = size_t(256) << 20;  // after inflation; larger: 413
  int n_threads = 16;
  Status validate() const;
};

class TrajectoryApiServer {
 public:
  // The store must outlive the server.
  TrajectoryApiServer(TrajectoryStore& store, TrajectoryApiOptions opt);
  ~TrajectoryApiServer();
  TrajectoryApiServer(const TrajectoryApiServer&) = delete;
  TrajectoryApiServer& operator=(const TrajectoryApiServer&) = delete;

  // Binds (port 0: any free port) and serves on a background thread.
  Status start();
  int port() const { return port_; }
  void stop();  // idempotent

 private:
  TrajectoryStore& store_;
  TrajectoryApiOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace grpo
