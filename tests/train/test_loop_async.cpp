// Asynchronous rollouts ([async], train/loop_async.h) on the CPU with the tiny
// model: max_staleness = 0 is the synchronous loop bit for bit; with
// max_staleness = 1 the batch of a step is the one a separate engine samples
// from the checkpointed weights of two steps before (version g − 1 for
// generation g), not from whatever is current; the version lag follows the
// schedule; resume through a checkpoint is exact; configs it cannot run are
// refused with the key to change.
#include <filesystem>
#include <map>

#include "core/context.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "loop_test_util.h"
#include "model/checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"
#include "train/loop_async.h"
#include "train/loop_rollout.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

struct Captured {
  std::vector<PreparedPrompt> prompts;
  std::vector<std::vector<int32_t>> completions;
  std::vector<std::vector<float>> logprobs;
  int64_t policy_version = -2;
};

TrainLoopResult run(const RunConfig& cfg, const std::string& out, std::map<int64_t, Captured>* seen = nullptr,
                    bool resume = false, int64_t stop_after = 0) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.n_threads = 2;
  o.console = nullptr;
  o.stop_after_steps = stop_after;
  if (seen)
    o.on_batch = [seen](int64_t step, const RolloutBatch& b) {
      Captured c;
      c.prompts = b.prompts;
      for (const auto& x : b.completions) {
        c.completions.push_back(x.out.completion_ids);
        c.logprobs.push_back(x.out.logprobs);
      }
      c.policy_version = b.policy_version;
      (*seen)[step] = std::move(c);
    };
  auto r = grpo_train(cfg, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : TrainLoopResult{};
}

void expect_same_steps(const MetricsFile& a, const MetricsFile& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i)
    for (const char* k : {"step", "loss", "reward/mean", "grad_norm", "entropy", "completion/mean_length", "lr",
                          "logprob_mismatch/max"}) {
      ASSERT_TRUE(a.steps[i].contains(k) && b.steps[i].contains(k)) << k;
      EXPECT_EQ(a.steps[i][k], b.steps[i][k]) << "step record " << i << " key " << k;
    }
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (size_t i = 0; i < a.evals.size(); ++i) EXPECT_EQ(a.evals[i]["eval/accuracy"], b.evals[i]["eval/accuracy"]);
}

// 6 steps, a checkpoint every 3 (all kept), no evals: k = 1 gives lags 0 1 1 | 0 1 1.
RunConfig async_config(int64_t k, const std::vector<std::string>& more = {}) {
  std::vector<std::string> sets = {"async.max_staleness=" + std::to_string(k), "checkpoint.every=3",
                                   "checkpoint.keep_last=0", "eval.every=0"};
  sets.insert(sets.end(), more.begin(), more.end());
  return tiny_config(6, sets);
}

// Samples generation `generation`'s prompts from the model in `model_dir` with a fresh
// engine, as the loop does (same sampling parameters and per-prompt keys).
std::vector<RequestOutput> sample_independently(const RunConfig& cfg, const std::string& model_dir,
                                                const std::vector<PreparedPrompt>& prompts, int64_t generation) {
  auto w = model_load(model_dir, Device::cpu, DType::f32);
  EXPECT_TRUE(w.ok()) << w.status().message();
  auto tok = Tokenizer::load(tiny_model_dir());
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  ModelWeights weights = std::move(w).value();
  Tokenizer t = std::move(tok).value();
  ContextOptions co;
  co.n_threads = 1;
  Context ctx(co);
  auto eo = engine_options_from_config(cfg.engine, Device::cpu, weights.config, DType::f32, {}, 8);
  EXPECT_TRUE(eo.ok()) << eo.status().message();
  EngineOptions opts = eo.value();
  opts.seed = uint64_t(cfg.rollout.seed);
  if (!t.eos_ids().empty()) opts.eos_token_ids = t.eos_ids();
  Engine engine(ctx, weights, &t, opts);
  SamplingParams sp;
  sp.n = int(cfg.rollout.num_generations);
  sp.temperature = float(cfg.rollout.temperature);
  sp.top_p = float(cfg.rollout.top_p);
  sp.top_k = int(cfg.rollout.top_k);
  sp.min_p = float(cfg.rollout.min_p);
  sp.max_tokens = int(cfg.rollout.max_new_tokens);
  sp.stop = cfg.rollout.stop;
  sp.logprobs_mode = cfg.rollout.temperature == 1.0 ? LogprobsMode::raw : LogprobsMode::processed;
  std::vector<uint64_t> seeds;
  for (size_t k = 0; k < prompts.size(); ++k) seeds.push_back(rollout_seed_for(uint64_t(cfg.rollout.seed), generation, int64_t(k)));
  auto outs = engine_run_prompts(engine, prompts, sp, seeds);
  EXPECT_TRUE(outs.ok()) << outs.status().message();
  return outs.ok() ? outs.value() : std::vector<RequestOutput>{};
}

