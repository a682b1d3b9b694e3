// bench_serve: the nano-vllm workload (256 requests, prompt and output lengths
// uniform in 100..1024, random-weight model, forced lengths) sent over HTTP to the
// in-process `grpo serve` stack (EngineService + HttpServer) by C concurrent
// streaming clients, against the same workload run offline through the same engine
// in the same call (the peer). Reports throughput and its ratio to offline, and
// p50/p99 time to first token and inter-token latency as the clients see them
// (offline: as the engine loop sees them). Writes
// bench/results/serve-<preset>-nanovllm.json (DESIGN.md section 6).
//
//   bench_serve [--preset qwen2.5-0.5b] [--device cuda|cpu] [--dtype bf16|f32] [--kv-gb 24]
//               [--clients 64,256] [--requests 256] [--max-len 1024] [--no-graphs] [--out-dir bench/results]
//               [--http-threads T] [--listen-backlog B]   (server overrides for reproductions; 0: its defaults)
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "engine/engine_service.h"
#include "model/presets.h"
#include "server/http_server.h"

using namespace grpo;

namespace {

struct Work {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> out_lens;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, size_t(p / 100.0 * double(v.size() - 1) + 0.5));
  return v[k];
}

SamplingParams params_for(int len, int k) {
  SamplingParams sp;
  sp.temperature = 1.f;
  sp.max_tokens = len;
  sp.min_tokens = len;
  sp.ignore_eos = true;
  sp.seed = uint64_t(100 + k);
  return sp;
}

struct Latencies {
  std::vector<double> ttft, itl;
  int64_t tokens = 0;
  double seconds = 0;
  nlohmann::json to_json() const {
    return {{"seconds", seconds},
            {"generated_tokens", tokens},
            {"tokens_per_s", seconds > 0 ? double(tokens) / seconds : 0.0},
            {"ttft_p50_s", pct(ttft, 50)},
            {"ttft_p99_s", pct(ttft, 99)},
            {"itl_p50_s", pct(itl, 50)},
            {"itl_p99_s", pct(itl, 99)}};
  }
};

// Offline: the loop records token times from step events. in_flight = 0: every request
// added at t0; else at most in_flight requests at once, the next one added when one
// finishes (what C clients that each send one request at a time give the engine).
Latencies run_offline(Context& ctx, Engine& eng, const Work& w, int in_flight = 0) {
  Latencies L;
  std::vector<double> last(w.prompts.size(), -1), start(w.prompts.size(), 0);
  const double t0 = now_seconds();
  std::vector<int64_t> rid_to_k;
  size_t next = 0;
  auto add = [&](size_t k) {
    auto r = eng.add_request(w.prompts[k], params_for(w.out_lens[k], int(k)));
    if (!r.ok()) {
      std::fprintf(stderr, "bench_serve: %s\n", r.status().message().c_str());
      std::exit(1);
    }
    if (size_t(r.value()) >= rid_to_k.size()) rid_to_k.resize(size_t(r.value()) + 1, -1);
    rid_to_k[size_t(r.value())] = int64_t(k);
    start[k] = now_seconds();
  };
  const size_t first = in_flight > 0 ? std::min(w.prompts.size(), size_t(in_flight)) : w.prompts.size();
  for (; next < first; ++next) add(next);
  std::vector<TokenEvent> evs;
  while (eng.has_unfinished()) {
    evs.clear();
    eng.step(&evs);
    const double now = now_seconds();
    for (const auto& e : evs) {
      const size_t k = size_t(rid_to_k[size_t(e.request_id)]);
      if (last[k] < 0) L.ttft.push_back(now - start[k]);
      else L.itl.push_back(now - last[k]);
      last[k] = now;
      ++L.tokens;
      if (e.finish_reason != FinishReason::none && next < w.prompts.size()) add(next++);
    }
  }
  ctx.synchronize();
  L.seconds = now_seconds() - t0;
  return L;
}

