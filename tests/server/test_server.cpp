// `grpo serve` end to end in-process: the HTTP server over the engine service with
// the tiny byte-level model, through httplib's client. Checks against facts that do
// not come from the code under test: byte-level ids (token id = byte), the engine's
// own outputs run directly, seeds reproducing outputs, logprobs <= 0, the shapes
// the OpenAI and vLLM APIs define, and the KV pool returning to its initial size.
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "server_test_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

const std::string kPrompt = "What is 3 + 4?\n";

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = max_tokens;
  return p;
}

// The engine run directly (no service, no HTTP) on a fresh context.
RequestOutput direct(const std::vector<int32_t>& prompt, const SamplingParams& p, int sample = 0) {
  Context ctx(deterministic_cpu());
  Engine eng(ctx, arith().w, arith().tok.get(), test_engine_options());
  return eng.generate({prompt}, p).value()[size_t(sample)];
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

}  // namespace

TEST(Server, HealthModelsAndPolicyVersionHeader) {
  Served s;
  auto [st, j] = s.get("/health");
  EXPECT_EQ(st, 200);
  EXPECT_EQ(s.header("X-Policy-Version"), std::string("0"));
  auto [st2, m] = s.get("/v1/models");
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "arith-tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

TEST(Server, CompletionTextMatchesTheEngineAndCountsBytes) {
  Served s;
  const RequestOutput ref = direct(bytes_of(kPrompt), greedy(12));
  auto [st, j] = s.post("/v1/completions",
                        json{{"model", "arith-tiny"}, {"prompt", kPrompt}, {"max_tokens", 12}, {"temperature", 0},
                             {"return_token_ids", true}});
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], ref.text);
  EXPECT_EQ(ids_of(j["choices"][0]["token_ids"]), ref.completion_ids);
  EXPECT_EQ(ids_of(j["choices"][0]["prompt_token_ids"]), bytes_of(kPrompt));
  EXPECT_EQ(j["choices"][0]["finish_reason"], ref.finish_reason == FinishReason::length ? "length" : "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], ref.completion_ids.size());
  EXPECT_EQ(j["usage"]["total_tokens"], kPrompt.size() + ref.completion_ids.size());
  EXPECT_EQ(j["policy_version"], 0);
  EXPECT_TRUE(j["timing"].contains("ttft_s"));
}

TEST(Server, PromptListsIdsNAndSeedsReproduce) {
  Served s;
  const std::string p2 = "What is 9 - 2?\n";
  json body{{"prompt", json::array({bytes_of(kPrompt), p2})}, {"n", 3}, {"seed", 11}, {"temperature", 2.0},
            {"max_tokens", 16}, {"ignore_eos", true}, {"return_token_ids", true}};
  auto [st, a] = s.post("/v1/completions", body);
  ASSERT_EQ(st, 200) << a.dump();
  ASSERT_EQ(a["choices"].size(), 6u);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(a["choices"][k]["index"], k);
  // prompt-major: choices 0..2 are the first prompt's samples
  EXPECT_EQ(ids_of(a["choices"][0]["prompt_token_ids"]), bytes_of(kPrompt));
  EXPECT_EQ(ids_of(a["choices"][3]["prompt_token_ids"]), bytes_of(p2));
  std::set<std::vector<int32_t>> distinct;
  for (int k = 0; k < 3; ++k) distinct.insert(ids_of(a["choices"][k]["token_ids"]));
  EXPECT_GT(distinct.size(), 1u);  // sample j draws with key (seed, j)
  auto [st2, b] = s.post("/v1/completions", body);
  ASSERT_EQ(st2, 200);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(a["choices"][k]["token_ids"], b["choices"][k]["token_ids"]) << k;
  // Sample 1 of the first prompt is what the engine gives for the same seed alone.
  SamplingParams p;
  p.temperature = 2.f;
  p.seed = 11;
  p.n = 3;
  p.max_tokens = 16;
  p.ignore_eos = true;
  EXPECT_EQ(ids_of(a["choices"][1]["token_ids"]), direct(bytes_of(kPrompt), p, 1).completion_ids);
  body["seed"] = 12;
  auto [st3, c] = s.post("/v1/completions", body);
  ASSERT_EQ(st3, 200);
  EXPECT_NE(a["choices"][0]["token_ids"], c["choices"][0]["token_ids"]);
}

