// GRPO-loop options end to end on the CPU: μ iterations and several optimizer
// steps per generation batch (the trainer's logprobs at generation time as old logprobs, deferred
// checkpoints), the KL term against a frozen reference, importance-sampling
// correction, exact resume with all of these, early stopping, and rollouts over an
// FP8 KV cache (engine.kv_cache_dtype), the [engine] section reaching the engine, and
// the prefix-cache hit metric.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "loop_test_util.h"
#include "model/safetensors.h"
#include "train/checkpoint_state.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

Result<TrainLoopResult> run(const RunConfig& cfg, const std::string& out, bool resume = false, int64_t stop_after = 0) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.n_threads = 2;
  o.console = nullptr;
  o.stop_after_steps = stop_after;
  return grpo_train(cfg, o);
}

double num(const nlohmann::json& j, const char* k) {
  EXPECT_TRUE(j.contains(k)) << k;
  return j.contains(k) ? j[k].get<double>() : 0.0;
}

}  // namespace

TEST(GrpoLoopOptions, OneGenerationFeedsMuTimesStepsPerGeneration) {
  const std::string out = make_temp_dir("mu");
  RunConfig cfg = tiny_config(4, {"train.beta=0.04", "train.importance_sampling=token_truncate",
                                  "train.num_iterations=2", "train.steps_per_generation=2", "train.micro_batch=2",
                                  "eval.every=0", "checkpoint.every=2", "checkpoint.save_final=false"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 4u);
  for (const auto& s : m.steps) EXPECT_EQ(num(s, "generation"), 1.0) << "4 steps = 2 iterations x 2 slices of one batch";
  EXPECT_GT(num(m.steps[0], "time/rollout"), 0.0);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(num(m.steps[i], "time/rollout"), 0.0);
  // Reference = the initial weights: no KL before the first update, some after.
  EXPECT_EQ(num(m.steps[0], "kl"), 0.0);
  EXPECT_GT(num(m.steps[2], "kl"), 0.0);
  EXPECT_GT(num(m.steps[0], "is_ratio/mean"), 0.0);
  // Off-policy slices: the ratio against the rollout policy moves, so the loss is not the on-policy 0-ish value.
  EXPECT_NE(num(m.steps[3], "loss"), 0.0);
  // The checkpoint due at step 2 (inside the batch) is deferred to its end (step 4).
  auto cks = checkpoint_list(out);
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].first, 4);
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, ResumeIsBitExactWithReferenceAndIterations) {
  const std::vector<std::string> sets = {"train.beta=0.04", "train.importance_sampling=token_truncate",
                                         "train.num_iterations=2", "eval.every=0"};
  const std::string a = make_temp_dir("mu_a"), b = make_temp_dir("mu_b");
  ASSERT_TRUE(run(tiny_config(4, sets), a).ok());
  ASSERT_TRUE(run(tiny_config(4, sets), b, false, 2).ok());
  ASSERT_EQ(checkpoint_latest(b), b + "/checkpoint-2");
  ASSERT_TRUE(run(tiny_config(4, sets), b, true).ok());
  MetricsFile ma = read_metrics(a + "/metrics.jsonl"), mb = read_metrics(b + "/metrics.jsonl");
  ASSERT_EQ(ma.steps.size(), 4u);
  ASSERT_EQ(mb.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* k : {"loss", "kl", "grad_norm", "reward/mean", "is_ratio/mean"})
      EXPECT_EQ(ma.steps[i][k], mb.steps[i][k]) << "step " << i + 1 << " " << k;
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(GrpoLoopOptions, EarlyStoppingEndsTheRunAndIsRecorded) {
  const std::string out = make_temp_dir("early");
  // min_delta 2: accuracy can never improve by that much, so the first eval after the start stops the run.
  RunConfig cfg = tiny_config(6, {"eval.every=1", "eval.early_stopping_patience=1", "eval.early_stopping_min_delta=2"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.value().stopped_early);
  EXPECT_EQ(r.value().steps, 1);
  EXPECT_EQ(checkpoint_latest(out), out + "/checkpoint-1");
  auto text = read_file(out + "/checkpoint-1/trainer_state.json");
  ASSERT_TRUE(text.ok());
  auto st = trainer_state_from_json(nlohmann::json::parse(text.value()), "state");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st.value().stopped_early);
  EXPECT_EQ(st.value().best_step, 0);
  EXPECT_EQ(st.value().evals_without_improvement, 1);
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, ChatTemplateWithoutTemplateIsAnError) {
  const std::string out = make_temp_dir("chat");
  auto r = run(tiny_config(1, {"data.use_chat_template=true"}), out);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chat template"), std::string::npos) << r.status().message();
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, Fp8KvCacheNeedsHeadDimMultipleOf16) {
  const std::string out = make_temp_dir("fp8bad");
  auto r = run(tiny_config(1, {"engine.kv_cache_dtype=fp8"}), out);  // stories260K: head_dim 8
  ASSERT_FALSE(r.ok());
  for (const char* word : {"engine.kv_cache_dtype", "head_dim % 16", "auto"})
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().message();
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, Fp8KvCacheRunRecordsItsKvDtypeAndMismatch) {
  // The demo model (head_dim 32) with an FP8 KV cache and the TIS correction.
  const std::string out = make_temp_dir("fp8");
  RunConfig cfg = tiny_config(2, {"model.path=" + std::string(GRPO_SOURCE_DIR) + "/models/arith-tiny",
                                  "engine.kv_cache_dtype=fp8_e4m3", "train.importance_sampling=token_truncate",
                                  "eval.every=0", "checkpoint.save_final=false"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::ifstream f(out + "/run_info.json");
  const nlohmann::json info = nlohmann::json::parse(f);
  EXPECT_EQ(info["engine"]["kv_cache_dtype"], "f8_e4m3");
  // arith-tiny: 2 layers × K and V × 16 tokens × 2 kv heads × 32 dims, one byte each.
  EXPECT_EQ(info["engine"]["kv_bytes"].get<int64_t>(), info["engine"]["n_kv_blocks"].get<int64_t>() * 2 * 2 * 16 * 2 * 32);
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  for (const auto& s : m.steps) {
    const double mis = num(s, "logprob_mismatch/max");
    EXPECT_TRUE(std::isfinite(mis) && mis >= 0.0) << mis;
    EXPECT_GT(num(s, "is_ratio/mean"), 0.0);
  }
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, EngineSectionReachesTheEngine) {
  const std::string out = make_temp_dir("engine");
  RunConfig cfg = tiny_config(1, {"engine.block_size=4", "engine.kv_cache_mib=1", "engine.max_num_batched_tokens=512",
                                  "engine.cuda_graphs=off", "eval.every=0", "checkpoint.save_final=false"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::ifstream f(out + "/run_info.json");
  const nlohmann::json e = nlohmann::json::parse(f)["engine"];
  EXPECT_EQ(e["block_size"], 4);
  EXPECT_EQ(e["max_num_seqs"], 8);  // engine.max_num_seqs = 0: the generation batch, B·G = 2·4
  EXPECT_EQ(e["max_num_batched_tokens"], 512);
  EXPECT_EQ(e["cuda_graphs"], false);
  EXPECT_EQ(e["prefix_caching"], true);
  EXPECT_EQ(e["kv_budget_bytes"].get<int64_t>(), int64_t(1) << 20);
  // The pool is the budget in whole blocks, not B·G worst-case sequences.
  const int64_t blocks = e["n_kv_blocks"].get<int64_t>(), bytes = e["kv_bytes"].get<int64_t>();
  ASSERT_GT(blocks, 0);
  EXPECT_EQ(blocks, (int64_t(1) << 20) / (bytes / blocks));
  fs::remove_all(out);
}

TEST(GrpoLoopOptions, PrefixHitTokensAreLogged) {
  // block_size 4: the G = 4 samples of a prompt share its full blocks, so samples 2..4 hit the cache.
  auto hits = [](bool caching, double* frac) {
    const std::string out = make_temp_dir("prefix");
    RunConfig cfg = tiny_config(2, {"engine.block_size=4", std::string("engine.enable_prefix_caching=") +
                                    (caching ? "true" : "false"), "eval.every=0", "checkpoint.save_final=false"});
    auto r = run(cfg, out);
    EXPECT_TRUE(r.ok()) << r.status().message();
    MetricsFile m = read_metrics(out + "/metrics.jsonl");
    EXPECT_EQ(m.steps.size(), 2u);
    double total = 0;
    *frac = 0;
    for (const auto& s : m.steps) {
      total += num(s, "rollout/prefix_hit_tokens");
      *frac = std::max(*frac, num(s, "rollout/prefix_hit_frac"));
    }
    fs::remove_all(out);
    return total;
  };
  double frac_on = 0, frac_off = 0;
  EXPECT_GT(hits(true, &frac_on), 0.0);
  EXPECT_EQ(hits(false, &frac_off), 0.0);
  EXPECT_GT(frac_on, 0.0);
  EXPECT_LE(frac_on, 0.75);  // the first sample of each prompt computes its prompt: at most (G−1)/G
  EXPECT_EQ(frac_off, 0.0);
}

TEST(GrpoLoopOptions, ActivationRecomputeReachesTheTrainerAndChangesNoNumber) {
  // Recompute re-runs each layer's forward before its backward with the same deterministic
  // kernels: the run must be identical, only its memory differs.
  auto run_with = [](bool recompute, nlohmann::json* trainer) {
    const std::string out = make_temp_dir("recompute");
    RunConfig cfg = tiny_config(2, {std::string("train.activation_recompute=") + (recompute ? "true" : "false"),
                                    "train.micro_batch_tokens=64", "eval.every=0", "checkpoint.save_final=false"});
    auto r = run(cfg, out);
    EXPECT_TRUE(r.ok()) << r.status().message();
    std::ifstream f(out + "/run_info.json");
    *trainer = nlohmann::json::parse(f)["trainer"];
    MetricsFile m = read_metrics(out + "/metrics.jsonl");
    std::vector<double> v;
    for (const auto& s : m.steps) v.push_back(num(s, "loss")), v.push_back(num(s, "grad_norm"));
    fs::remove_all(out);
    return v;
  };
  nlohmann::json t_on, t_off;
  const std::vector<double> on = run_with(true, &t_on), off = run_with(false, &t_off);
  EXPECT_EQ(t_on["activation_recompute"], true);
  EXPECT_EQ(t_off["activation_recompute"], false);
  EXPECT_EQ(t_on["micro_batch_tokens"], 64);
  ASSERT_EQ(on.size(), 4u);
  EXPECT_EQ(on, off);
  EXPECT_NE(on[1], 0.0);  // the weights really moved (non-zero gradient)
}
