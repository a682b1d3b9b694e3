// Several LoRA adapters served by name (server/lora_registry.h, docs/serve.md): the
// `model` field picks an adapter's engine slot, and each answer equals the one of an
// engine over the merged weights (W + scaling·B·A, formed by lora_merge_into)
// served alone; /v1/models lists them as vLLM does; an unknown model is a 404 error
// object; runtime load / unload (vLLM's endpoints) fill and free slots, unload waits
// for the requests already on the adapter, and an adapter loaded into a freed slot
// does not reuse the previous adapter's cached K/V. Start-up errors name the module.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "server_test_util.h"
#include "server/lora_registry.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("grpo_lora_serve_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d.string();
}

// An adapter with random A and B (B ≠ 0, so it changes the answers), written as PEFT files.
std::string write_adapter(const std::string& name, const ModelConfig& mc, int r, uint32_t seed,
                          std::vector<LoraTarget> targets = {}) {
  LoraConfig lc;
  lc.r = r;
  lc.alpha = float(2 * r);
  if (!targets.empty()) lc.targets = targets;
  LoraWeights lw = lora_allocate(mc, lc, Device::cpu, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& [n, t] : lw.params()) {
    const float sd = 0.6f / std::sqrt(float(t->dim(-1)));
    for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = sd * nd(rng);
  }
  const std::string dir = fresh_dir(name);
  Status st = lora_save(dir, lw);
  GRPO_CHECK_MSG(st.ok(), st.message().c_str());
  return dir;
}

const std::string kPrompt = "What is 3 + 4?\n";  // 15 bytes: one full KV block of 8 (prefix-cacheable)

// Greedy tokens and raw logprobs of an engine over `w` alone (no adapter slots).
struct Ref {
  std::vector<int32_t> ids;
  std::vector<float> lps;
};
Ref reference(const ModelWeights& w, int n_tokens) {
  Context ctx(deterministic_cpu());
  Engine eng(ctx, const_cast<ModelWeights&>(w), arith().tok.get(), test_engine_options());
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = n_tokens;
  p.ignore_eos = true;
  auto out = eng.generate({bytes_of(kPrompt)}, p);
  GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
  return Ref{out.value()[0].completion_ids, out.value()[0].logprobs};
}

Ref merged_reference(const std::string& adapter_dir, int n_tokens) {
  const ModelWeights& base = arith().w;
  auto l = lora_load(adapter_dir, base.config, Device::cpu, DType::f32);
  GRPO_CHECK_MSG(l.ok(), l.status().message().c_str());
  ModelWeights m = weights_allocate(base.config, Device::cpu, DType::f32);
  tensor_copy(m.arena, base.arena);
  lora_merge_into(m, l.value());
  return reference(m, n_tokens);
}

// The served answer's tokens and logprobs (/v1/completions with logprobs and token ids).
Ref served(const json& body) {
  Ref r;
  for (const auto& t : body["choices"][0]["token_ids"]) r.ids.push_back(t.get<int32_t>());
  for (const auto& v : body["choices"][0]["logprobs"]["token_logprobs"]) r.lps.push_back(v.get<float>());
  return r;
}

// Unmerged (base GEMM + adapter GEMMs) against merged weights: same greedy tokens,
// logprobs equal up to f32 rounding.
void expect_matches(const Ref& got, const Ref& want, const std::string& what) {
  ASSERT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.lps.size(), want.lps.size()) << what;
  for (size_t i = 0; i < got.lps.size(); ++i)
    EXPECT_NEAR(got.lps[i], want.lps[i], 2e-4 * (1 + std::fabs(want.lps[i]))) << what << " token " << i;
}

json completion(const std::string& model, int n_tokens, bool stream = false) {
  json j{{"prompt", kPrompt}, {"max_tokens", n_tokens}, {"temperature", 0}, {"ignore_eos", true},
         {"logprobs", 0},     {"return_token_ids", true}};
  if (!model.empty()) j["model"] = model;
  if (stream) j["stream"] = true;
  return j;
}

