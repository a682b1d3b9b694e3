// `grpo api`: the Atropos-compatible trajectory API on its own (docs/environments.md),
// for a trainer elsewhere (`grpo train` with remote.url, or Atropos's example
// trainer) and environment processes that post scored groups. Runs until
// interrupted (Ctrl-C / SIGTERM).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/command.h"
#include "server/trajectory_api.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct ApiArgs {
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t max_queued_sequences = 0;
  int threads = 16;
};

grpo::cli::CommandRegistrar reg("api", "Serve the Atropos-compatible trajectory API (environments post scored groups, a trainer pulls batches)",
                                [](CLI::App* sub) {
  auto a = std::make_shared<ApiArgs>();
  sub->add_option("--host", a->host, "Address to listen on (0.0.0.0: every interface)");
  sub->add_option("--port", a->port, "Port (0: any free port, printed)");
  sub->add_option("--max-queued-sequences", a->max_queued_sequences,
                  "Most sequences held (queued + buffered); more: 503 with Retry-After (0: unbounded, as Atropos)");
  sub->add_option("--threads", a->threads, "HTTP worker threads");
  return [a]() {
    if (a->max_queued_sequences < 0) return grpo::cli::fail("api", "--max-queued-sequences must be >= 0 (0 = unbounded)");
    grpo::TrajectoryStoreOptions so;
    so.max_queued_sequences = a->max_queued_sequences;
    grpo::TrajectoryStore store(so);
    grpo::TrajectoryApiOptions ao;
    ao.host = a->host;
    ao.port = a->port;
    ao.n_threads = a->threads;
    grpo::TrajectoryApiServer server(store, ao);
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    grpo::Status st = server.start();
    if (!st.ok()) return grpo::cli::fail("api", st.message());
    std::fprintf(stderr, "grpo api: trajectory API on http://%s:%d (Ctrl-C to stop)\n", a->host.c_str(), server.port());
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
    const grpo::TrajectoryCounters c = store.counters();
    std::fprintf(stderr, "grpo api: stopped; %lld groups received, %lld batches formed, %lld posts rejected, %lld refused (full)\n",
                 (long long)c.groups_received, (long long)c.batches_formed, (long long)c.posts_rejected,
                 (long long)c.posts_refused_full);
    return 0;
  };
});

}  // namespace