TEST(Server, StopStringCutsTheTextAndEchoPrependsThePrompt) {
  Served s;
  const RequestOutput ref = direct(bytes_of(kPrompt), greedy(20));
  ASSERT_GE(ref.text.size(), 4u) << ref.text;
  const std::string stop = ref.text.substr(2, 2);
  const std::string want = ref.text.substr(0, ref.text.find(stop));
  auto [st, j] = s.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}, {"stop", stop}});
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto [st2, e] = s.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}, {"echo", true}});
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(e["choices"][0]["text"], kPrompt + ref.text);
}

TEST(Server, CompletionLogprobsAreTheEnginesRawLogprobs) {
  Served s;
  SamplingParams p = greedy(10);
  p.top_logprobs = 3;
  const RequestOutput ref = direct(bytes_of(kPrompt), p);
  auto [st, j] = s.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 3}});
  ASSERT_EQ(st, 200) << j.dump();
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ref.completion_ids.size());
  std::string joined;
  size_t off = 0;
  for (size_t t = 0; t < ref.completion_ids.size(); ++t) {
    const float l = lp["token_logprobs"][t].get<float>();
    EXPECT_LE(l, 0.f);
    EXPECT_EQ(l, ref.logprobs_raw[t]) << t;
    EXPECT_EQ(lp["text_offset"][t].get<size_t>(), off);
    const std::string tok = lp["tokens"][t];
    off += tok.size();
    if (ref.completion_ids[t] < 256) {
      EXPECT_EQ(tok, std::string(1, char(ref.completion_ids[t])));  // byte-level vocabulary
      joined += tok;
    }
    // Greedy: the chosen token has the best logprob of its top list.
    float best = -1e30f;
    for (auto it = lp["top_logprobs"][t].begin(); it != lp["top_logprobs"][t].end(); ++it)
      best = std::max(best, it.value().get<float>());
    EXPECT_EQ(best, l);
    EXPECT_GE(lp["top_logprobs"][t].size(), 3u);
  }
  EXPECT_EQ(joined, ref.text);
}

