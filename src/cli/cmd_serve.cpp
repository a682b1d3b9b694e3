// `grpo serve`: the rollout engine behind an OpenAI- and vLLM-compatible HTTP
// server (src/server/, docs/serve.md). SIGTERM/SIGINT stop accepting generation
// requests, let the ones in flight finish, and exit 0.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/enum_flag.h"
#include "core/context.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "model/checkpoint.h"
#include "engine/engine_service.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace grpo;

std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

struct Args {
  std::string model, chat_template_file;
  Device device = Device::cpu;
  std::optional<DType> dtype;  // default: f32 on cpu, bf16 on cuda
  ServerOptions srv;
  EngineConfig engine;  // --block-size, --gpu-memory-utilization, ... (cli/engine_flags.h)
  int threads = 0;
  bool deterministic = false;
  uint64_t seed = 0;
  double drain_timeout_s = 300;
};

int run(const Args& a) {
  const char* cmd = "serve";
  ServerOptions so = a.srv;
  if (!a.chat_template_file.empty()) {
    std::ifstream f(a.chat_template_file);
    if (!f) return cli::fail(cmd, "--chat-template: cannot read " + a.chat_template_file);
    std::stringstream ss;
    ss << f.rdbuf();
    so.chat_template = ss.str();
  }
  if (so.served_model_name.empty()) {
    std::filesystem::path p(a.model);
    so.served_model_name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    if (so.served_model_name.empty()) so.served_model_name = a.model;
  }
  Status vs = so.validate();
  if (!vs.ok()) return cli::fail(cmd, vs.message());

  ContextOptions co;
  co.device = a.device;
  co.n_threads = a.threads;
  co.deterministic = a.deterministic;
  if (co.device == Device::cuda && !cuda_available())
    return cli::fail(cmd, "--device cuda: this build has no CUDA backend or no GPU is visible; use --device cpu");
  const DType dt = a.dtype.value_or(co.device == Device::cuda ? DType::bf16 : DType::f32);
  if (co.device == Device::cpu && dt != DType::f32) return cli::fail(cmd, "--dtype: the CPU backend runs f32 only");
  Context ctx(co);
  auto w = model_load(a.model, co.device, dt, &ctx);
  if (!w.ok()) return cli::fail(cmd, w.status().message());
  std::unique_ptr<Tokenizer> tok;
  auto t = Tokenizer::load(a.model);
  if (t.ok()) tok = std::make_unique<Tokenizer>(std::move(t).value());
  else GRPO_LOG_WARN("serve: no tokenizer (%s); only token-id prompts will work", t.status().message().c_str());

  // Sequences served at once by default: vLLM's max_num_seqs default.
  constexpr int kServeMaxNumSeqs = 256;
  if (Status fs = cli::engine_flags_validate(a.engine); !fs.ok()) return cli::fail(cmd, fs.message());
  auto draft = cli::engine_flags_load_draft(a.engine, w.value().config, ctx, dt);
  if (!draft.ok()) return cli::fail(cmd, draft.status().message());
  auto eo_r = cli::engine_flags_options(a.engine, co.device, w.value(), draft.value().get(), dt, kServeMaxNumSeqs);
  if (!eo_r.ok()) return cli::fail(cmd, eo_r.status().message());
  EngineOptions eo = eo_r.value();
  eo.seed = a.seed;

  Engine eng(ctx, w.value(), tok.get(), eo, nullptr, draft.value().get());
  EngineService svc(eng, ServiceOptions{so.max_queued_requests});
  HttpServer http(svc, tok.get(), so);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-stream is a failed write, not a dead server
  Status st = http.start();
  if (!st.ok()) return cli::fail(cmd, st.message());
  std::fprintf(stderr, "grpo serve: listening on http://%s:%d (model '%s', %s, %d KV blocks of %d, policy version %lld)\n",
               so.host.c_str(), http.port(), so.served_model_name.c_str(), device_name(co.device), eng.n_kv_blocks(),
               eo.block_size, (long long)svc.policy_version());
  std::fflush(stderr);
  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "grpo serve: signal %d: draining %d in-flight requests\n", int(g_signal), http.n_in_flight());
  http.drain_and_stop(a.drain_timeout_s);
  svc.stop();
  std::fprintf(stderr, "grpo serve: stopped\n");
  return 0;
}

cli::CommandRegistrar reg("serve", "Serve the model over an OpenAI- and vLLM-compatible HTTP API", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--model", a->model, "Hugging Face model directory")->required();
  sub->add_option("--host", a->srv.host, "Address to listen on (0.0.0.0: every interface)");
  sub->add_option("--port", a->srv.port, "Port (0: any free port; the chosen one is printed)");
  sub->add_option("--api-key", a->srv.api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  sub->add_option("--served-model-name", a->srv.served_model_name, "Model name clients send (default: the directory's name)");
  sub->add_option("--chat-template", a->chat_template_file, "Jinja chat template file overriding the tokenizer's");
  sub->add_option("--max-body-bytes", a->srv.max_body_bytes, "Largest request body (larger: 413)");
  sub->add_option("--max-prompt-tokens", a->srv.max_prompt_tokens, "Longest prompt in tokens (0: the context length)");
  sub->add_option("--max-tokens-limit", a->srv.max_tokens_limit, "Most completion tokens a request may ask for");
  sub->add_option("--max-n", a->srv.max_n, "Most samples per prompt (n)");
  sub->add_option("--max-queued-requests", a->srv.max_queued_requests, "Requests in flight at most (more: 429)");
  sub->add_option("--http-threads", a->srv.n_threads, "HTTP worker threads (0: max-queued-requests + 32)");
  sub->add_option("--read-timeout", a->srv.read_timeout_s, "Seconds a client may stall while sending a request");
  sub->add_option("--write-timeout", a->srv.write_timeout_s, "Seconds a client may stall while receiving");
  sub->add_option("--drain-timeout", a->drain_timeout_s, "Seconds SIGTERM waits for in-flight requests");
  sub->add_option("--seed", a->seed, "Engine seed for requests without a seed");
  cli::add_enum(sub, "--device", &a->device, cli::device_flag_names(), "Device");
  cli::add_enum(sub, "--dtype", &a->dtype, cli::engine_dtype_flag_names(), "Weights dtype", "f32 on cpu, bf16 on cuda");
  cli::add_engine_flags(sub, &a->engine);
  sub->add_flag("--deterministic", a->deterministic, "Batch-invariant kernels");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all)");
  return [a]() { return run(*a); };
});

}  // namespace