bool same_tokens(const Captured& c, const std::vector<RequestOutput>& outs) {
  if (c.completions.size() != outs.size()) return false;
  for (size_t i = 0; i < outs.size(); ++i)
    if (c.completions[i] != outs[i].completion_ids) return false;
  return true;
}

}  // namespace

TEST(AsyncRollouts, MaxStalenessZeroIsTheSynchronousLoop) {
  const std::string a = make_temp_dir("sync"), b = make_temp_dir("async0");
  std::map<int64_t, Captured> sa, sb;
  run(tiny_config(4), a, &sa);
  run(tiny_config(4, {"async.max_staleness=0"}), b, &sb);
  expect_same_steps(read_metrics(a + "/metrics.jsonl"), read_metrics(b + "/metrics.jsonl"));
  ASSERT_EQ(sa.size(), 4u);
  ASSERT_EQ(sb.size(), 4u);
  for (int64_t s = 1; s <= 4; ++s) {
    EXPECT_EQ(sa[s].completions, sb[s].completions) << "step " << s;
    EXPECT_EQ(sb[s].policy_version, -1) << "the synchronous loop samples from the current weights";
  }
  EXPECT_FALSE(read_metrics(b + "/metrics.jsonl").steps[0].contains("async/version_lag"));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(AsyncRollouts, StalenessOneSamplesFromTheVersionTwoStepsBack) {
  const std::string out = make_temp_dir("async1");
  const RunConfig cfg = async_config(1);
  std::map<int64_t, Captured> seen;
  TrainLoopResult r = run(cfg, out, &seen);
  ASSERT_EQ(r.steps, 6);
  ASSERT_EQ(seen.size(), 6u);
  // Generation g (trained at step g + 1) comes from version max(s0, g − 1), s0 the last
  // prime: 0 at the start, 3 after the checkpoint at step 3.
  const std::vector<int64_t> want_version = {0, 0, 1, 3, 3, 4};
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 6u);
  for (int64_t s = 1; s <= 6; ++s) {
    EXPECT_EQ(seen[s].policy_version, want_version[size_t(s - 1)]) << "step " << s;
    const auto& rec = m.steps[size_t(s - 1)];
    ASSERT_TRUE(rec.contains("async/version_lag")) << rec.dump();
    EXPECT_EQ(rec["async/version_lag"].get<double>(), double((s - 1) - want_version[size_t(s - 1)])) << "step " << s;
    for (const char* k : {"time/trainer_wait", "time/engine_idle", "time/snapshot_copy", "time/old_logprobs"})
      EXPECT_TRUE(rec.contains(k)) << "missing " << k;
  }
  // Step 5 trains generation 4, sampled from the weights after step 3: checkpoint-3 holds them.
  // An engine of its own on those weights, with the loop's keys, samples the very same tokens.
  const std::string ck3 = out + "/" + checkpoint_dir_name(3);
  ASSERT_TRUE(fs::exists(ck3));
  const Captured& g4 = seen[5];
  std::vector<RequestOutput> ref = sample_independently(cfg, ck3, g4.prompts, 4);
  ASSERT_EQ(ref.size(), g4.completions.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(g4.completions[i], ref[i].completion_ids) << "completion " << i;
    ASSERT_EQ(g4.logprobs[i].size(), ref[i].logprobs.size());
    for (size_t t = 0; t < ref[i].logprobs.size(); ++t)
      EXPECT_NEAR(g4.logprobs[i][t], ref[i].logprobs[t], 1e-5) << "completion " << i << " token " << t;
  }
  // The comparison can tell versions apart: the same keys on the final weights (version 6)
  // or on the initial ones give other samples.
  EXPECT_FALSE(same_tokens(g4, sample_independently(cfg, out + "/" + checkpoint_dir_name(6), g4.prompts, 4)));
  EXPECT_FALSE(same_tokens(g4, sample_independently(cfg, tiny_model_dir(), g4.prompts, 4)));
  fs::remove_all(out);
}