// Over HTTP: C client threads take the next request, stream it, and time the chunks.
Latencies run_http(int port, const Work& w, int clients) {
  Latencies L;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0};
  std::vector<std::string> reasons;  // the first few failures, for the report
  const double t0 = now_seconds();
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c)
    ts.emplace_back([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(3600, 0);
      std::vector<double> ttft, itl;
      int64_t tokens = 0;
      for (size_t k = next++; k < w.prompts.size(); k = next++) {
        nlohmann::json body = {{"prompt", w.prompts[k]}, {"max_tokens", w.out_lens[k]}, {"min_tokens", w.out_lens[k]},
                               {"ignore_eos", true}, {"temperature", 1.0}, {"seed", 100 + k}, {"stream", true}};
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        std::string buf;
        const double sent = now_seconds();
        double last = -1;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          buf.append(d, n);
          const double now = now_seconds();
          size_t pos;
          while ((pos = buf.find("\n\n")) != std::string::npos) {
            const bool token = buf.compare(0, 7, "data: {") == 0;
            buf.erase(0, pos + 2);
            if (!token) continue;
            if (last < 0) ttft.push_back(now - sent);
            else itl.push_back(now - last);
            last = now;
            ++tokens;
          }
          return true;
        };
        auto r = cli.send(req);
        if (!r || r->status != 200) {
          ++failures;
          std::string why = !r ? "httplib error " + httplib::to_string(r.error()) + " (" +
                                     std::to_string(int(r.error())) + ")"
                               : "HTTP " + std::to_string(r->status) + ": " + (r->body.empty() ? buf : r->body).substr(0, 300);
          why += " after " + std::to_string(now_seconds() - sent) + " s, " + std::to_string(last < 0 ? 0 : 1) +
                 "+ tokens received";
          std::lock_guard<std::mutex> lk(mu);
          if (reasons.size() < 5) reasons.push_back(why);
        }
      }
      std::lock_guard<std::mutex> lk(mu);
      L.ttft.insert(L.ttft.end(), ttft.begin(), ttft.end());
      L.itl.insert(L.itl.end(), itl.begin(), itl.end());
      L.tokens += tokens;
    });
  for (auto& t : ts) t.join();
  L.seconds = now_seconds() - t0;
  if (failures > 0) {
    std::fprintf(stderr, "bench_serve: %d of %zu requests failed (%d clients); first failures:\n", int(failures),
                 w.prompts.size(), clients);
    for (const auto& r : reasons) std::fprintf(stderr, "  %s\n", r.c_str());
  }
  return L;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "qwen2.5-0.5b", device = "cuda", dtype = "bf16", out_dir = "bench/results", clients_s = "64,256";
  double kv_gb = 24;
  bool graphs = true;
  int n_requests = 256, max_len = 1024, http_threads = 0, listen_backlog = 0;
  for (int i = 1; i < argc; ++i) try {
      std::string a = argv[i];
      auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
      if (a == "--preset") preset = next();
      else if (a == "--device") device = next();
      else if (a == "--dtype") dtype = next();
      else if (a == "--kv-gb") kv_gb = std::stod(next());
      else if (a == "--clients") clients_s = next();
      else if (a == "--requests") n_requests = std::stoi(next());
      else if (a == "--max-len") max_len = std::stoi(next());
      else if (a == "--no-graphs") graphs = false;
      else if (a == "--http-threads") http_threads = std::stoi(next());
      else if (a == "--listen-backlog") listen_backlog = std::stoi(next());
      else if (a == "--out-dir") out_dir = next();
      else {
        std::fprintf(stderr, "usage: bench_serve [--preset P] [--device cuda|cpu] [--dtype bf16|f32] [--kv-gb G] "
                             "[--clients 64,256] [--requests N] [--max-len L] [--no-graphs] [--http-threads T] "
                             "[--listen-backlog B] [--out-dir D]\n");
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "bench_serve: a number is missing or malformed near '%s'\n", argv[i]);
      return 2;
    }
  std::vector<int> client_counts;
  {
    std::stringstream ss(clients_s);
    for (std::string x; std::getline(ss, x, ',');) client_counts.push_back(std::stoi(x));
  }
  auto cfg = preset_config(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_serve: %s\n", cfg.status().message().c_str());
    return 1;
  }
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  Context ctx(co);
  const DType dt = dtype == "bf16" ? DType::bf16 : DType::f32;
  ModelWeights w = weights_random(*cfg, co.device, dt, 1234, &ctx);
  // The engine comes from the same EngineConfig as `grpo serve`'s engine flags and `grpo train`'s [engine].
  EngineConfig ec;
  ec.kv_cache_mib = int64_t(kv_gb * 1024.0);
  ec.max_num_seqs = 256;
  ec.max_num_batched_tokens = 8192;
  ec.cuda_graphs = graphs ? CudaGraphsMode::automatic : CudaGraphsMode::off;
  auto eo_r = engine_options_from_config(ec, co.device, *cfg, dt, MemoryUse{}, 256);
  if (!eo_r.ok()) {
    std::fprintf(stderr, "bench_serve: %s\n", eo_r.status().message().c_str());
    return 2;
  }
  EngineOptions eo = eo_r.value();
  eo.seed = 7;
  Engine eng(ctx, w, nullptr, eo);

  Work work;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, cfg->vocab_size - 1);
  std::uniform_int_distribution<int> len(std::min(100, max_len), max_len);
  for (int p = 0; p < n_requests; ++p) {
    std::vector<int32_t> ids(size_t(len(rng)));
    for (auto& x : ids) x = tok(rng);
    work.prompts.push_back(ids);
    work.out_lens.push_back(len(rng));
  }
  Work warm{{work.prompts[0], work.prompts[1]}, {16, 16}};
  run_offline(ctx, eng, warm);
  eng.reset_prefix_cache();
  const Latencies off = run_offline(ctx, eng, work);
  eng.reset_prefix_cache();

  ServerOptions so;
  so.port = 0;
  so.max_tokens_limit = max_len;
  so.max_queued_requests = n_requests + 16;
  so.n_threads = http_threads;  // 0: the server's own sizing (from max_queued_requests)
  so.listen_backlog = listen_backlog;
  so.max_body_bytes = size_t(64) << 20;
  EngineService svc(eng, ServiceOptions{so.max_queued_requests});
  HttpServer http(svc, nullptr, so);
  Status st = http.start();
  if (!st.ok()) {
    std::fprintf(stderr, "bench_serve: %s\n", st.message().c_str());
    return 1;
  }
  run_http(http.port(), warm, 2);

  nlohmann::json runs = nlohmann::json::object(), ratios = nlohmann::json::object();
  std::printf("| preset | device | clients | tok/s | vs offline | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |\n");
  std::printf("| %s | %s %s | offline | %.0f | 1.00 | %.1f | %.1f | %.2f | %.2f |\n", preset.c_str(), device.c_str(),
              dtype.c_str(), double(off.tokens) / off.seconds, pct(off.ttft, 50) * 1e3, pct(off.ttft, 99) * 1e3,
              pct(off.itl, 50) * 1e3, pct(off.itl, 99) * 1e3);
  for (int c : client_counts) {
    svc.pause_and_drain();
    eng.reset_prefix_cache();
    svc.resume();
    const Latencies h = run_http(http.port(), work, c);
    const double ratio = (double(h.tokens) / h.seconds) / (double(off.tokens) / off.seconds);
    // The engine alone at the same concurrency: what is left of the gap is HTTP's.
    svc.pause_and_drain();
    eng.reset_prefix_cache();
    const Latencies oc = run_offline(ctx, eng, work, c);
    eng.reset_prefix_cache();
    svc.resume();
    const double ratio_c = (double(h.tokens) / h.seconds) / (double(oc.tokens) / oc.seconds);
    std::printf("| %s | %s %s | offline, %d at a time | %.0f | %.2f | %.1f | %.1f | %.2f | %.2f |\n", preset.c_str(),
                device.c_str(), dtype.c_str(), c, double(oc.tokens) / oc.seconds,
                (double(oc.tokens) / oc.seconds) / (double(off.tokens) / off.seconds), pct(oc.ttft, 50) * 1e3,
                pct(oc.ttft, 99) * 1e3, pct(oc.itl, 50) * 1e3, pct(oc.itl, 99) * 1e3);
    std::printf("| %s | %s %s | %d | %.0f | %.2f (%.2f of offline at %d) | %.1f | %.1f | %.2f | %.2f |\n", preset.c_str(),
                device.c_str(), dtype.c_str(), c, double(h.tokens) / h.seconds, ratio, ratio_c, c,
                pct(h.ttft, 50) * 1e3, pct(h.ttft, 99) * 1e3, pct(h.itl, 50) * 1e3, pct(h.itl, 99) * 1e3);
    runs["clients_" + std::to_string(c)] = h.to_json();
    runs["offline_in_flight_" + std::to_string(c)] = oc.to_json();
    ratios["http_over_offline_tokens_per_s_clients_" + std::to_string(c)] = ratio;
    ratios["http_over_offline_same_concurrency_clients_" + std::to_string(c)] = ratio_c;
  }
  http.drain_and_stop(10);
  svc.stop();

  nlohmann::json j = {
      {"bench", "serve"},
      {"date", grpo::bench::today()},
      {"device", device},
      {"command", "bench_serve --preset " + preset + " --device " + device + " --dtype " + dtype + " --clients " + clients_s},
      {"config",
       {{"preset", preset}, {"workload", "nanovllm"}, {"requests", n_requests}, {"max_len", max_len}, {"dtype", dtype},
        {"kv_gb", kv_gb}, {"cuda_graphs", eo.use_cuda_graphs}, {"max_num_seqs", eo.max_num_seqs},
        {"max_num_batched_tokens", eo.max_num_batched_tokens}, {"stream", true},
        {"http_threads", so.http_threads()}, {"max_queued_requests", so.max_queued_requests}}},
      {"metrics", runs},
      {"peer", {{"name", "offline engine (same process, same workload)"}, {"metrics", off.to_json()}}},
      {"ratios", ratios}};
  const std::string path = out_dir + "/serve-" + preset + "-nanovllm.json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
