// `grpo serve`: the rollout engine behind an OpenAI- and vLLM-compatible HTTP
// server (src/server/, docs/serve.md). SIGTERM/SIGINT stop accepting generation
// requests, let the ones in flight finish, and exit 0. --watch DIR follows a
// training run through its checkpoints (server/weight_watch.h).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
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
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "model/checkpoint.h"
#include "model/lora.h"
#include "engine/engine_service.h"
#include "server/http_server.h"
#include "dist/ipc_bridge.h"
#include "dist/weight_broadcast.h"
#include "server/ipc_follow.h"
#include "server/lora_registry.h"
#include "server/weight_watch.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace grpo;

std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

struct Args {
  std::string model, chat_template_file, lora, watch, attach, receive;
  Device device = Device::cpu;
  std::optional<DType> dtype;  // default: f32 on cpu, bf16 on cuda
  int receive_rank = 1;
  double receive_timeout_s = 3600;
  double attach_poll_s = 0.001;
  double watch_interval_s = 1.0;
  ServerOptions srv;
  EngineConfig engine;  // --block-size, --gpu-memory-utilization, ... (cli/engine_flags.h)
  int threads = 0;
  bool deterministic = false;
  uint64_t seed = 0;
  double drain_timeout_s = 300;
  std::vector<std::string> lora_modules;  // NAME=DIR or {"name", "path"} (vLLM)
  int max_loras = 0;                      // 0: max(1, number of modules)
  int max_lora_rank = 0;                  // 0: max(16, the modules' largest r)
  bool enable_lora = false, enable_lora_updates = false;
};

