// The "http" reward against an in-process cpp-httplib server: request shape,
// batching, single mode, the concurrency limit, timeouts, retries on 5xx,
// malformed bodies and both on_failure modes. Expected scores come from the
// rule the test server applies (len(completion) + 0.5 * metadata.row.level),
// evaluated here on the inputs.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "env/remote_reward.h"
#include "remote_test_util.h"

namespace grpo {
namespace {

using json = nlohmann::json;
using namespace remote_test;

// Serves POST /score with a handler; stops on destruction.
struct TestServer {
  httplib::Server srv;
  std::thread th;
  int port = 0;
  std::mutex mu;
  std::vector<json> bodies;      // every request body, in arrival order
  std::vector<std::string> auth;  // the Authorization header of each request
  std::atomic<int> in_flight{0}, max_in_flight{0}, n_requests{0};

  explicit TestServer(std::function<void(const json&, httplib::Response&, int)> handler) {
    srv.Post("/score", [this, handler](const httplib::Request& req, httplib::Response& res) {
      const int now = ++in_flight;
      int prev = max_in_flight.load();
      while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {}
      const int k = n_requests++;
      json body = json::parse(req.body, nullptr, false);
      {
        std::lock_guard<std::mutex> lock(mu);
        bodies.push_back(body);
        auth.push_back(req.get_header_value("Authorization") + "|" + req.get_header_value("X-Team"));
      }
      handler(body, res, k);
      --in_flight;
    });
    port = srv.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { srv.listen_after_bind(); });
    for (int i = 0; i < 500 && !srv.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~TestServer() {
    srv.stop();
    th.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/score"; }
};

bool item_ok(const json& it) {
  return it.is_object() && it.contains("prompt") && it["prompt"].is_string() && it.contains("completion") &&
         it["completion"].is_string() && it.contains("answer") && it["answer"].is_string() && it.contains("metadata") &&
         it["metadata"].contains("id") && it["metadata"].contains("question") && it["metadata"].contains("n_tokens") &&
         it["metadata"].contains("truncated") && it["metadata"].contains("row") && it["metadata"]["row"].contains("level");
}

double rule(const json& it) { return double(it["completion"].get<std::string>().size()) + 0.5 * it["metadata"]["row"]["level"].get<double>(); }

// The well-behaved server: batch and single shapes, 400 for a bad item.
void good_handler(const json& body, httplib::Response& res, int) {
  json out;
  if (body.contains("items")) {
    out["scores"] = json::array();
    for (const auto& it : body["items"]) {
      if (!item_ok(it)) return res.set_content(R"({"error":"bad item"})", "application/json"), void(res.status = 400);
      out["scores"].push_back(rule(it));
    }
  } else {
    if (!item_ok(body)) return res.set_content(R"({"error":"bad item"})", "application/json"), void(res.status = 400);
    out["score"] = rule(body);
  }
  res.set_content(out.dump(), "application/json");
}

Batch make_batch(int n) {
  Batch b;
  for (int i = 0; i < n; ++i) b.add("prompt " + std::to_string(i), std::string(size_t(i % 5), 'x') + "<answer>4</answer>", "4");
  return b;
}

double expected(const Batch& b, size_t i) { return double(b.completions[i].size()) + 0.5 * double(i); }

std::unique_ptr<RewardFunction> make(json params) {
  auto fn = reward_make({"http", 1.0, std::move(params)});
  EXPECT_TRUE(fn.ok()) << fn.status().message();
  return fn.ok() ? std::move(fn).value() : nullptr;
}

TEST(HttpReward, BatchesScoresAndSendsHeaders) {
  TestServer s(good_handler);
  setenv("GRPO_TEST_HTTP_KEY", "sekrit", 1);
  auto fn = make({{"url", s.url()}, {"batch_size", 4}, {"max_concurrency", 2}, {"headers", {{"X-Team", "blue"}}},
                  {"api_key_env", "GRPO_TEST_HTTP_KEY"}});
  ASSERT_TRUE(fn);
  Batch b = make_batch(10);
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(out[i], float(expected(b, i))) << i;
  EXPECT_EQ(failed, 0);
  std::vector<size_t> sizes;
  for (const auto& body : s.bodies) sizes.push_back(body["items"].size());
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<size_t>{2, 4, 4}));
  for (const auto& a : s.auth) EXPECT_EQ(a, "Bearer sekrit|blue");
  const json& first = s.bodies[0]["items"][0];
  EXPECT_EQ(first["metadata"]["n_tokens"].get<int64_t>(), int64_t(first["completion"].get<std::string>().size()));
}

TEST(HttpReward, SingleModePostsOneItemPerRequest) {
  TestServer s(good_handler);
  auto fn = make({{"url", s.url()}, {"mode", "single"}});
  Batch b = make_batch(5);
  std::vector<float> out;
  int64_t failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  for (size_t i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(out[i], float(expected(b, i)));
  EXPECT_EQ(s.n_requests.load(), 5);
  for (const auto& body : s.bodies) EXPECT_FALSE(body.contains("items"));
}

TEST(HttpReward, ConcurrencyLimitIsObserved) {
  TestServer s([](const json& body, httplib::Response& res, int k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    good_handler(body, res, k);
  });
  auto fn = make({{"url", s.url()}, {"batch_size", 1}, {"max_concurrency", 3}});
  Batch b = make_batch(12);
  std::vector<float> out;
  int64_t failed = 0;
  ASSERT_TRUE(fn->compute_batch(b.inputs(), &out, &failed).ok());
  for (size_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(out[i], float(expected(b, i)));
  EXPECT_LE(s.max_in_flight.load(), 3);
  EXPECT_GE(s.max_in_flight.load(), 2) << "requests were not sent concurrently";
}

TEST(HttpReward, TimeoutIsAnErrorNamingTheReward) {
  TestServer s([](const json& body, httplib::Response& res, int k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    good_handler(body, res, k);
  });
  auto fn = make({{"url", s.url()}, {"timeout", 0.2}, {"retries", 0}});
  Batch b = make_batch(2);
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("reward 'http' (POST " + s.url() + ")"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no response"), std::string::npos) << st.message();
}

TEST(HttpReward, RetriesServerErrorsWithBackoff) {
  TestServer s([](const json& body, httplib::Response& res, int k) {
    if (k < 2) return res.set_content("overloaded", "text/plain"), void(res.status = 503);
    good_handler(body, res, k);
  });
  auto fn = make({{"url", s.url()}, {"retries", 2}, {"backoff", 0.01}});
  Batch b = make_batch(3);
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(s.n_requests.load(), 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(out[i], float(expected(b, i)));
}

TEST(HttpReward, GivesUpAfterRetriesAndDoesNotRetryClientErrors) {
  {
    TestServer s([](const json&, httplib::Response& res, int) { res.set_content("boom", "text/plain"), res.status = 500; });
    auto fn = make({{"url", s.url()}, {"retries", 1}, {"backoff", 0.01}});
    Batch b = make_batch(2);
    std::vector<float> out;
    int64_t failed = 0;
    Status st = fn->compute_batch(b.inputs(), &out, &failed);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("HTTP 500: boom (attempt 2 of 2)"), std::string::npos) << st.message();
    EXPECT_EQ(s.n_requests.load(), 2);
  }
  {
    TestServer s([](const json&, httplib::Response& res, int) { res.set_content("no such route", "text/plain"), res.status = 404; });
    auto fn = make({{"url", s.url()}, {"retries", 3}, {"backoff", 0.01}});
    Batch b = make_batch(2);
    std::vector<float> out;
    int64_t failed = 0;
    Status st = fn->compute_batch(b.inputs(), &out, &failed);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("HTTP 404"), std::string::npos) << st.message();
    EXPECT_EQ(s.n_requests.load(), 1);
  }
}

TEST(HttpReward, MalformedBodiesAreErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"this is not json", "not JSON"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"score": 1})", "no array \"scores\""},
      {R"({"scores": [1]})", "1 scores for 2 items"},
      {R"({"scores": [1, "x"]})", "scores[1] = \"x\" is not a finite number"},
  };
  for (const auto& [body, why] : cases) {
    TestServer s([body = body](const json&, httplib::Response& res, int) { res.set_content(body, "application/json"); });
    auto fn = make({{"url", s.url()}, {"retries", 2}, {"backoff", 0.01}});
    Batch b = make_batch(2);
    std::vector<float> out;
    int64_t failed = 0;
    Status st = fn->compute_batch(b.inputs(), &out, &failed);
    ASSERT_FALSE(st.ok()) << body;
    EXPECT_NE(st.message().find("malformed response"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
    EXPECT_EQ(s.n_requests.load(), 1) << "a malformed body is not retried";
  }
}

TEST(HttpReward, OnFailureZeroScoresZeroAndCounts) {
  // Items whose completion starts with "bad" get a 500 (batch_size 1, so per item).
  TestServer s([](const json& body, httplib::Response& res, int k) {
    if (body["completion"].get<std::string>().rfind("bad", 0) == 0) return res.set_content("nope", "text/plain"), void(res.status = 500);
    good_handler(body, res, k);
  });
  auto fn = make({{"url", s.url()}, {"mode", "single"}, {"retries", 1}, {"backoff", 0.0}, {"on_failure", "zero"}});
  Batch b;
  b.add("p", "good one", "1");
  b.add("p", "bad one", "1");
  b.add("p", "fine", "1");
  b.add("p", "bad again", "1");
  std::vector<float> out;
  int64_t failed = 0;
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(failed, 2);
  EXPECT_FLOAT_EQ(out[0], 8.0f);         // "good one": 8 chars, level 0
  EXPECT_FLOAT_EQ(out[1], 0.0f);
  EXPECT_FLOAT_EQ(out[2], 4.0f + 1.0f);  // "fine": 4 chars, level 2
  EXPECT_FLOAT_EQ(out[3], 0.0f);
  EXPECT_EQ(s.n_requests.load(), 6);  // 2 good + 2 bad x 2 attempts
}

TEST(HttpReward, UnreachableServerIsAnErrorOrAZero) {
  // Bind a port, then close the server, so nothing listens there.
  int port;
  {
    TestServer s(good_handler);
    port = s.port;
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/score";
  Batch b = make_batch(3);
  std::vector<float> out;
  int64_t failed = 0;
  auto fn = make({{"url", url}, {"retries", 0}});
  Status st = fn->compute_batch(b.inputs(), &out, &failed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no response"), std::string::npos) << st.message();
  auto zero = make({{"url", url}, {"retries", 0}, {"on_failure", "zero"}});
  ASSERT_TRUE(zero->compute_batch(b.inputs(), &out, &failed).ok());
  EXPECT_EQ(failed, 3);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(HttpReward, ComposerAddsLocalAndRemoteScores) {
  TestServer s(good_handler);
  auto c = RewardComposer::make({{"correct", 2.0}, {"http", 0.5, {{"url", s.url()}, {"batch_size", 3}}}});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->has_remote());
  Batch b;
  b.add("p", "<answer>4</answer>", "4");
  b.add("p", "<answer>5</answer>", "4");
  auto r = c->compute_batch(b.inputs());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->values[0].values[0], 1.0f);
  EXPECT_FLOAT_EQ(r->values[1].values[0], 0.0f);
  EXPECT_FLOAT_EQ(r->values[0].values[1], 18.0f);  // 18 chars, level 0
  EXPECT_FLOAT_EQ(r->values[1].values[1], 18.5f);  // 18 chars, level 1
  EXPECT_DOUBLE_EQ(r->values[0].total, 2.0 * 1 + 0.5 * 18.0);
  EXPECT_DOUBLE_EQ(r->values[1].total, 0.5 * 18.5);
  EXPECT_EQ(r->n_failed, (std::vector<int64_t>{0, 0}));
}

TEST(HttpReward, ConfigErrorsNameTheProblem) {
  auto err = [](json p) {
    auto fn = reward_make({"http", 1.0, std::move(p)});
    return fn.ok() ? std::string("ok") : fn.status().message();
  };
  EXPECT_NE(err(json::object()).find("missing url"), std::string::npos);
  EXPECT_NE(err({{"url", "ftp://x"}}).find("must start with http:// or https://"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h:99999/"}}).find("port '99999'"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"mode", "stream"}}).find("mode = \"stream\""), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"batch_size", 0}}).find("batch_size = 0: must be >= 1"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"max_concurrency", 0}}).find("max_concurrency"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"timeout", 0}}).find("timeout = 0"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"on_failure", "ignore"}}).find("on_failure = \"ignore\""), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"headers", {{"X", 1}}}}).find("expected a table of strings"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"headers", {{"Bad Name", "v"}}}}).find("header 'Bad Name'"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"api_key_env", "GRPO_TEST_SURELY_UNSET_VAR"}}).find("is not set"), std::string::npos);
  EXPECT_NE(err({{"url", "http://h/"}, {"urls", "x"}}).find("unknown parameter 'urls'"), std::string::npos);
  EXPECT_EQ(err({{"url", "http://h:8000/score"}}), "ok");
}

}  // namespace
}  // namespace grpo
