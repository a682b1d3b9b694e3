// `grpo train` with [server] enabled: outside clients are answered from the live
// policy while the loop trains, each answer from one policy version (the optimizer
// step of the weights), versions never go back, and the run ends cleanly.
#include <atomic>
#include <filesystem>
#include <thread>

#include "server_test_util.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;

namespace {

RunConfig serve_config(const std::string& out, int steps) {
  const std::string toml =
      "[run]\noutput_dir = \"" + out + "\"\n"
      "[model]\npath = \"" + arith_dir() + "\"\ndtype = \"f32\"\ndevice = \"cpu\"\n"
      "[data]\nenv = \"arithmetic\"\nseed = 1\nprompt_template = \"{question}\\n\"\n"
      "[data.arithmetic]\ndifficulty = 0\ntrain_size = 200\ntest_size = 10\n"
      "[rollout]\nnum_generations = 4\nprompts_per_step = 2\nmax_new_tokens = 12\nseed = 1\n"
      "[train]\nsteps = " + std::to_string(steps) + "\nlr = 1e-3\nmicro_batch = 8\n"
      "[eval]\nevery = 0\n"
      "[checkpoint]\nsave_final = false\n"
      "[log]\nprogress = \"off\"\nplot = false\nlevel = \"warn\"\n"
      "[server]\nenabled = true\nport = 0\nmax_n = 2\n";
  auto c = run_config_parse(toml, "serve.toml");
  GRPO_CHECK_MSG(c.ok(), c.status().message().c_str());
  return c.value();
}

}  // namespace

TEST(TrainServe, ClientsGetTheLivePolicyWithMonotonePolicyVersions) {
  char tmpl[] = "/tmp/grpo_train_serve_XXXXXX";
  const std::string out = mkdtemp(tmpl);
  // The run may take up to kMaxSteps steps but stops (through the loop's stop signal, as on
  // SIGINT) once clients were answered in three rollout phases' worth of requests and at least
  // kMinSteps steps ran: a fixed small step count raced the first answer on a loaded 2-core CI.
  const int kMaxSteps = 200, kMinSteps = 3;
  RunConfig cfg = serve_config(out, kMaxSteps);
  std::atomic<int> port{0}, answers{0}, stop{0};
  std::atomic<bool> done{false}, posting{false};
  TrainLoopOptions o;
  o.out_dir = out;
  o.n_threads = 2;
  o.console = nullptr;
  o.stop_signal = &stop;
  o.on_step = [&](int64_t step) {
    if (step >= kMinSteps && answers >= 3) stop = 2;
  };
  o.start_server = [&](EngineService& svc, const Tokenizer* tok, const ServerSection& s) -> Result<std::shared_ptr<void>> {
    ServerOptions so;
    so.host = s.host;
    so.port = int(s.port);
    so.max_n = int(s.max_n);
    so.served_model_name = "live";
    auto h = std::make_shared<HttpServer>(svc, tok, so);
    GRPO_TRY(h->start());
    port = h->port();
    // The loop goes on once the client is about to post (at most 10 s), so that its first
    // request does not race the whole run.
    for (int i = 0; i < 5000 && !posting; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return std::shared_ptr<void>(h);
  };
  std::vector<int64_t> versions;
  std::vector<int> statuses;
  std::thread client([&] {
    while (port == 0 && !done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (port == 0) return;
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    while (!done) {
      posting = true;
      auto r = c.Post("/v1/completions", json{{"model", "live"}, {"prompt", "What is 2 + 3?\n"}, {"max_tokens", 6}, {"n", 2}}.dump(),
                      "application/json");
      if (!r) break;  // the server went away with the run
      statuses.push_back(r->status);
      json j = json::parse(r->body, nullptr, false);
      if (r->status == 200) {
        versions.push_back(j["policy_version"].get<int64_t>());
        ++answers;
        EXPECT_EQ(r->get_header_value("X-Policy-Version"), std::to_string(versions.back()));
        EXPECT_EQ(j["choices"].size(), 2u);
      }
    }
  });
  auto res = grpo_train(cfg, o);
  done = true;
  client.join();
  ASSERT_TRUE(res.ok()) << res.status().message();
  const int64_t steps = res.value().steps;
  EXPECT_GE(steps, kMinSteps);
  EXPECT_LE(steps, kMaxSteps);
  ASSERT_FALSE(versions.empty()) << "no outside request was answered in " << steps << " steps of training";
  RecordProperty("answers", int(versions.size()));
  RecordProperty("last_version", int(versions.back()));
  for (int s : statuses) EXPECT_EQ(s, 200);
  for (size_t k = 1; k < versions.size(); ++k) EXPECT_LE(versions[k - 1], versions[k]);
  EXPECT_LE(versions.back(), steps);
  EXPECT_GE(versions.front(), 0);
  // One request waits for the next rollout phase, so a client that keeps asking sees
  // the weights of later steps too.
  if (versions.size() >= 3) EXPECT_GE(versions.back(), 1);
  std::filesystem::remove_all(out);
}

TEST(TrainServe, ServerSectionIsValidatedAndRoundTrips) {
  auto bad = run_config_parse("[server]\nenabled = true\nport = 70000\n", "x.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("server.port"), std::string::npos) << bad.status().message();
  auto bad2 = run_config_parse("[server]\nmax_n = 0\n", "x.toml");
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("server.max_n"), std::string::npos);
  auto unknown = run_config_parse("[server]\nbogus = 1\n", "x.toml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("max_queued_requests"), std::string::npos) << unknown.status().message();  // lists valid keys
  auto ok = run_config_parse("[server]\nenabled = true\nport = 0\napi_key = \"k\"\n", "x.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  auto back = run_config_parse(run_config_to_toml(ok.value()), "back.toml");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back.value().server.enabled);
  EXPECT_EQ(back.value().server.port, 0);
  EXPECT_EQ(back.value().server.api_key, "k");
}