TEST(Server, ChatRendersTheTemplateAndAnswersLikeTheRenderedCompletion) {
  Served s;
  json msgs = json::array({json{{"role", "system"}, {"content", "be brief"}}, json{{"role", "user"}, {"content", "2+2?"}}});
  const std::string rendered = "<system>be brief\n<user>2+2?\n<assistant>";
  auto [st, j] = s.post("/v1/chat/completions",
                        json{{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true},
                             {"top_logprobs", 2}, {"return_token_ids", true}});
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(ids_of(j["prompt_token_ids"]), bytes_of(rendered));
  const RequestOutput ref = direct(bytes_of(rendered), greedy(8));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(ids_of(j["choices"][0]["token_ids"]), ref.completion_ids);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), ref.completion_ids.size());
  for (size_t t = 0; t < content.size(); ++t) {
    EXPECT_EQ(content[t]["logprob"].get<float>(), ref.logprobs_raw[t]);
    EXPECT_EQ(content[t]["top_logprobs"].size(), 2u);
    if (ref.completion_ids[t] < 256) EXPECT_EQ(content[t]["bytes"], json::array({ref.completion_ids[t]}));
  }
  // chat_template_kwargs reach the template; add_generation_prompt = false drops the tag.
  auto [st2, t] = s.post("/tokenize", json{{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(st2, 200) << t.dump();
  EXPECT_EQ(ids_of(t["tokens"]), bytes_of("<system>be brief\n<user>2+2?\n<nothink><assistant>"));
  auto [st3, t2] = s.post("/tokenize", json{{"messages", msgs}, {"add_generation_prompt", false}});
  EXPECT_EQ(ids_of(t2["tokens"]), bytes_of("<system>be brief\n<user>2+2?\n"));
  // max_completion_tokens is the newer name of max_tokens.
  auto [st4, k] = s.post("/v1/chat/completions", json{{"messages", msgs}, {"max_completion_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(st4, 200);
  EXPECT_EQ(k["usage"]["completion_tokens"], 3);
}

TEST(Server, StreamingChunksRebuildTheNonStreamedAnswer) {
  Served s;
  const RequestOutput ref = direct(bytes_of(kPrompt), greedy(14));
  auto r = s.cli->Post("/v1/completions",
                       json{{"prompt", kPrompt}, {"max_tokens", 14}, {"temperature", 0}, {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}.dump(),
                       "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto data = sse_data(r->body);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  std::string finish;
  size_t n_token_chunks = 0;
  for (size_t k = 0; k + 1 < data.size(); ++k) {
    json c = json::parse(data[k]);
    EXPECT_EQ(c["object"], "text_completion");
    if (c["choices"].empty()) {
      EXPECT_EQ(c["usage"]["completion_tokens"], ref.completion_ids.size());  // the usage chunk
      continue;
    }
    ++n_token_chunks;
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(n_token_chunks, ref.completion_ids.size());  // one chunk per token
  EXPECT_EQ(text, ref.text);
  EXPECT_EQ(finish, ref.finish_reason == FinishReason::length ? "length" : "stop");

  // Chat: a role chunk first, then content deltas.
  json msgs = json::array({json{{"role", "user"}, {"content", "1+1?"}}});
  const RequestOutput cref = direct(bytes_of("<user>1+1?\n<assistant>"), greedy(10));
  auto rc = s.cli->Post("/v1/chat/completions",
                        json{{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}, {"stream", true}}.dump(),
                        "application/json");
  ASSERT_TRUE(rc);
  auto cd = sse_data(rc->body);
  ASSERT_GE(cd.size(), 2u);
  json first = json::parse(cd[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (size_t k = 1; k + 1 < cd.size(); ++k) content += json::parse(cd[k])["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(content, cref.text);
  EXPECT_EQ(cd.back(), "[DONE]");
}

TEST(Server, TokenizeAndDetokenizeFollowTheByteVocabulary) {
  Served s;
  auto [st, t] = s.post("/tokenize", json{{"prompt", "12 + 30 = ?"}});
  ASSERT_EQ(st, 200) << t.dump();
  EXPECT_EQ(ids_of(t["tokens"]), bytes_of("12 + 30 = ?"));
  EXPECT_EQ(t["count"], 11);
  EXPECT_EQ(t["max_model_len"], 2048);
  auto [st2, d] = s.post("/detokenize", json{{"tokens", bytes_of("hello")}});
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(d["prompt"], "hello");
  auto [st3, e] = s.post("/detokenize", json{{"tokens", json::array({1, 99999})}});
  EXPECT_EQ(st3, 400);
  EXPECT_EQ(e["error"]["param"], "tokens");
}

TEST(Server, VllmGenerateReturnsIdsLogprobsAndFinishReasonsInAtroposShape) {
  Served s;
  const auto ids = bytes_of(kPrompt);
  auto [st, j] = s.post("/generate", json{{"prompt", {{"prompt_token_ids", ids}}}, {"logprobs", 0}, {"n", 2}, {"seed", 3},
                                          {"max_tokens", 9}, {"temperature", 1.0}});
  ASSERT_EQ(st, 200) << j.dump();
  ASSERT_EQ(j["logprobs"].size(), 2u);
  ASSERT_EQ(j["finish_reasons"].size(), 2u);
  EXPECT_EQ(ids_of(j["prompt_token_ids"]), ids);
  SamplingParams p;
  p.seed = 3;
  p.n = 2;
  p.max_tokens = 9;
  for (int k = 0; k < 2; ++k) {
    const RequestOutput ref = direct(ids, p, k);
    // Atropos reads item[0] of each token entry: {"<id>": logprob}.
    std::vector<int32_t> got;
    for (size_t t = 0; t < j["logprobs"][k].size(); ++t) {
      const json& d = j["logprobs"][k][t][0];
      ASSERT_EQ(d.size(), 1u);
      got.push_back(std::stoi(d.begin().key()));
      EXPECT_EQ(d.begin().value().get<float>(), ref.logprobs_raw[t]);
      EXPECT_LE(d.begin().value().get<float>(), 0.f);
    }
    EXPECT_EQ(got, ref.completion_ids);
    EXPECT_EQ(ids_of(j["token_ids"][k]), ref.completion_ids);
    EXPECT_EQ(j["text"][k], ref.text);
  }
  EXPECT_EQ(j["prompt"], kPrompt);
}

TEST(Server, BadRequestsGetOpenAiErrorsNamingTheField) {
  ServerOptions so;
  so.max_tokens_limit = 100;
  so.max_n = 4;
  Served s(so);
  auto expect_error = [&](const std::string& path, const std::string& body, int status, const std::string& param) {
    auto r = s.cli->Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code"));
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param) << r->body;
    EXPECT_FALSE(r->get_header_value("X-Policy-Version").empty());
  };
  expect_error("/v1/completions", "{not json", 400, "");
  expect_error("/v1/completions", "[1,2]", 400, "");
  expect_error("/v1/completions", R"({"max_tokens": 4})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "a", "n": "x"})", 400, "n");
  expect_error("/v1/completions", R"({"prompt": "a", "n": 5})", 400, "n");
  expect_error("/v1/completions", R"({"prompt": "a", "max_tokens": 101})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "a", "max_tokens": -1})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "a", "temperature": -1})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "a", "top_p": 0})", 400, "top_p");
  expect_error("/v1/completions", R"({"prompt": [1, 2, 999]})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": []})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "a", "stop": [1]})", 400, "stop");
  expect_error("/v1/completions", R"({"prompt": "a", "logprobs": 1000})", 400, "logprobs");
  expect_error("/v1/completions", R"({"prompt": "a", "seed": "x"})", 400, "seed");
  expect_error("/v1/completions", R"({"prompt": "a", "model": "gpt-4"})", 404, "model");
  expect_error("/v1/completions", R"({"prompt": "a", "max_tokens": 1e300})", 400, "max_tokens");
  expect_error("/v1/chat/completions", R"({"messages": []})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400, "messages[0]");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs");
  expect_error("/generate", R"({"prompt": {"ids": [1]}})", 400, "prompt");
  expect_error("/v1/nothing", "{}", 404, "");
  expect_error("/v1/completions", "{\"prompt\": " + std::string(100, '[') + std::string(100, ']') + "}", 400, "");
  expect_error("/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400, "");  // invalid UTF-8
  expect_error("/v1/completions", R"({"prompt": "a", "n": 1e20})", 400, "n");
  // Unknown fields are ignored; the request still works.
  auto [st, j] = s.post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}, {"user", "x"}, {"zzz", {1, 2}}});
  EXPECT_EQ(st, 200) << j.dump();
}

TEST(Server, ApiKeyIsRequiredEverywhereButHealth) {
  ServerOptions so;
  so.api_key = "sekret";
  Served s(so);
  json body{{"prompt", "1+1?\n"}, {"max_tokens", 2}};
  auto [st, j] = s.post("/v1/completions", body);
  EXPECT_EQ(st, 401);
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_EQ(s.post("/v1/completions", body, {{"Authorization", "Bearer wrong"}}).first, 401);
  EXPECT_EQ(s.get("/v1/models").first, 401);
  EXPECT_EQ(s.post("/v1/completions", body, {{"Authorization", "Bearer sekret"}}).first, 200);
  EXPECT_EQ(s.get("/health").first, 200);
}

TEST(Server, OversizedBodyGets413) {
  ServerOptions so;
  so.max_body_bytes = 4096;
  Served s(so);
  auto r = s.cli->Post("/v1/completions", json{{"prompt", std::string(10000, 'a')}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("max-body-bytes"), std::string::npos);
}

TEST(Server, FullQueueGets429WithRetryAfter) {
  ServerOptions so;
  so.max_queued_requests = 1;
  Served s(so);
  s.svc.pause_and_drain();  // nothing is admitted: the first request stays queued
  std::atomic<int> first_status{0};
  std::thread t([&] {
    httplib::Client c("127.0.0.1", s.http->port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}}.dump(), "application/json");
    first_status = r ? r->status : -1;
  });
  while (s.svc.gauges().n_pending < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto r = s.cli->Post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  s.svc.resume();
  t.join();
  EXPECT_EQ(first_status, 200);
  EXPECT_EQ(s.post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}}).first, 200);
}

TEST(Server, ClientThatLeavesAStreamAbortsItsRequestAndFreesItsBlocks) {
  Served s;
  const int free0 = s.eng.n_free_kv_blocks();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", kPrompt}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  int n_chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++n_chunks < 3; };
  auto r = s.cli->send(req);
  EXPECT_GE(n_chunks, 3);
  s.cli->stop();
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const ServiceGauges g = s.svc.gauges();
    if (g.n_active_requests == 0 && g.n_free_kv_blocks == free0) break;
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "the aborted request kept its blocks";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lk(s.svc.metrics().mu);
  EXPECT_EQ(s.svc.metrics().requests_aborted, 1u);
  EXPECT_EQ(s.svc.metrics().finish_reasons.count("length"), 0u);  // it did not run to its end
}

TEST(Server, ConcurrentClientsGetWhatEachRequestGetsAlone) {
  Served s;
  const int kClients = 12;
  auto body = [](int i) {
    return json{{"prompt", "What is " + std::to_string(i % 9 + 1) + " + " + std::to_string(i % 5 + 1) + "?\n"},
                {"seed", 100 + i}, {"temperature", 1.0}, {"max_tokens", 12 + i % 7}, {"return_token_ids", true},
                {"n", 1 + i % 3}};
  };
  std::vector<json> alone(kClients), together(kClients);
  for (int i = 0; i < kClients; ++i) alone[i] = s.post("/v1/completions", body(i)).second;
  std::vector<std::thread> ts;
  for (int i = 0; i < kClients; ++i)
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.http->port());
      c.set_read_timeout(120, 0);
      auto r = c.Post("/v1/completions", body(i).dump(), "application/json");
      if (r && r->status == 200) together[i] = json::parse(r->body);
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(together[i].is_object()) << i;
    ASSERT_EQ(together[i]["choices"].size(), alone[i]["choices"].size()) << i;
    for (size_t k = 0; k < alone[i]["choices"].size(); ++k)
      EXPECT_EQ(together[i]["choices"][k]["token_ids"], alone[i]["choices"][k]["token_ids"]) << i << "/" << k;
  }
  EXPECT_EQ(s.eng.n_free_kv_blocks(), s.eng.n_kv_blocks());
}

