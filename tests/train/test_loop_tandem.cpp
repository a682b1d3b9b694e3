// Tandem training end to end on the CPU (stories260K, partner = a frozen copy of
// the initial policy): the metrics a tandem run logs (trained-token fraction,
// switches, solo and tandem eval), p_trained = 1 training exactly as a vanilla
// run, a partner in another directory, and partner errors caught at setup.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "loop_test_util.h"
#include "model/presets.h"
#include "train/grpo_loop.h"

using namespace grpo;
using namespace grpo::test;
namespace fs = std::filesystem;

namespace {

Result<TrainLoopResult> run(const RunConfig& cfg, const std::string& out) {
  TrainLoopOptions o;
  o.out_dir = out;
  o.n_threads = 2;
  o.console = nullptr;
  return grpo_train(cfg, o);
}

double num(const nlohmann::json& j, const char* k) {
  EXPECT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  return j.contains(k) ? j[k].get<double>() : 0.0;
}

}  // namespace

TEST(GrpoLoopTandem, LogsTandemMetricsAndSoloAndTandemEval) {
  const std::string out = make_temp_dir("tandem");
  RunConfig cfg = tiny_config(2, {"tandem.enabled=true", "tandem.strategy=token", "tandem.p_trained=0.5",
                                  "checkpoint.save_final=false", "checkpoint.every=0"});
  auto r = run(cfg, out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  MetricsFile m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  for (const auto& s : m.steps) {
    const double frac = num(s, "tandem/trained_token_frac");
    EXPECT_GT(frac, 0.1);
    EXPECT_LT(frac, 0.9);
    EXPECT_GT(num(s, "tandem/switches_per_completion"), 0.0);
    EXPECT_GT(num(s, "tandem/partner_tokens"), 0.0);
    // The loss compares against the trained model's logprobs, which the trainer recomputes.
    EXPECT_LT(num(s, "logprob_mismatch/max"), 1e-3);
  }
  ASSERT_GE(m.evals.size(), 2u);
  for (const auto& e : m.evals) {
    num(e, "eval/accuracy");
    num(e, "eval/tandem/accuracy");
    const double f = num(e, "eval/tandem/trained_token_frac");
    EXPECT_GT(f, 0.0);
    EXPECT_LT(f, 1.0);
  }
  std::ifstream info(out + "/run_info.json");
  const auto j = nlohmann::json::parse(info);
  ASSERT_TRUE(j.contains("tandem")) << j.dump();
  EXPECT_EQ(j["tandem"]["strategy"], "token");
  fs::remove_all(out);
}

TEST(GrpoLoopTandem, PTrainedOneTrainsExactlyAsVanilla) {
  const std::string a = make_temp_dir("tandem_p1"), b = make_temp_dir("vanilla_p1");
  const std::vector<std::string> common = {"eval.every=0", "checkpoint.save_final=false", "checkpoint.every=0"};
  auto sets = common;
  sets.insert(sets.end(), {"tandem.enabled=true", "tandem.strategy=word", "tandem.p_trained=1"});
  auto ra = run(tiny_config(3, sets), a);
  auto rb = run(tiny_config(3, common), b);
  ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.status().message() : ra.status().message());
  MetricsFile ma = read_metrics(a + "/metrics.jsonl"), mb = read_metrics(b + "/metrics.jsonl");
  ASSERT_EQ(ma.steps.size(), 3u);
  ASSERT_EQ(mb.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(num(ma.steps[i], "tandem/trained_token_frac"), 1.0);
    for (const char* k : {"loss", "reward/mean", "grad_norm", "completion/mean_length"})
      EXPECT_EQ(num(ma.steps[i], k), num(mb.steps[i], k)) << k << " at step " << i;
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(GrpoLoopTandem, PartnerFromAnotherDirectoryAndPartnerErrors) {
  const std::string out = make_temp_dir("tandem_dir");
  // The partner: the same model copied elsewhere (same vocabulary and tokenizer).
  const std::string pdir = make_temp_dir("partner");
  for (const auto& e : fs::directory_iterator(tiny_model_dir()))
    fs::copy(e.path(), fs::path(pdir) / e.path().filename());
  auto ok = run(tiny_config(1, {"tandem.enabled=true", "tandem.partner=" + pdir, "tandem.strategy=chunk",
                                "tandem.chunk_size=3", "eval.every=0", "checkpoint.save_final=false"}),
                out);
  EXPECT_TRUE(ok.ok()) << ok.status().message();

  // A partner whose vocabulary differs.
  const std::string bad = make_temp_dir("partner_bad");
  InitModelOptions io;
  io.preset = "tiny-llama";
  io.out_dir = bad;
  io.dtype = DType::f32;
  io.overrides.vocab_size = 600;
  ASSERT_TRUE(init_model_write(io).ok());
  auto r = run(tiny_config(1, {"tandem.enabled=true", "tandem.partner=" + bad, "eval.every=0"}), out + "_2");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocab_size"), std::string::npos) << r.status().message();
  // A partner directory that is not a checkpoint.
  auto r2 = run(tiny_config(1, {"tandem.enabled=true", "tandem.partner=" + out, "eval.every=0"}), out + "_3");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("tandem.partner"), std::string::npos) << r2.status().message();
  // Bad values name the key.
  auto c = run_config_parse(tiny_config_toml(tiny_model_dir(), 1), "t.toml", {"tandem.strategy=sentence"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tandem.strategy"), std::string::npos) << c.status().message();
  for (const auto& d : {out, out + "_2", out + "_3", pdir, bad}) fs::remove_all(d);
}

// engine.speculative in grpo train: the loop loads the draft model (method draft). With
// acceptance = match, rollouts equal plain decoding token for token, so training is exactly
// vanilla's. With speculative sampling (the default) the draft is identical to the policy at
// step 0 (q = p: every draft kept, and the drafts are the policy's seeded samples), so step 0
// is vanilla's; after the first update the frozen draft differs and rollouts follow the
// policy only in distribution.
TEST(GrpoLoopSpeculative, DraftAndNgramTrainExactlyAsVanilla) {
  const std::vector<std::string> common = {"eval.every=0", "checkpoint.save_final=false", "checkpoint.every=0"};
  const std::string v = make_temp_dir("spec_vanilla");
  auto rv = run(tiny_config(2, common), v);
  ASSERT_TRUE(rv.ok()) << rv.status().message();
  const MetricsFile mv = read_metrics(v + "/metrics.jsonl");
  ASSERT_EQ(mv.steps.size(), 2u);
  for (const std::string variant : {std::string("draft"), std::string("ngram"), std::string("draft-rejection")}) {
    SCOPED_TRACE(variant);
    const std::string method = variant == "ngram" ? "ngram" : "draft";
    const std::string out = make_temp_dir(("spec_" + variant).c_str());
    auto sets = common;
    sets.push_back("engine.speculative.method=" + method);
    sets.push_back(std::string("engine.speculative.acceptance=") + (variant == "draft-rejection" ? "rejection" : "match"));
    if (method == "draft") sets.push_back("engine.speculative.draft_model=" + tiny_model_dir());
    auto r = run(tiny_config(2, sets), out);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const MetricsFile m = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 2u);
    for (size_t i = 0; i < (variant == "draft-rejection" ? 1u : 2u); ++i)
      for (const char* k : {"loss", "reward/mean", "grad_norm", "completion/mean_length"})
        EXPECT_EQ(num(m.steps[i], k), num(mv.steps[i], k)) << k << " at step " << i;
    std::ifstream info(out + "/run_info.json");
    const auto j = nlohmann::json::parse(info);
    ASSERT_TRUE(j.contains("speculative")) << j.dump();
    EXPECT_EQ(j["speculative"]["method"], method);
    fs::remove_all(out);
  }
  // A draft directory that does not exist is named in the error.
  auto bad = run(tiny_config(1, {"engine.speculative.method=draft", "engine.speculative.draft_model=/nonexistent/draft"}),
                 make_temp_dir("spec_bad"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("engine.speculative.draft_model"), std::string::npos) << bad.status().message();
  fs::remove_all(v);
}
