// The trajectory API over real HTTP (server/trajectory_api.h): every route's
// status and field shapes as Atropos's server.py defines them, malformed posts,
// and gzip both ways checked on the raw bytes with zlib (not through httplib's
// own decompression).
#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include "server/trajectory_api.h"

using namespace grpo;
using json = nlohmann::json;

namespace {

std::string gzip_bytes(const std::string& in) {
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

std::string gunzip_bytes(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 32), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  std::string out;
  char buf[16384];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    out.append(buf, sizeof(buf) - z.avail_out);
  }
  EXPECT_EQ(rc, Z_STREAM_END);
  inflateEnd(&z);
  return out;
}

json group(int tag, int n, json env_id = nullptr) {
  json g{{"tokens", json::array()}, {"masks", json::array()}, {"scores", json::array()}};
  for (int i = 0; i < n; ++i) {
    g["tokens"].push_back({tag, 40 + i, 41, 42});
    g["masks"].push_back({-100, 40 + i, 41, 42});
    g["scores"].push_back(i % 2 ? 1.0 : 0.0);
  }
  g["env_id"] = env_id;
  return g;
}

struct Api {
  TrajectoryStore store;
  std::unique_ptr<TrajectoryApiServer> server;
  std::unique_ptr<httplib::Client> cli;
  explicit Api(TrajectoryStoreOptions o = {}) : store(o) {
    TrajectoryApiOptions ao;
    ao.port = 0;
    ao.n_threads = 4;
    server = std::make_unique<TrajectoryApiServer>(store, ao);
    Status st = server->start();
    EXPECT_TRUE(st.ok()) << st.message();
    cli = std::make_unique<httplib::Client>("127.0.0.1", server->port());
  }
  json get(const std::string& path, int want = 200) {
    auto r = cli->Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want) << path << ": " << r->body;
    return json::parse(r->body, nullptr, false);
  }
  json post(const std::string& path, const json& body, int want = 200) {
    auto r = cli->Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want) << path << ": " << r->body;
    return json::parse(r->body, nullptr, false);
  }
};

const json kRegistration{{"wandb_group", "grp"},      {"wandb_project", "proj"}, {"batch_size", 4},
                         {"max_token_len", 256},      {"checkpoint_dir", "/tmp/c"}, {"save_checkpoint_interval", 5},
                         {"starting_step", 0},        {"num_steps", 20}};

}  // namespace

TEST(TrajectoryApi, EveryEndpointAnswersAtroposShapes) {
  Api a;
  EXPECT_EQ(a.get("/"), (json{{"message", "AtroposLib API"}}));
  EXPECT_EQ(a.get("/info"), (json{{"batch_size", -1}, {"max_token_len", -1}}));
  json u = a.post("/register", kRegistration);
  EXPECT_TRUE(u.contains("uuid"));
  EXPECT_EQ(a.get("/info"), (json{{"batch_size", 4}, {"max_token_len", 256}}));
  EXPECT_EQ(a.get("/wandb_info"), (json{{"group", "grp"}, {"project", "proj"}, {"zmq_port", nullptr}}));
  EXPECT_EQ(a.post("/register-env", json{{"max_token_length", 256}, {"desired_name", "e"}, {"weight", 1.0}, {"group_size", 2}}),
            (json{{"status", "wait for trainer to start"}}));
  EXPECT_EQ(a.get("/batch"), (json{{"batch", nullptr}}));
  json e = a.post("/register-env", json{{"max_token_length", 256}, {"desired_name", "e"}, {"weight", 1.0}, {"group_size", 2}});
  EXPECT_EQ(e["status"], "success");
  EXPECT_EQ(e["env_id"], 0);
  EXPECT_EQ(e["wandb_name"], "e_0");
  for (const char* k : {"checkpoint_dir", "starting_step", "checkpoint_interval", "num_steps"}) EXPECT_TRUE(e.contains(k)) << k;
  EXPECT_EQ(a.post("/scored_data", group(1, 2, 0)), (json{{"status", "received"}}));
  EXPECT_EQ(a.post("/scored_data_list", json::array({group(2, 2, 0)})), (json{{"status", "received"}, {"groups_processed", 1}}));
  EXPECT_EQ(a.get("/status"), (json{{"current_step", 0}, {"queue_size", 2}}));
  json se = a.get("/status-env?env_id=0");
  for (const char* k : {"current_step", "queue_size", "unallocated_fraction", "self_queue_size", "max_group_size", "env_weight"})
    EXPECT_TRUE(se.contains(k)) << k;
  EXPECT_EQ(se["self_queue_size"], 2);
  // Atropos's BaseEnv sends the id as a GET body (aiohttp json=): the same answer,
  // and the kept-alive connection goes on (tests/server/test_http_conn.cpp has the bytes).
  httplib::Request req;
  req.method = "GET";
  req.path = "/status-env";
  req.body = json{{"env_id", 0}}.dump();
  req.set_header("Content-Type", "application/json");
  auto rs = a.cli->send(req);
  ASSERT_TRUE(rs);
  EXPECT_EQ(rs->status, 200) << rs->body;
  EXPECT_EQ(json::parse(rs->body, nullptr, false), se);
  EXPECT_EQ(a.get("/status-env?env_id=x", 400)["status"], "error");
  EXPECT_EQ(a.get("/latest_example")["tokens"], group(2, 2, 0)["tokens"]);
  json b = a.get("/batch");
  ASSERT_TRUE(b["batch"].is_array());
  ASSERT_EQ(b["batch"].size(), 2u);
  EXPECT_EQ(b["batch"][0]["tokens"][0][0], 1);
  EXPECT_EQ(b["batch"][1]["tokens"][0][0], 2);
  for (const char* k : {"tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
                        "inference_logprobs", "overrides", "group_overrides", "images", "env_id"})
    EXPECT_TRUE(b["batch"][0].contains(k)) << k;
  EXPECT_EQ(a.get("/status"), (json{{"current_step", 1}, {"queue_size", 0}}));
  EXPECT_EQ(a.post("/disconnect-env", json{{"env_id", 0}}), (json{{"status", "success"}}));
  auto rr = a.cli->Get("/reset_data");
  ASSERT_TRUE(rr);
  EXPECT_EQ(rr->status, 200);
  EXPECT_EQ(rr->body, "Reset successful");
  EXPECT_EQ(a.get("/info"), (json{{"batch_size", -1}, {"max_token_len", -1}}));
  EXPECT_EQ(a.get("/no-such-route", 404)["status"], "error");
}