struct LoraServed {
  LoraServed(const std::vector<LoraModule>& mods, int max_loras, bool updates) : ctx(deterministic_cpu()) {
    LoraRegistryOptions lo;
    lo.max_loras = max_loras;
    lo.base_name = "arith-tiny";
    reg = std::make_unique<LoraRegistry>(arith().w.config, Device::cpu, DType::f32, lo);
    Status st = reg->load_initial(mods);
    GRPO_CHECK_MSG(st.ok(), st.message().c_str());
    EngineOptions eo = test_engine_options();
    eo.lora_slots = reg->engine_slots();
    eo.max_lora_rank = reg->max_lora_rank();
    eng = std::make_unique<Engine>(ctx, arith().w, arith().tok.get(), eo);
    svc = std::make_unique<EngineService>(*eng, ServiceOptions{});
    if (updates) reg->attach(svc.get());
    ServerOptions so;
    so.port = 0;
    so.served_model_name = "arith-tiny";
    so.model_path = arith_dir();
    so.chat_template = kTestTemplate;
    so.enable_lora_updates = updates;
    http = std::make_unique<HttpServer>(*svc, arith().tok.get(), so, reg.get());
    st = http->start();
    GRPO_CHECK_MSG(st.ok(), st.message().c_str());
  }
  ~LoraServed() {
    http->drain_and_stop(5);
    svc->stop();
  }
  std::pair<int, json> post(const std::string& path, const json& body, std::string* text = nullptr) {
    httplib::Client cli("127.0.0.1", http->port());
    cli.set_read_timeout(120, 0);
    auto r = cli.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, json(nullptr)};
    if (text) *text = r->body;
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> get(const std::string& path) {
    httplib::Client cli("127.0.0.1", http->port());
    auto r = cli.Get(path.c_str());
    if (!r) return {-1, json(nullptr)};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  Context ctx;
  std::unique_ptr<LoraRegistry> reg;
  std::unique_ptr<Engine> eng;
  std::unique_ptr<EngineService> svc;
  std::unique_ptr<HttpServer> http;
};

struct Adapters {
  std::string a, b;
  Ref base, ref_a, ref_b;
};
const int kTokens = 12;
const Adapters& adapters() {
  static Adapters* x = [] {
    auto* s = new Adapters;
    const ModelConfig& mc = arith().w.config;
    s->a = write_adapter("a", mc, 4, 1);
    s->b = write_adapter("b", mc, 8, 2, {LoraTarget::q, LoraTarget::v, LoraTarget::down});
    s->base = reference(arith().w, kTokens);
    s->ref_a = merged_reference(s->a, kTokens);
    s->ref_b = merged_reference(s->b, kTokens);
    return s;
  }();
  return *x;
}

}  // namespace

