// Shared fixture of the server tests: the tiny byte-level model models/arith-tiny
// (token id = byte value, EOS 256), an engine on a deterministic CPU context, the
// service and an HTTP server on a free port, and a client for it.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "engine/engine_service.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace grpo::test {

inline std::string arith_dir() { return std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny"; }

struct ArithModel {
  ModelWeights w;
  std::unique_ptr<Tokenizer> tok;
};

inline ArithModel& arith() {
  static ArithModel* m = [] {
    auto* a = new ArithModel;
    auto w = model_load(arith_dir(), Device::cpu, DType::f32);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    a->w = std::move(w).value();
    auto t = Tokenizer::load(arith_dir());
    GRPO_CHECK_MSG(t.ok(), t.status().message().c_str());
    a->tok = std::make_unique<Tokenizer>(std::move(t).value());
    return a;
  }();
  return *m;
}

// A plain template (the model ships none): role tags, then the generation prompt.
inline const char* kTestTemplate =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

inline EngineOptions test_engine_options() {
  EngineOptions o;
  o.block_size = 8;
  o.n_kv_blocks = 1024;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 2048;
  return o;
}

inline ContextOptions deterministic_cpu() {
  ContextOptions o;
  o.deterministic = true;
  o.n_threads = 1;
  return o;
}

struct Served {
  explicit Served(ServerOptions so = {}, EngineOptions eo = test_engine_options())
      : ctx(deterministic_cpu()), eng(ctx, arith().w, arith().tok.get(), eo), svc(eng, ServiceOptions{so.max_queued_requests}) {
    so.port = 0;
    if (so.served_model_name.empty()) so.served_model_name = "arith-tiny";
    if (so.chat_template.empty()) so.chat_template = kTestTemplate;
    http = std::make_unique<HttpServer>(svc, arith().tok.get(), so);
    Status st = http->start();
    GRPO_CHECK_MSG(st.ok(), st.message().c_str());
    cli = std::make_unique<httplib::Client>("127.0.0.1", http->port());
    cli->set_read_timeout(120, 0);
  }
  ~Served() {
    cli.reset();
    http->drain_and_stop(5);
    svc.stop();
  }
  // POSTs JSON; returns (status, parsed body or null).
  std::pair<int, json> post(const std::string& path, const json& body, const httplib::Headers& h = {}) {
    auto r = cli->Post(path.c_str(), h, body.dump(), "application/json");
    if (!r) return {-1, json(nullptr)};
    last_headers = r->headers;
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> get(const std::string& path, const httplib::Headers& h = {}) {
    auto r = cli->Get(path.c_str(), h);
    if (!r) return {-1, json(nullptr)};
    last_headers = r->headers;
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  std::string header(const std::string& key) const {
    auto it = last_headers.find(key);
    return it == last_headers.end() ? std::string() : it->second;
  }

  Context ctx;
  Engine eng;
  EngineService svc;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<httplib::Client> cli;
  httplib::Headers last_headers;
};

// The ids of a byte-level text (the independent fact the tokenizer must reproduce).
inline std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(int32_t(c));
  return v;
}

// Splits an SSE body into its data payloads, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

}  // namespace grpo::test