TEST(TrajectoryApi, MalformedPostsAre400AndNothingIsQueued) {
  Api a;
  a.post("/register", kRegistration);
  json g = group(1, 2);
  g["masks"][0] = json::array({-100, 1});
  EXPECT_NE(a.post("/scored_data", g, 400)["message"].get<std::string>().find("masks[0]"), std::string::npos);
  g = group(1, 2);
  g["scores"][1] = "x";
  a.post("/scored_data", g, 400);
  g = group(1, 2);
  g.erase("masks");
  a.post("/scored_data", g, 400);
  a.post("/scored_data_list", json::array({group(2, 2), g}), 400);
  auto r = a.cli->Post("/scored_data", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(a.get("/status")["queue_size"], 0);
  EXPECT_EQ(a.store.counters().groups_received, 0);
}

TEST(TrajectoryApi, GzipRequestBodiesAndResponses) {
  Api a;
  a.post("/register", kRegistration);
  // Request: a gzip-compressed body with Content-Encoding: gzip.
  json list = json::array({group(1, 2), group(2, 2)});
  httplib::Headers h{{"Content-Encoding", "gzip"}};
  auto r = a.cli->Post("/scored_data_list", h, gzip_bytes(list.dump()), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(a.get("/status")["queue_size"], 2);
  // A body that claims gzip but is not: 400, nothing queued.
  auto bad = a.cli->Post("/scored_data", h, "plainly not gzip", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(a.get("/status")["queue_size"], 2);
  // Response: compressed when the client accepts gzip; inflate it ourselves.
  a.cli->set_decompress(false);
  auto b = a.cli->Get("/batch", httplib::Headers{{"Accept-Encoding", "gzip"}});
  ASSERT_TRUE(b);
  ASSERT_EQ(b->status, 200);
  ASSERT_EQ(b->get_header_value("Content-Encoding"), "gzip");
  json got = json::parse(gunzip_bytes(b->body), nullptr, false);
  ASSERT_TRUE(got.is_object());
  ASSERT_EQ(got["batch"].size(), 2u);
  EXPECT_EQ(got["batch"][0]["tokens"], list[0]["tokens"]);
  // And plain when it does not.
  auto p = a.cli->Get("/status");
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->get_header_value("Content-Encoding").empty());
  EXPECT_EQ(json::parse(p->body)["current_step"], 1);
}

TEST(TrajectoryApi, FullQueueAnswers503WithRetryAfter) {
  TrajectoryStoreOptions o;
  o.max_queued_sequences = 2;
  Api a(o);
  a.post("/register", kRegistration);
  a.post("/scored_data", group(1, 2));
  auto r = a.cli->Post("/scored_data", group(2, 2).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(a.get("/status")["queue_size"], 1);
}