int run(Args a) {
  const char* cmd = "serve";
  if (a.model.empty() == a.attach.empty())
    return cli::fail(cmd, a.model.empty() ? "give --model DIR (or --attach RUN_DIR to serve a running trainer's weights)"
                                          : "--attach serves the trainer's model: drop --model");
  std::unique_ptr<IpcAttachment> attach;
  if (!a.attach.empty()) {
    if (!a.watch.empty() || !a.lora.empty() || !a.receive.empty())
      return cli::fail(cmd, "--attach serves the trainer's live weights; it does not combine with --watch, --lora or --receive");
    if (!cuda_available())
      return cli::fail(cmd, "--attach: this build has no CUDA backend or no GPU is visible; the CUDA IPC bridge maps "
                            "the trainer's GPU memory (on the CPU, follow the run's checkpoints with --watch RUN_DIR)");
    if (a.device != Device::cuda) return cli::fail(cmd, "--attach serves from GPU memory: add --device cuda");
    auto at = IpcAttachment::open(a.attach);
    if (!at.ok()) return cli::fail(cmd, at.status().message());
    attach = std::move(at).value();
    a.model = attach->model_dir();
  }
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
  DType dt = a.dtype.value_or(co.device == Device::cuda ? DType::bf16 : DType::f32);
  if (co.device == Device::cpu && dt != DType::f32) return cli::fail(cmd, "--dtype: the CPU backend runs f32 only");
  Context ctx(co);
  Result<ModelWeights> w = attach ? Result<ModelWeights>(error_status("")) : model_load(a.model, co.device, dt, &ctx);
  if (!attach && !w.ok()) return cli::fail(cmd, w.status().message());
  if (attach && !a.dtype) dt = attach->weights().dtype;  // the trainer's arena is what there is to serve
  if (attach && attach->weights().dtype != dt)
    return cli::fail(cmd, std::string("--dtype: the trainer's weights are ") + dtype_name(attach->weights().dtype));
  ModelWeights& weights = attach ? attach->weights() : w.value();
  if (!(a.watch_interval_s > 0)) return cli::fail(cmd, "--watch-interval must be > 0 seconds");
  if (!(a.attach_poll_s > 0)) return cli::fail(cmd, "--attach-poll must be > 0 seconds");
  if (!a.watch.empty() && !a.receive.empty())
    return cli::fail(cmd, "--watch and --receive both replace the weights; choose one bridge");
  std::string lora_dir = a.lora;
  if (!a.watch.empty()) {
    auto latest = watch_find_latest(a.watch);
    if (!latest.ok()) return cli::fail(cmd, latest.status().message());
    // A LoRA run's checkpoints are adapters: the engine needs an adapter slot of
    // their shape from the start, and the newest one is as good as any.
    if (lora_dir.empty() && latest.value() && latest.value()->adapter) lora_dir = latest.value()->path;
  }
  std::unique_ptr<LoraWeights> lora;  // applied unmerged to every request; --watch rewrites it in place
  if (!lora_dir.empty()) {
    auto l = lora_load(lora_dir, weights.config, co.device, dt);
    if (!l.ok()) return cli::fail(cmd, l.status().with_context("--lora").message());
    lora = std::make_unique<LoraWeights>(std::move(l).value());
  }
  // Adapters served by name (`model`), each in an engine slot; the registry outlives the engine.
  std::unique_ptr<LoraRegistry> loras;
  if (!a.lora_modules.empty() || a.enable_lora || a.enable_lora_updates || a.max_loras != 0) {
    std::vector<LoraModule> mods;
    for (const auto& m : a.lora_modules) {
      auto pm = lora_module_parse(m);
      if (!pm.ok()) return cli::fail(cmd, pm.status().message());
      mods.push_back(pm.value());
    }
    if (a.max_loras < 0 || a.max_loras > 256) return cli::fail(cmd, "--max-loras must be in [1, 256]");
    if (a.max_lora_rank < 0) return cli::fail(cmd, "--max-lora-rank must be >= 1");
    LoraRegistryOptions lo;
    lo.max_loras = a.max_loras > 0 ? a.max_loras : std::max<int>(1, int(mods.size()));
    lo.max_lora_rank = a.max_lora_rank;
    lo.base_name = so.served_model_name;
    loras = std::make_unique<LoraRegistry>(weights.config, co.device, dt, lo);
    if (Status ls = loras->load_initial(mods); !ls.ok()) return cli::fail(cmd, ls.message());
  } else if (a.max_lora_rank != 0) {
    return cli::fail(cmd, "--max-lora-rank sizes LoRA slots: add --lora-modules, --enable-lora or --enable-lora-updates");
  }
  so.enable_lora_updates = a.enable_lora_updates;
  so.model_path = a.model;
  std::unique_ptr<Tokenizer> tok;
  auto t = Tokenizer::load(a.model);
  if (t.ok()) tok = std::make_unique<Tokenizer>(std::move(t).value());
  else GRPO_LOG_WARN("serve: no tokenizer (%s); only token-id prompts will work", t.status().message().c_str());

  // Sequences served at once by default: vLLM's max_num_seqs default.
  constexpr int kServeMaxNumSeqs = 256;
  if (Status fs = cli::engine_flags_validate(a.engine); !fs.ok()) return cli::fail(cmd, fs.message());
  auto draft = cli::engine_flags_load_draft(a.engine, weights.config, ctx, dt);
  if (!draft.ok()) return cli::fail(cmd, draft.status().message());
  auto eo_r = cli::engine_flags_options(a.engine, co.device, weights, draft.value().get(), dt, kServeMaxNumSeqs);
  if (!eo_r.ok()) return cli::fail(cmd, eo_r.status().message());
  EngineOptions eo = eo_r.value();
  eo.seed = a.seed;
  eo.lora = lora.get();
  if (loras) {
    eo.lora_slots = loras->engine_slots();
    eo.max_lora_rank = std::max(loras->max_lora_rank(), lora ? lora->cfg.r : 0);
  }

  Engine eng(ctx, weights, tok.get(), eo, nullptr, draft.value().get());
  EngineService svc(eng, ServiceOptions{so.max_queued_requests});
  if (loras && a.enable_lora_updates) loras->attach(&svc);
  std::unique_ptr<WeightWatcher> watcher;
  if (!a.watch.empty()) {
    watcher = std::make_unique<WeightWatcher>(svc, eng, ctx, weights, lora.get(), WatchOptions{a.watch, a.watch_interval_s});
    // The newest checkpoint is served from the first request on; a refused one ends
    // the start (nothing good to serve yet would be a silent surprise).
    auto first = watcher->poll();
    if (!first.ok()) return cli::fail(cmd, first.status().message());
    WatchStats ws = watcher->stats();
    if (first.value())
      std::fprintf(stderr, "grpo serve: --watch: loaded %s as policy version %lld in %.3f s\n", ws.loaded_path.c_str(),
                   (long long)ws.version, ws.last_stage_s + ws.last_pause_s + ws.last_swap_s);
    else
      std::fprintf(stderr, "grpo serve: --watch: no checkpoint in %s yet; serving --model until one appears\n",
                   a.watch.c_str());
    watcher->start();
  }
  // --receive: the NCCL bridge. The receiving thread owns the bridge and blocks inside
  // collectives that cannot be interrupted, so the process ends with _Exit rather than
  // destroying the objects it uses under it. A trainer that ends (version -1) or is lost
  // between updates leaves whole weights: the server keeps serving them and waits at the
  // same address for a trainer to (re)start (`grpo train --resume`), which joins again.
  // Only an update cut off midway (weights partly written) ends the server.
  std::atomic<bool> receiver_failed{false};
  const bool receiving = !a.receive.empty();
  if (receiving) {
    std::string host;
    int port = 0;
    if (Status ps = bridge_parse_addr(a.receive, "--receive", &host, &port); !ps.ok()) return cli::fail(cmd, ps.message());
    std::fprintf(stderr, "grpo serve: --receive: joining the trainer's weight bridge at %s as rank %d\n",
                 a.receive.c_str(), a.receive_rank);
    struct Bridge {
      std::unique_ptr<Communicator> comm;
      std::unique_ptr<WeightReceiver> rx;
    };
    Tensor arena = lora ? lora->arena : weights.arena;
    TransferPlan plan0 = lora ? transfer_plan(*lora, BroadcastOptions{}.bucket_bytes)
                              : transfer_plan(weights, BroadcastOptions{}.bucket_bytes);
    // Bucket size: the trainer's plan decides; the handshake compares plans.
    auto join = [host, port, rank = a.receive_rank, timeout = a.receive_timeout_s, arena, plan0]() -> Result<Bridge> {
      Bridge b;
      GRPO_ASSIGN_OR_RETURN(b.comm, bridge_connect_server(host, port, rank, timeout));
      b.rx = std::make_unique<WeightReceiver>(*b.comm, arena, plan0, BroadcastOptions{});
      GRPO_TRY(b.rx->handshake());
      return b;
    };
    auto first = join();
    if (!first.ok()) return cli::fail(cmd, first.status().message());
    auto bridge = std::make_shared<Bridge>(std::move(first).value());
    std::thread([bridge, join, addr = a.receive, &svc, &eng, &ctx, &receiver_failed] {
      while (true) {
        WeightReceiver& rx = *bridge->rx;
        auto v = rx.wait_header();
        if (!v.ok() || v.value() < 0) {
          if (v.ok())
            std::fprintf(stderr, "grpo serve: the trainer finished; serving policy version %lld\n",
                         (long long)svc.policy_version());
          else
            std::fprintf(stderr, "grpo serve: weight bridge: %s; serving policy version %lld\n",
                         v.status().message().c_str(), (long long)svc.policy_version());
          std::fprintf(stderr, "grpo serve: --receive: waiting at %s for a trainer to join (grpo train --resume "
                       "with server.bridge_addr = \"%s\")\n", addr.c_str(), addr.c_str());
          std::fflush(stderr);
          bridge->rx.reset();
          bridge->comm.reset();  // aborted, not waited for: the other side is gone
          while (true) {
            auto b = join();
            if (b.ok()) {
              *bridge = std::move(b).value();
              std::fprintf(stderr, "grpo serve: --receive: a trainer joined at %s\n", addr.c_str());
              break;
            }
            // A trainer of another model is refused until the right one comes; the rendezvous's
            // own timeout just means that none came yet.
            std::fprintf(stderr, "grpo serve: --receive: %s; still serving policy version %lld, waiting again\n",
                         b.status().message().c_str(), (long long)svc.policy_version());
            std::this_thread::sleep_for(std::chrono::seconds(1));
          }
          continue;
        }
        const double t0 = now_seconds();
        svc.pause_and_drain();
        Status st = rx.receive(ctx);
        if (!st.ok()) {  // partly written weights: nothing valid to serve
          std::fprintf(stderr, "grpo serve: error: %s; the weights are partly overwritten, stopping\n",
                       st.message().c_str());
          receiver_failed = true;
          return;
        }
        eng.reset_prefix_cache();
        svc.set_policy_version(v.value());
        svc.resume();
        GRPO_LOG_INFO("serve --receive: policy version %lld in %.4f s (transfer %.4f s)", (long long)v.value(),
                      now_seconds() - t0, rx.stats().last_s);
      }
    }).detach();
  }
  std::unique_ptr<IpcFollower> follower;
  if (attach) {
    IpcAttachment* at = attach.get();
    follower = std::make_unique<IpcFollower>(svc, eng, [at] { return at->version(); }, [at] { return at->trainer_alive(); },
                                             a.attach_poll_s);
    follower->poll();
    follower->start();
  }
  HttpServer http(svc, tok.get(), so, loras.get());
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-stream is a failed write, not a dead server
  Status st = http.start();
  if (!st.ok()) return cli::fail(cmd, st.message());
  std::fprintf(stderr, "grpo serve: listening on http://%s:%d (model '%s', %s, %d KV blocks of %d, policy version %lld)\n",
               so.host.c_str(), http.port(), so.served_model_name.c_str(), device_name(co.device), eng.n_kv_blocks(),
               eo.block_size, (long long)svc.policy_version());
  if (loras)
    for (const auto& l : loras->list())
      std::fprintf(stderr, "grpo serve: LoRA adapter '%s' (%s) in slot %d of %d\n", l.name.c_str(), l.path.c_str(), l.slot,
                   loras->n_slots());
  std::fflush(stderr);
  while (g_signal == 0 && !(follower && follower->trainer_gone()) && !receiver_failed)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (receiver_failed) {
    http.drain_and_stop(1);
    std::fflush(nullptr);
    std::_Exit(1);  // the service may be paused mid-update, the thread holds this frame: no orderly teardown
  }
  if (follower && follower->trainer_gone()) {
    // Its memory is freed with it: nothing valid is left to serve.
    std::fprintf(stderr, "grpo serve: error: the trainer (pid %d) exited; its weights are gone, stopping\n",
                 attach->trainer_pid());
    http.drain_and_stop(1);
    follower->stop();
    svc.stop();
    return 1;
  }
  std::fprintf(stderr, "grpo serve: signal %d: draining %d in-flight requests\n", int(g_signal), http.n_in_flight());
  if (watcher) watcher->stop();
  if (follower) follower->stop();
  http.drain_and_stop(a.drain_timeout_s);
  svc.stop();
  std::fprintf(stderr, "grpo serve: stopped\n");
  if (receiving) {
    // The receiving thread may sit in a collective and uses the service, engine and
    // weights of this frame: end the process without destroying them under it.
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return 0;
}

cli::CommandRegistrar reg("serve", "Serve the model over an OpenAI- and vLLM-compatible HTTP API", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--model", a->model, "Hugging Face model directory");
  sub->add_option("--attach", a->attach,
                  "Serve a running grpo train's GPU weights in place (CUDA IPC; the run's --out, trained with "
                  "[server] bridge = \"ipc\")");
  sub->add_option("--attach-poll", a->attach_poll_s, "Seconds between checks of the trainer's policy version");
  sub->add_option("--receive", a->receive,
                  "Join a grpo train's NCCL weight bridge at HOST:PORT ([server] bridge = \"nccl\", bridge_addr) and "
                  "load the weights it broadcasts after each step");
  sub->add_option("--receive-rank", a->receive_rank, "This server's rank in the bridge (1..bridge_servers)");
  sub->add_option("--receive-timeout", a->receive_timeout_s,
                  "Seconds the bridge may wait for the trainer (longer than its slowest step)");
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
  sub->add_option("--lora", a->lora,
                  "PEFT LoRA adapter directory applied to every request (with --watch: the slot new adapters load into)");
  sub->add_option("--watch", a->watch,
                  "Follow a run: load each new complete checkpoint of this directory (grpo train --out, or one "
                  "checkpoint/model directory) between requests");
  sub->add_option("--watch-interval", a->watch_interval_s, "Seconds between --watch scans");
  sub->add_option("--lora-modules", a->lora_modules,
                  "LoRA adapters served by name (vLLM): NAME=DIR or {\"name\": NAME, \"path\": DIR} ...; a request "
                  "picks one with its `model` field")
      ->expected(1, -1);
  sub->add_option("--max-loras", a->max_loras,
                  "LoRA adapter slots (resident adapters at once; default: max(1, number of --lora-modules))");
  sub->add_option("--max-lora-rank", a->max_lora_rank,
                  "Largest adapter rank the slots take (default: max(16, the largest --lora-modules rank))");
  sub->add_flag("--enable-lora", a->enable_lora, "Give the engine LoRA slots (implied by --lora-modules)");
  sub->add_flag("--enable-lora-updates", a->enable_lora_updates,
                "Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING)");
  sub->add_option("--seed", a->seed, "Engine seed for requests without a seed");
  cli::add_enum(sub, "--device", &a->device, cli::device_flag_names(), "Device");
  cli::add_enum(sub, "--dtype", &a->dtype, cli::engine_dtype_flag_names(), "Weights dtype", "f32 on cpu, bf16 on cuda");
  cli::add_engine_flags(sub, &a->engine);
  sub->add_flag("--deterministic", a->deterministic, "Batch-invariant kernels");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all)");
  return [a]() { return run(*a); };
});

}  // namespace
