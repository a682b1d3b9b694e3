// `grpo train CONFIG.toml [--set key=value ...] [--out DIR] [--resume [CKPT]]`:
// the end-to-end GRPO loop (train/grpo_loop.h). The config is parsed and
// validated completely (unknown keys, bad values, missing files) before any
// model is loaded; `--print-config` shows the resolved config and exits.
//
// SIGINT / SIGTERM: the first one lets the loop finish its step and write a
// checkpoint, then the resume command is printed and the process exits with
// 128 + the signal number (130 / 143, as shells report a death by signal);
// a second one exits at once with the same status.
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/dist_launch.h"
#include "core/log.h"
#include "core/timer.h"
#include "server/http_server.h"
#include "server/rollout_client.h"
#include "server/trajectory_client.h"
#include "train/grpo_loop.h"

namespace {

struct Args {
  std::string config, out, resume_from;
  std::vector<std::string> sets;
  bool resume = false, resume_with_changes = false, print_config = false, list_keys = false;
  int threads = 0;
  int64_t stop_after = 0;
  int debug_kill_rank = -1;
  int64_t debug_kill_step = 0;
};

// Set by the signal handler, polled by the loop between steps.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is written from a signal handler");

void on_stop_signal(int sig) {
  if (g_stop_signal.load() != 0) _exit(128 + sig);
  g_stop_signal.store(sig);
  static const char msg[] =
      "\ngrpo train: stop requested; finishing the current step and writing a checkpoint "
      "(press Ctrl-C or send the signal again to exit at once, without saving)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // file writes in progress carry on; the loop polls the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Single-quotes an argument for a POSIX shell when it holds anything but safe characters.
std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("@%+=:,./_-", c));
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string resume_command(const Args& a, const std::string& out_dir) {
  std::string cmd = "grpo train " + shell_quote(a.config) + " --out " + shell_quote(out_dir) + " --resume";
  for (const auto& s : a.sets) cmd += " --set " + shell_quote(s);
  if (a.threads > 0) cmd += " --threads " + std::to_string(a.threads);
  return cmd;
}

grpo::cli::CommandRegistrar reg("train", "Train a model with GRPO from a TOML run config (rollouts + rewards + updates)",
                                [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("config", a->config, "Run config (TOML), e.g. examples/default.toml");
  sub->add_option("--set", a->sets, "Override a config key, e.g. --set train.lr=1e-5 (repeatable)")->take_all();
  sub->add_option("--out", a->out, "Run directory (default: run.output_dir of the config)");
  auto* res = sub->add_option("--resume", a->resume_from,
                               "Continue a run: from the latest complete checkpoint in the run directory, "
                               "or from the checkpoint directory given")
                   ->expected(0, 1);
  sub->add_flag("--resume-with-changes", a->resume_with_changes,
                "Resume (as --resume) although the config differs from the run's config.toml; "
                "the differences are listed and config.toml is replaced");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all cores)");
  sub->add_flag("--print-config", a->print_config, "Print the resolved config (TOML) and exit");
  sub->add_flag("--list-keys", a->list_keys, "List every config key and exit");
  sub->add_option("--stop-after", a->stop_after, "End after this many steps without a final checkpoint (testing resume)")
      ->group("");
  sub->add_option("--debug-kill-rank", a->debug_kill_rank, "Rank that SIGKILLs itself (testing rank failure)")->group("");
  sub->add_option("--debug-kill-step", a->debug_kill_step, "... after this step (with --debug-kill-rank)")->group("");
  return [a, res]() {
    a->resume = res->count() > 0 || a->resume_with_changes;
    if (a->list_keys) {
      for (const auto& k : grpo::run_config_keys()) {
        const std::string values = grpo::run_config_key_values(k);
        std::printf(values.empty() ? "%s\n" : "%s  (%s)\n", k.c_str(), values.c_str());
      }
      std::printf("reward.<name>.<param>\n");
      return 0;
    }
    if (a->config.empty()) return grpo::cli::fail("train", "give a run config, e.g. grpo train examples/default.toml");
    auto cfg = grpo::run_config_load(a->config, a->sets);
    if (!cfg.ok()) return grpo::cli::fail("train", cfg.status().message());
    if (!a->out.empty()) cfg.value().run.output_dir = a->out;
    if (a->print_config) {
      std::printf("%s", grpo::run_config_to_toml(cfg.value()).c_str());
      return 0;
    }
    grpo::log_set_level(cfg.value().log.level);
    auto launch = grpo::cli::dist_launch_from_env();
    if (!launch.ok()) return grpo::cli::fail("train", launch.status().message());
    grpo::DistLaunch dl = launch.value();
    dl.timeout_s = cfg.value().dist.timeout_s;
    const grpo::Device dev = cfg.value().model.device.kind;
    if (dev == grpo::Device::cuda) grpo::cli::dist_pin_local_gpu(dl);
    std::unique_ptr<grpo::Communicator> comm;
    if (dl.kind != grpo::LaunchKind::single) {
      auto c = grpo::dist_init(dl, dev);
      if (!c.ok()) return grpo::cli::fail("train", c.status().message());
      comm = std::move(c).value();
    }
    const bool lead = !comm || comm->rank() == 0;
    grpo::TrainLoopOptions o;
    o.comm = comm.get();
    o.out_dir = cfg.value().run.output_dir;
    o.resume = a->resume;
    o.resume_from = a->resume_from;
    o.n_threads = a->threads;
    o.stop_after_steps = a->stop_after;
    o.resume_with_changes = a->resume_with_changes;
    o.console = cfg.value().log.level == grpo::LogLevel::quiet || !lead ? nullptr : stderr;
    if (a->debug_kill_rank >= 0 && comm && comm->rank() == a->debug_kill_rank)
      o.on_step = [a](int64_t step) {
        if (step == a->debug_kill_step) raise(SIGKILL);
      };
    o.stop_signal = &g_stop_signal;
    install_stop_handlers();
    const std::string model_path = cfg.value().model.path;
    o.start_server = [model_path](grpo::EngineService& svc, const grpo::Tokenizer* tok,
                                  const grpo::ServerSection& s) -> grpo::Result<std::shared_ptr<void>> {
      grpo::ServerOptions so;
      so.host = s.host;
      so.port = int(s.port);
      so.api_key = s.api_key;
      so.served_model_name = s.served_model_name;
      if (so.served_model_name.empty()) so.served_model_name = std::filesystem::path(model_path).filename().string();
      if (so.served_model_name.empty()) so.served_model_name = "grpo";
      so.max_body_bytes = size_t(s.max_body_bytes);
      so.max_prompt_tokens = int(s.max_prompt_tokens);
      so.max_tokens_limit = int(std::min<int64_t>(s.max_tokens_limit, 1 << 30));
      so.max_n = int(s.max_n);
      so.max_queued_requests = int(s.max_queued_requests);
      auto http = std::make_shared<grpo::HttpServer>(svc, tok, so);
      grpo::Status st = http->start();
      if (!st.ok()) return st.with_context("[server]");
      std::fprintf(stderr, "grpo train: serving the live policy on http://%s:%d (model '%s')\n", so.host.c_str(),
                   http->port(), so.served_model_name.c_str());
      std::signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-stream is a failed write, not a dead trainer
      return std::shared_ptr<void>(http);
    };
    o.make_trajectory_source = [](const grpo::RunConfig& c) {
      std::signal(SIGPIPE, SIG_IGN);
      return grpo::trajectory_source_make(c.remote, c.rollout.prompts_per_step * c.rollout.num_generations);
    };
    o.make_rollout_server = [](const grpo::RunConfig& c) {
      std::signal(SIGPIPE, SIG_IGN);  // a server that dies mid-request is a failed request, not a dead trainer
      return grpo::rollout_client_make(grpo::rollout_client_options(c));
    };
    const double t0 = grpo::now_seconds();
    auto r = grpo::grpo_train(cfg.value(), o);
    if (!r.ok()) {
      const std::string where = comm && comm->size() > 1 ? " (rank " + std::to_string(comm->rank()) + ")" : "";
      const int rc = grpo::cli::fail("train" + where, r.status().message());
      grpo::dist_abort_job(comm.get(), rc);  // the other ranks would wait in a collective forever
      return rc;
    }
    if (comm) comm->finish();  // the other ranks watch this one's exit (dist/peer_watch.h)
    if (const int sig = r.value().stop_signal) {
      const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
      if (r.value().last_checkpoint.empty())
        std::fprintf(stderr, "grpo train: stopped by %s before the first step ended; nothing to resume\n", name);
      else
        std::fprintf(stderr, "grpo train: stopped by %s after step %lld; checkpoint %s\nresume with: %s\n", name,
                     (long long)r.value().steps, r.value().last_checkpoint.c_str(),
                     resume_command(*a, r.value().out_dir).c_str());
      return 128 + sig;
    }
    if (o.console)
      std::fprintf(stderr, "grpo train: %lld steps%s in %.1f s; metrics in %s/metrics.jsonl\n",
                   (long long)r.value().steps, r.value().stopped_early ? " (early stop)" : "",
                   grpo::now_seconds() - t0, r.value().out_dir.c_str());
    return 0;
  };
});

}  // namespace