TEST(AsyncRollouts, ResumeThroughACheckpointIsExact) {
  const std::string straight = make_temp_dir("astraight"), split = make_temp_dir("asplit");
  for (int64_t k : {1, 2}) {
    const RunConfig cfg = async_config(k);
    run(cfg, straight);
    TrainLoopResult first = run(cfg, split, nullptr, false, /*stop_after=*/4);
    EXPECT_EQ(first.steps, 4);
    ASSERT_EQ(checkpoint_latest(split), split + "/" + checkpoint_dir_name(3));
    TrainLoopResult second = run(cfg, split, nullptr, /*resume=*/true);
    EXPECT_EQ(second.steps, 6);
    expect_same_steps(read_metrics(straight + "/metrics.jsonl"), read_metrics(split + "/metrics.jsonl"));
    auto wa = model_load(straight + "/" + checkpoint_dir_name(6), Device::cpu, DType::f32);
    auto wb = model_load(split + "/" + checkpoint_dir_name(6), Device::cpu, DType::f32);
    ASSERT_TRUE(wa.ok() && wb.ok());
    EXPECT_EQ(tensor_to_f32(wa.value().arena), tensor_to_f32(wb.value().arena)) << "k = " << k;
    fs::remove_all(straight);
    fs::remove_all(split);
    fs::create_directories(straight);
    fs::create_directories(split);
  }
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(AsyncRollouts, StalenessTwoRunsAheadByTwoVersions) {
  const std::string out = make_temp_dir("async2");
  std::map<int64_t, Captured> seen;
  run(async_config(2), out, &seen);
  // Primes at 0 (generations 0, 1) and at 3 (generations 3, 4); generation g otherwise from g − 2.
  const std::vector<int64_t> want_version = {0, 0, 0, 3, 3, 3};
  for (int64_t s = 1; s <= 6; ++s) EXPECT_EQ(seen[s].policy_version, want_version[size_t(s - 1)]) << "step " << s;
  fs::remove_all(out);
}

TEST(AsyncRollouts, RefusesWhatItCannotRun) {
  const std::string out = make_temp_dir("arefuse");
  struct Case {
    std::vector<std::string> sets;
    const char* key;
  };
  for (const Case& c : {Case{{"train.num_iterations=2"}, "train.num_iterations"},
                        Case{{"train.steps_per_generation=2"}, "train.steps_per_generation"},
                        Case{{"curriculum.type=\"kde_valley\""}, "curriculum.type"}}) {
    TrainLoopOptions o;
    o.out_dir = out;
    o.console = nullptr;
    o.n_threads = 2;
    auto r = grpo_train(async_config(1, c.sets), o);
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.key), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("async.max_staleness"), std::string::npos) << r.status().message();
  }
  auto bad = run_config_parse(tiny_config_toml(tiny_model_dir(), 2) + "[async]\nmax_staleness = -1\n", "t.toml", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("async.max_staleness"), std::string::npos) << bad.status().message();
  fs::remove_all(out);
}

TEST(AsyncRollouts, WithARolloutServerNeedsNoSnapshotSoLoraIsAllowed) {
  // rollout.server_url: the server samples ahead (tests/server/test_remote_rollouts.cpp runs it);
  // LoRA is fine there (the server gets the adapters over its bridge), the other limits stay.
  const std::vector<std::string> server = {"async.max_staleness=1", "rollout.server_url=http://127.0.0.1:8001"};
  RunConfig lora = tiny_config(2, {"async.max_staleness=1", "lora.enabled=true"});
  EXPECT_NE(async_check_config(lora, 1).message().find("[lora]"), std::string::npos);
  std::vector<std::string> sets = server;
  sets.push_back("lora.enabled=true");
  EXPECT_TRUE(async_check_config(tiny_config(2, sets), 1).ok()) << async_check_config(tiny_config(2, sets), 1).message();
  EXPECT_NE(async_check_config(tiny_config(2, server), 2).message().find("one rank"), std::string::npos);
  sets = server;
  sets.push_back("curriculum.type=\"kde_valley\"");
  EXPECT_NE(async_check_config(tiny_config(2, sets), 1).message().find("curriculum.type"), std::string::npos);
}