TEST(LoraServe, ModelPicksTheAdapterAndEqualsTheMergedModel) {
  const Adapters& ad = adapters();
  ASSERT_NE(ad.ref_a.ids, ad.base.ids) << "the test needs adapters that change the answer";
  ASSERT_NE(ad.ref_b.ids, ad.base.ids);
  ASSERT_NE(ad.ref_a.ids, ad.ref_b.ids);
  LoraServed s({{"a", ad.a, ""}, {"b", ad.b, ""}}, 2, false);
  for (const auto& [model, want] : std::vector<std::pair<std::string, Ref>>{
           {"a", ad.ref_a}, {"arith-tiny", ad.base}, {"b", ad.ref_b}, {"", ad.base}, {"a", ad.ref_a}}) {
    auto [st, j] = s.post("/v1/completions", completion(model, kTokens));
    ASSERT_EQ(st, 200) << j.dump();
    EXPECT_EQ(j["model"], model.empty() ? "arith-tiny" : model);  // the name asked for is echoed
    expect_matches(served(j), want, "model '" + model + "'");
  }
  // Chat and /generate pick the adapter the same way (the test template makes a chat
  // prompt of other ids, so only the echo and a change from the base are checked there).
  auto [cs, cj] = s.post("/v1/chat/completions", json{{"model", "b"}, {"messages", json::array({{{"role", "user"}, {"content", "3 + 4?"}}})},
                                                     {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(cs, 200) << cj.dump();
  EXPECT_EQ(cj["model"], "b");
  auto [gs, gj] = s.post("/generate", json{{"model", "a"}, {"prompt", {{"prompt_token_ids", bytes_of(kPrompt)}}},
                                            {"max_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}});
  ASSERT_EQ(gs, 200) << gj.dump();
  std::vector<int32_t> ids;
  for (const auto& t : gj["token_ids"][0]) ids.push_back(t.get<int32_t>());
  EXPECT_EQ(ids, ad.ref_a.ids);
  // A streamed answer on an adapter equals the whole one.
  httplib::Client cli("127.0.0.1", s.http->port());
  auto r = cli.Post("/v1/completions", completion("b", kTokens, true).dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  std::vector<int32_t> streamed;
  for (const auto& d : sse_data(r->body))
    if (d != "[DONE]") {
      json c = json::parse(d);
      EXPECT_EQ(c["model"], "b");
      for (const auto& t : c["choices"][0]["token_ids"]) streamed.push_back(t.get<int32_t>());
    }
  EXPECT_EQ(streamed, ad.ref_b.ids);
}

TEST(LoraServe, ConcurrentRequestsOnSeveralAdaptersEachMatchTheirMergedModel) {
  const Adapters& ad = adapters();
  LoraServed s({{"a", ad.a, ""}, {"b", ad.b, ""}}, 2, false);
  const std::vector<std::pair<std::string, const Ref*>> jobs = {
      {"a", &ad.ref_a}, {"b", &ad.ref_b}, {"arith-tiny", &ad.base}, {"b", &ad.ref_b},
      {"a", &ad.ref_a}, {"arith-tiny", &ad.base}, {"a", &ad.ref_a}, {"b", &ad.ref_b}};
  std::vector<Ref> got(jobs.size());
  std::vector<int> status(jobs.size(), 0);
  std::vector<std::thread> th;
  for (size_t i = 0; i < jobs.size(); ++i)
    th.emplace_back([&, i] {
      auto [st, j] = s.post("/v1/completions", completion(jobs[i].first, kTokens));
      status[i] = st;
      if (st == 200) got[i] = served(j);
    });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(status[i], 200) << i;
    expect_matches(got[i], *jobs[i].second, "request " + std::to_string(i) + " on '" + jobs[i].first + "'");
  }
  // Requests by model on /metrics.
  httplib::Client cli("127.0.0.1", s.http->port());
  auto m = cli.Get("/metrics");
  ASSERT_TRUE(m && m->status == 200);
  EXPECT_NE(m->body.find("grpo_requests_by_model_total{model=\"a\"} 3"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("grpo_lora_slots_total 2"), std::string::npos);
}

TEST(LoraServe, ModelsListsTheBaseAndEachAdapterAsVllmDoes) {
  const Adapters& ad = adapters();
  LoraServed s({{"a", ad.a, ""}, {"b", ad.b, ""}}, 3, false);
  auto [st, j] = s.get("/v1/models");
  ASSERT_EQ(st, 200);
  ASSERT_EQ(j["data"].size(), 3u) << j.dump();
  const json& base = j["data"][0];
  EXPECT_EQ(base["id"], "arith-tiny");
  EXPECT_EQ(base["root"], arith_dir());
  EXPECT_TRUE(base["parent"].is_null());
  EXPECT_GT(base["max_model_len"].get<int>(), 0);
  for (int k : {1, 2}) {
    const json& m = j["data"][size_t(k)];
    EXPECT_EQ(m["id"], k == 1 ? "a" : "b");
    EXPECT_EQ(m["object"], "model");
    EXPECT_EQ(m["root"], k == 1 ? ad.a : ad.b);
    EXPECT_EQ(m["parent"], "arith-tiny");
  }
}

TEST(LoraServe, UnknownModelIsA404ErrorObject) {
  const Adapters& ad = adapters();
  LoraServed s({{"a", ad.a, ""}}, 1, false);
  for (const char* path : {"/v1/completions", "/generate"}) {
    auto [st, j] = s.post(path, json{{"model", "c"}, {"prompt", kPrompt}, {"max_tokens", 2}});
    ASSERT_EQ(st, 404) << path;
    EXPECT_EQ(j["error"]["code"], "model_not_found");
    EXPECT_EQ(j["error"]["param"], "model");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("'a'"), std::string::npos) << j.dump();
  }
  // Runtime updates are off unless asked for.
  auto [ls, lj] = s.post("/v1/load_lora_adapter", json{{"lora_name", "b"}, {"lora_path", ad.b}});
  EXPECT_EQ(ls, 404);
  EXPECT_NE(lj["error"]["message"].get<std::string>().find("--enable-lora-updates"), std::string::npos);
}

TEST(LoraServe, RuntimeLoadAndUnloadFillAndFreeSlots) {
  const Adapters& ad = adapters();
  LoraServed s({}, 1, true);
  std::string text;
  auto [l1, j1] = s.post("/v1/load_lora_adapter", json{{"lora_name", "a"}, {"lora_path", ad.a}}, &text);
  ASSERT_EQ(l1, 200) << text;
  EXPECT_EQ(text, "Success: LoRA adapter 'a' added successfully.");
  auto [c1, r1] = s.post("/v1/completions", completion("a", kTokens));
  ASSERT_EQ(c1, 200) << r1.dump();
  expect_matches(served(r1), ad.ref_a, "a loaded at run time");
  auto [models_st, models] = s.get("/v1/models");
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "a");

  // Errors, each leaving the server as it was.
  auto err = [&](const json& body, const char* path, int want, const std::string& needle) {
    auto [st, j] = s.post(path, body);
    EXPECT_EQ(st, want) << body.dump() << " -> " << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << j.dump();
  };
  err({{"lora_name", "a"}, {"lora_path", ad.a}}, "/v1/load_lora_adapter", 400, "has already been loaded");
  err({{"lora_name", "b"}, {"lora_path", ad.b}}, "/v1/load_lora_adapter", 400, "no free LoRA slot");
  err({{"lora_name", "b"}}, "/v1/load_lora_adapter", 400, "Both 'lora_name' and 'lora_path' must be provided");
  err({{"lora_name", "arith-tiny"}, {"lora_path", ad.b}}, "/v1/load_lora_adapter", 400, "base model");
  err({{"lora_name", "c"}}, "/v1/unload_lora_adapter", 404, "cannot be found");
  err(json::object(), "/v1/unload_lora_adapter", 400, "'lora_name' needs to be provided");

  std::string utext;
  auto [u1, uj] = s.post("/v1/unload_lora_adapter", json{{"lora_name", "a"}}, &utext);
  ASSERT_EQ(u1, 200) << utext;
  EXPECT_EQ(utext, "Success: LoRA adapter 'a' removed successfully.");
  auto [c2, r2] = s.post("/v1/completions", completion("a", 2));
  EXPECT_EQ(c2, 404) << r2.dump();
  err({{"lora_name", "a"}}, "/v1/unload_lora_adapter", 404, "cannot be found");
  err({{"lora_name", "x"}, {"lora_path", ad.a + "-missing"}}, "/v1/load_lora_adapter", 404, "No adapter found");

  // A directory that is not an adapter of this base, with the slot free: 400 naming the file.
  ModelConfig other = arith().w.config;
  other.intermediate_size += 8;
  const std::string wrong = write_adapter("wrong", other, 4, 3);
  err({{"lora_name", "w"}, {"lora_path", wrong}}, "/v1/load_lora_adapter", 400, "adapter_model.safetensors");

  // b takes the freed slot. The prompt's first KV block was cached under a; b must not
  // reuse it (a fresh prefix-cache namespace per adapter put into a slot).
  auto [l2, j2] = s.post("/v1/load_lora_adapter", json{{"lora_name", "b"}, {"lora_path", ad.b}}, &text);
  ASSERT_EQ(l2, 200) << text;
  auto [c3, r3] = s.post("/v1/completions", completion("b", kTokens));
  ASSERT_EQ(c3, 200) << r3.dump();
  EXPECT_EQ(r3["timing"]["prefix_hit_tokens"], 0) << "b reused K/V that a computed";
  expect_matches(served(r3), ad.ref_b, "b in the slot a had");
  auto [c4, r4] = s.post("/v1/completions", completion("b", kTokens));
  EXPECT_GT(r4["timing"]["prefix_hit_tokens"].get<int>(), 0) << "b's own prefix is cached";
  expect_matches(served(r4), ad.ref_b, "b again");
}

// An unload must let the requests on the adapter finish on it: a long greedy stream on the
// adapter, running when the unload is sent, must still equal the adapter's own answer token
// for token (had the slot been freed under it, the rest would come from the base model, whose
// answer differs). Checked on the answer rather than on which client thread returns first,
// which depends on scheduling under load.
TEST(LoraServe, UnloadWaitsForTheRequestsOnTheAdapter) {
  const Adapters& ad = adapters();
  LoraServed s({{"a", ad.a, ""}}, 1, true);
  const int n_long = 400;
  auto [c_ref, ref] = s.post("/v1/completions", completion("a", n_long));
  auto [c_base, base] = s.post("/v1/completions", completion("", n_long));
  ASSERT_EQ(c_ref, 200);
  ASSERT_EQ(c_base, 200);
  const std::string want = ref["choices"][0]["text"].get<std::string>();
  ASSERT_NE(want, base["choices"][0]["text"].get<std::string>()) << "the premise: the adapter changes the answer";
  std::atomic<bool> stream_done{false};
  std::atomic<int> n_tokens{0};
  std::string streamed;
  std::thread streamer([&] {
    httplib::Client cli("127.0.0.1", s.http->port());
    cli.set_read_timeout(120, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = completion("a", n_long, true).dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        if (buf.compare(0, 7, "data: {") == 0) {
          const json c = json::parse(buf.substr(6, pos - 6));
          streamed += c["choices"][0]["text"].get<std::string>();
          ++n_tokens;
        }
        buf.erase(0, pos + 2);
      }
      return true;
    };
    cli.send(req);
    stream_done = true;
  });
  while (n_tokens == 0 && !stream_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool running_at_unload = !stream_done;
  std::string text;
  auto [u, uj] = s.post("/v1/unload_lora_adapter", json{{"lora_name", "a"}}, &text);
  streamer.join();
  EXPECT_TRUE(running_at_unload) << "the stream ended before the unload was sent; the test proves nothing";
  EXPECT_EQ(u, 200) << text;
  EXPECT_EQ(n_tokens, n_long) << "the stream on the adapter was cut";
  EXPECT_EQ(streamed, want) << "the stream on the adapter did not finish on the adapter";
}

TEST(LoraModules, ParsesNameEqualsPathAndVllmJson) {
  auto a = lora_module_parse("sql=/adapters/sql-lora");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().name, "sql");
  EXPECT_EQ(a.value().path, "/adapters/sql-lora");
  auto b = lora_module_parse(R"({"name": "x", "path": "/p/x=1", "base_model_name": "m"})");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b.value().path, "/p/x=1");
  EXPECT_EQ(b.value().base_model_name, "m");
  for (const std::string& bad : {"noequals", "=dir", "name=", "{\"name\": \"x\"}", "{bad json", "{\"name\": \"x\", \"path\": \"p\", \"rank\": 8}"}) {
    auto r = lora_module_parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--lora-modules '" + bad + "'"), std::string::npos) << r.status().message();
  }
}

TEST(LoraModules, StartUpErrorsNameTheAdapter) {
  const Adapters& ad = adapters();
  const ModelConfig& mc = arith().w.config;
  auto initial = [&](std::vector<LoraModule> mods, int max_loras, int max_rank = 0) {
    LoraRegistryOptions lo;
    lo.max_loras = max_loras;
    lo.max_lora_rank = max_rank;
    lo.base_name = "arith-tiny";
    LoraRegistry reg(mc, Device::cpu, DType::f32, lo);
    return reg.load_initial(mods);
  };
  ModelConfig other = mc;
  other.n_layers += 1;
  const std::string deeper = write_adapter("deeper", other, 4, 5);
  Status st = initial({{"deep", deeper, ""}}, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'deep' (" + deeper + ")"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("unexpected tensor"), std::string::npos) << st.message();
  st = initial({{"a", ad.a, ""}, {"b", ad.b, ""}}, 1);
  EXPECT_NE(st.message().find("--max-loras is 1"), std::string::npos) << st.message();
  st = initial({{"a", ad.a, ""}, {"a", ad.b, ""}}, 2);
  EXPECT_NE(st.message().find("given twice"), std::string::npos) << st.message();
  st = initial({{"arith-tiny", ad.a, ""}}, 1);
  EXPECT_NE(st.message().find("base model's served name"), std::string::npos) << st.message();
  st = initial({{"b", ad.b, ""}}, 1, 4);
  EXPECT_NE(st.message().find("rank r=8, above this server's --max-lora-rank 4"), std::string::npos) << st.message();
  st = initial({{"a", ad.a + "-missing", ""}}, 1);
  EXPECT_NE(st.message().find("No adapter found for " + ad.a + "-missing"), std::string::npos) << st.message();
  st = initial({{"a", ad.a, "another-base"}}, 1);
  EXPECT_NE(st.message().find("base_model_name 'another-base'"), std::string::npos) << st.message();
  EXPECT_TRUE(initial({{"a", ad.a, "arith-tiny"}, {"b", ad.b, ""}}, 2).ok());
}

// vLLM's load_inplace: the name switches to the new weights at once (staged in a free
// slot), the request already running finishes on the old ones, and the old slot is freed
// once it has.
TEST(LoraServe, LoadInplaceSwitchesTheNameWhileRunningRequestsFinishOnTheOldWeights) {
  const Adapters& ad = adapters();
  {
    LoraServed one({{"a", ad.a, ""}}, 1, true);
    auto [st, j] = one.post("/v1/load_lora_adapter", json{{"lora_name", "a"}, {"lora_path", ad.b}, {"load_inplace", true}});
    EXPECT_EQ(st, 400);
    EXPECT_NE(j["error"]["message"].get<std::string>().find("raise --max-loras by one"), std::string::npos) << j.dump();
  }
  LoraServed s({{"a", ad.a, ""}}, 2, true);
  const int n_long = 1000;
  std::atomic<int> n_tokens{0};
  std::atomic<bool> stream_done{false};
  std::vector<int32_t> streamed;
  std::thread streamer([&] {
    httplib::Client cli("127.0.0.1", s.http->port());
    cli.set_read_timeout(120, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = completion("a", n_long, true).dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        if (buf.compare(0, 7, "data: {") == 0) {
          ++n_tokens;
          const json chunk = json::parse(buf.substr(6, pos - 6));
          for (const auto& t : chunk["choices"][0]["token_ids"]) streamed.push_back(t.get<int32_t>());
        }
        buf.erase(0, pos + 2);
      }
      return true;
    };
    cli.send(req);
    stream_done = true;
  });
  while (n_tokens == 0 && !stream_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<int> load_status{0};
  std::thread loader([&] {
    auto [st, j] = s.post("/v1/load_lora_adapter", json{{"lora_name", "a"}, {"lora_path", ad.b}, {"load_inplace", true}});
    load_status = st;
  });
  // The name switches before the running stream ends.
  bool switched = false;
  for (int i = 0; i < 5000 && !switched && !stream_done; ++i) {
    auto [st, j] = s.get("/v1/models");
    switched = st == 200 && j["data"].size() == 2 && j["data"][1]["root"] == ad.b;
    if (!switched) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto [c, r] = s.post("/v1/completions", completion("a", kTokens));
  const bool stream_still_running = !stream_done;
  loader.join();
  streamer.join();
  EXPECT_EQ(load_status, 200);
  ASSERT_EQ(c, 200) << r.dump();
  if (switched) expect_matches(served(r), ad.ref_b, "'a' after load_inplace of b's weights");
  EXPECT_TRUE(switched && stream_still_running)
      << "the stream ended before the switch could be observed; the test proves nothing (lengthen n_long)";
  EXPECT_EQ(n_tokens, n_long);
  ASSERT_GE(streamed.size(), ad.ref_a.ids.size());
  EXPECT_EQ(std::vector<int32_t>(streamed.begin(), streamed.begin() + ptrdiff_t(ad.ref_a.ids.size())), ad.ref_a.ids)
      << "the running request must finish on the old weights";
  // The old weights' slot is free again: one more adapter fits beside 'a'.
  auto [l, lj] = s.post("/v1/load_lora_adapter", json{{"lora_name", "c"}, {"lora_path", ad.a}});
  EXPECT_EQ(l, 200) << lj.dump();
}