TEST(Server, PolicyVersionFollowsTheWeightsBetweenPauses) {
  Served s;
  s.svc.pause_and_drain();
  s.svc.set_policy_version(7);
  s.eng.reset_prefix_cache();
  s.svc.resume();
  auto [st, j] = s.post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}});
  ASSERT_EQ(st, 200);
  EXPECT_EQ(j["policy_version"], 7);
  EXPECT_EQ(s.header("X-Policy-Version"), std::string("7"));
}

TEST(Server, ServiceGenerateEqualsEngineGenerate) {
  Served s;
  SamplingParams p;
  p.seed = 9;
  p.n = 2;
  p.max_tokens = 10;
  const std::vector<std::vector<int32_t>> prompts = {bytes_of(kPrompt), bytes_of("What is 5 - 1?\n")};
  auto got = s.svc.generate(prompts, p);
  ASSERT_TRUE(got.ok()) << got.status().message();
  Context ctx(deterministic_cpu());
  Engine eng(ctx, arith().w, arith().tok.get(), test_engine_options());
  auto want = eng.generate(prompts, p).value();
  ASSERT_EQ(got.value().size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got.value()[k].completion_ids, want[k].completion_ids) << k;
    EXPECT_EQ(got.value()[k].sample_index, want[k].sample_index);
  }
}

