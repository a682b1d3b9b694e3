// ConnServer (server/http_conn.h) on the wire, through raw sockets so that nothing
// of httplib's client hides what the bytes do: GET bodies on kept-alive and
// pipelined connections (Atropos's GET /status-env), bodies the server refuses
// (413/411 with Connection: close, the response read in full, no reset), gzip GET
// bodies, and a non-streaming generation whose client closes its socket (aborted,
// KV blocks back, counted) while the server keeps answering others.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "server/trajectory_api.h"
#include "server_test_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// One TCP connection to 127.0.0.1, read and written by hand.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawConn() { close(); }
  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // One response with a Content-Length body; nullopt on timeout, EOF or a reset.
  std::optional<RawResponse> read_response(int timeout_ms = 20000) {
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill(timeout_ms)) return std::nullopt;
    RawResponse r;
    const std::string head = buf_.substr(0, head_end);
    if (head.rfind("HTTP/1.1 ", 0) != 0) return std::nullopt;
    r.status = std::atoi(head.c_str() + 9);
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos && pos < head.size()) {
      const size_t next = head.find("\r\n", pos + 2);
      const std::string line = head.substr(pos + 2, (next == std::string::npos ? head.size() : next) - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string k = line.substr(0, colon);
        std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return char(std::tolower(c)); });
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v[0] == ' ') v.erase(0, 1);
        r.headers[k] = v;
      }
      pos = next;
    }
    if (!r.headers.count("content-length")) return std::nullopt;
    const size_t n = size_t(std::stoull(r.headers["content-length"]));
    while (buf_.size() < head_end + 4 + n)
      if (!fill(timeout_ms)) return std::nullopt;
    r.body = buf_.substr(head_end + 4, n);
    buf_.erase(0, head_end + 4 + n);
    return r;
  }
  // True when the server closed the connection cleanly (EOF, no reset) within the time.
  bool closed_cleanly(int timeout_ms = 5000) {
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      char b[4096];
      const ssize_t n = ::recv(fd_, b, sizeof(b), 0);
      if (n == 0) return true;
      if (n < 0) return false;
    }
  }

 private:
  bool fill(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char b[8192];
    const ssize_t n = ::recv(fd_, b, sizeof(b), 0);
    if (n <= 0) return false;
    buf_.append(b, size_t(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

std::string get_with_body(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string plain_get(const std::string& path) { return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"; }

std::string gzip_of(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(in.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A trajectory API with a trainer, one environment (id 0) and `n_groups` queued groups of 2.
struct Api {
  TrajectoryStore store;
  std::unique_ptr<TrajectoryApiServer> server;
  explicit Api(int n_groups, size_t max_body = size_t(256) << 20) {
    TrajectoryApiOptions ao;
    ao.port = 0;
    ao.n_threads = 4;
    ao.max_body_bytes = max_body;
    server = std::make_unique<TrajectoryApiServer>(store, ao);
    Status st = server->start();
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(store.register_trainer(json{{"batch_size", 4}, {"max_token_len", 64}, {"num_steps", 10},
                                          {"save_checkpoint_interval", 0}, {"starting_step", 0},
                                          {"checkpoint_dir", "/tmp/c"}})
                  .status,
              200);
    store.batch();  // the trainer's first pull starts the run (environments wait for it)
    EXPECT_EQ(store.register_env(json{{"max_token_length", 64}, {"desired_name", "e"}, {"weight", 1.0},
                                      {"group_size", 2}, {"min_batch_allocation", nullptr}})
                  .status,
              200);
    for (int g = 0; g < n_groups; ++g)
      EXPECT_EQ(store.scored_data(json{{"tokens", {{1, 2}, {1, 3}}}, {"masks", {{-100, 2}, {-100, 3}}},
                                       {"scores", {0.0, 1.0}}, {"env_id", 0}})
                    .status,
                200);
  }
};

}  // namespace

TEST(HttpConn, GetStatusEnvWithAJsonBodyKeepsTheConnectionInStep) {
  Api a(3);
  RawConn c(a.server->port());
  ASSERT_TRUE(c.connected());
  // As aiohttp's session.get(url, json={"env_id": 0}) sends it, then a second request
  // on the same connection: with the body left unread it would parse as garbage.
  ASSERT_TRUE(c.send_all(get_with_body("/status-env", R"({"env_id": 0})")));
  auto r1 = c.read_response();
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->status, 200) << r1->body;
  EXPECT_NE(r1->headers["connection"], "close");
  const json j1 = json::parse(r1->body, nullptr, false);
  ASSERT_TRUE(j1.is_object()) << r1->body;
  EXPECT_EQ(j1["self_queue_size"], 3);  // three groups posted by env 0
  EXPECT_EQ(j1["queue_size"], 3);
  ASSERT_TRUE(c.send_all(plain_get("/status")));
  auto r2 = c.read_response();
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->status, 200) << r2->body;
  EXPECT_EQ(json::parse(r2->body), (json{{"current_step", 0}, {"queue_size", 3}}));
  // The query form answers the same.
  ASSERT_TRUE(c.send_all(plain_get("/status-env?env_id=0")));
  auto r3 = c.read_response();
  ASSERT_TRUE(r3);
  EXPECT_EQ(json::parse(r3->body), j1);
}

TEST(HttpConn, PipelinedGetBodiesAndPostsAnswerInOrder) {
  Api a(1);
  RawConn c(a.server->port());
  ASSERT_TRUE(c.connected());
  const std::string post_body = R"({"tokens": [[5, 6], [5, 7]], "masks": [[-100, 6], [-100, 7]], "scores": [1.0, 0.0], "env_id": 0})";
  // Three requests in one write: the bytes of the next request arrive with the body
  // of the current one, and must wait in the connection's buffer.
  const std::string all = get_with_body("/status-env", R"({"env_id": 0})") +
                          "POST /scored_data HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(post_body.size()) + "\r\n\r\n" + post_body +
                          get_with_body("/status-env", R"({"env_id": 0})");
  ASSERT_TRUE(c.send_all(all));
  auto r1 = c.read_response(), r2 = c.read_response(), r3 = c.read_response();
  ASSERT_TRUE(r1 && r2 && r3);
  EXPECT_EQ(json::parse(r1->body)["self_queue_size"], 1) << r1->body;
  EXPECT_EQ(json::parse(r2->body), (json{{"status", "received"}})) << r2->body;
  EXPECT_EQ(json::parse(r3->body)["self_queue_size"], 2) << r3->body;
}

TEST(HttpConn, GzipGetBodyIsInflated) {
  Api a(2);
  RawConn c(a.server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send_all(get_with_body("/status-env", gzip_of(R"({"env_id": 0})"), "Content-Encoding: gzip\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["self_queue_size"], 2);
  // Not gzip at all: 400 naming it, and the connection goes on (the body was read).
  ASSERT_TRUE(c.send_all(get_with_body("/status-env", R"({"env_id": 0})", "Content-Encoding: gzip\r\n")));
  auto bad = c.read_response();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("gzip"), std::string::npos) << bad->body;
  ASSERT_TRUE(c.send_all(plain_get("/status")));
  auto r2 = c.read_response();
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->status, 200);
}

TEST(HttpConn, OversizedGetBodyGets413AndACleanClose) {
  Api a(0, 4096);
  RawConn c(a.server->port());
  ASSERT_TRUE(c.connected());
  // Announces 1 MB and sends 200 KB of it: the server answers without reading it, and
  // must neither parse the rest as requests nor reset the connection under the answer.
  const std::string head = "GET /status-env HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048576\r\n\r\n";
  ASSERT_TRUE(c.send_all(head + std::string(200000, ' ')));
  auto r = c.read_response();
  ASSERT_TRUE(r) << "the 413 answer was lost";
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->headers["connection"], "close");
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  EXPECT_NE(j["message"].get<std::string>().find("4096"), std::string::npos) << r->body;
  EXPECT_TRUE(c.closed_cleanly());
}

TEST(HttpConn, ChunkedGetBodyGets411AndTheConnectionCloses) {
  Api a(0);
  RawConn c(a.server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send_all("GET /status-env HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "d\r\n{\"env_id\": 0}\r\n0\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 411);
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_NE(r->body.find("Content-Length"), std::string::npos) << r->body;
  EXPECT_TRUE(c.closed_cleanly());
}

TEST(HttpConn, NonStreamingClientThatClosesItsSocketAbortsAndFreesItsBlocks) {
  // 8 samples of 2000 tokens: far longer than the few hundred ms the abort may take.
  EngineOptions eo = test_engine_options();
  eo.n_kv_blocks = 4096;
  Served s(ServerOptions{}, eo);
  const int free0 = s.eng.n_free_kv_blocks();
  RawConn c(s.http->port());
  ASSERT_TRUE(c.connected());
  const std::string body =
      json{{"prompt", "What is 3 + 4?\n"}, {"max_tokens", 2000}, {"n", 8}, {"ignore_eos", true}}.dump();
  ASSERT_TRUE(c.send_all("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  auto t0 = std::chrono::steady_clock::now();
  while (s.svc.gauges().n_active_requests < 1) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "the request never started";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(s.eng.n_free_kv_blocks(), free0);
  c.close();
  t0 = std::chrono::steady_clock::now();
  for (;;) {
    const ServiceGauges g = s.svc.gauges();
    if (g.n_active_requests == 0 && g.n_free_kv_blocks == free0) break;
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
        << "the abandoned request kept running or kept its KV blocks";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lk(s.svc.metrics().mu);
    EXPECT_EQ(s.svc.metrics().requests_aborted, 1u);
    EXPECT_EQ(s.svc.metrics().finish_reasons.count("length"), 0u);  // it did not run to its end
    EXPECT_EQ((s.svc.metrics().http_requests[{"/v1/completions", 499}]), 1u);
  }
  // The /metrics page says the same, and the server goes on answering.
  auto page = s.cli->Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("grpo_requests_aborted_total 1\n"), std::string::npos);
  auto ok = s.post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 3}});
  EXPECT_EQ(ok.first, 200);
  EXPECT_EQ(ok.second["choices"][0]["finish_reason"], "length");
}

TEST(HttpConn, NonStreamingClientThatWaitsGetsItsAnswer) {
  // The socket probes between waits must not mistake a quiet client for a gone one.
  Served s;
  RawConn c(s.http->port());
  ASSERT_TRUE(c.connected());
  const std::string body = json{{"prompt", "What is 3 + 4?\n"}, {"max_tokens", 300}, {"ignore_eos", true}}.dump();
  ASSERT_TRUE(c.send_all("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  auto r = c.read_response(120000);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 300);
  std::lock_guard<std::mutex> lk(s.svc.metrics().mu);
  EXPECT_EQ(s.svc.metrics().requests_aborted, 0u);
}