TEST(Server, MetricsPageCountsRequestsTokensAndLatencies) {
  Served s;
  auto [st, j] = s.post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 6}, {"ignore_eos", true}, {"n", 2}});
  ASSERT_EQ(st, 200);
  s.post("/v1/completions", json{{"prompt", "x"}, {"n", "bad"}});
  auto r = s.cli->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  const std::string& m = r->body;
  auto value = [&](const std::string& series) {
    const size_t p = m.find("\n" + series + " ");
    EXPECT_NE(p, std::string::npos) << series;
    return p == std::string::npos ? -1.0 : std::stod(m.substr(p + series.size() + 2));
  };
  EXPECT_EQ(value("grpo_generation_tokens_total"), 12);  // 2 samples x 6 forced tokens
  EXPECT_EQ(value("grpo_prompt_tokens_total"), double(kPrompt.size()));
  EXPECT_EQ(value("grpo_requests_finished_total"), 1);
  EXPECT_EQ(value("grpo_time_to_first_token_seconds_count"), 2);  // per sample
  EXPECT_EQ(value("grpo_inter_token_latency_seconds_count"), 10);  // 5 gaps per sample
  EXPECT_EQ(value("grpo_e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(value("grpo_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 2);
  EXPECT_EQ(value("grpo_kv_cache_usage_perc"), 0);
  EXPECT_EQ(value("grpo_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"), 1);
  EXPECT_EQ(value("grpo_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"), 1);
  EXPECT_EQ(value("grpo_request_success_total{finished_reason=\"length\"}"), 2);
}

TEST(Server, StreamedSamplesAndLogprobsEqualTheNonStreamedOnes) {
  Served s;
  json body{{"prompt", kPrompt}, {"n", 2}, {"seed", 5}, {"temperature", 1.5}, {"max_tokens", 10}, {"logprobs", 1},
            {"ignore_eos", true}};
  auto [st, whole] = s.post("/v1/completions", body);
  ASSERT_EQ(st, 200) << whole.dump();
  body["stream"] = true;
  auto r = s.cli->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::vector<std::string> text(2);
  std::vector<std::vector<float>> lps(2);
  std::vector<std::vector<size_t>> offs(2);
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    json c = json::parse(d);
    const int i = c["choices"][0]["index"];
    ASSERT_TRUE(i == 0 || i == 1);
    text[size_t(i)] += c["choices"][0]["text"].get<std::string>();
    lps[size_t(i)].push_back(c["choices"][0]["logprobs"]["token_logprobs"][0].get<float>());
    offs[size_t(i)].push_back(c["choices"][0]["logprobs"]["text_offset"][0].get<size_t>());
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(text[i], whole["choices"][i]["text"]) << i;
    EXPECT_EQ(json(lps[i]), whole["choices"][i]["logprobs"]["token_logprobs"]) << i;
    EXPECT_EQ(json(offs[i]), whole["choices"][i]["logprobs"]["text_offset"]) << i;
  }
}

TEST(Server, PauseResumePauseInQuickSuccessionNeverHangs) {
  Served s;
  for (int i = 0; i < 200; ++i) {
    s.svc.pause_and_drain();
    s.svc.resume();
  }
  s.svc.pause_and_drain();
  s.svc.resume();
  auto [st, j] = s.post("/v1/completions", json{{"prompt", "1+1?\n"}, {"max_tokens", 2}});
  EXPECT_EQ(st, 200);
  auto empty = s.svc.generate(std::vector<std::vector<int32_t>>{}, SamplingParams{});
  EXPECT_TRUE(empty.ok());
}
