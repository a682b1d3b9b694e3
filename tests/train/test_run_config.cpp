// Run config: strict TOML loading, error messages that name the key, --set
// overrides with declared types, dump round trip, file checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include "train/run_config.h"

namespace grpo {
namespace {

// Parse must fail and the message must contain every fragment.
void expect_error(const std::string& toml, std::initializer_list<const char*> fragments,
                  const std::vector<std::string>& overrides = {}) {
  auto r = run_config_parse(toml, "cfg.toml", overrides);
  ASSERT_FALSE(r.ok()) << "expected an error for:\n" << toml;
  for (const char* f : fragments)
    EXPECT_NE(r.status().message().find(f), std::string::npos) << "missing '" << f << "' in: " << r.status().message();
}

const char* kFull = R"(
[run]
output_dir = "runs/gsm8k"
[model]
path = "models/qwen"
dtype = "bf16"
device = "cuda:0"
[data]
env = "gsm8k"
prompt_template = "Question: {question}\nAnswer:"
use_chat_template = true
system_prompt = "Think, then answer."
eval_size = 200
[data.arithmetic]
difficulty = 2
[rollout]
num_generations = 16
prompts_per_step = 4
max_new_tokens = 512
temperature = 0.9
top_p = 0.95
top_k = 50
min_p = 0.05
stop = ["</answer>"]
[train]
steps = 500
lr = 1e-6
lr_schedule = "cosine"
warmup_steps = 10
loss_type = "dr_grpo"
beta = 0.04
epsilon = 0.2
epsilon_high = 0.28
max_grad_norm = 1   # an integer is accepted for a float key
importance_sampling = "token_truncate"
mask_truncated_completions = true
[[reward]]
name = "correct"
weight = 1.0
[[reward]]
name = "format_strict"
weight = 0.2
think_in_prompt = true
[[reward]]
name = "length_overlong"
weight = 1
max_len = 512
cache_len = 128
[eval]
every = 50
early_stopping_patience = 3
[checkpoint]
every = 100
keep_last = 2
[log]
tensorboard = true
plot_metrics = ["reward/mean", "eval/accuracy"]
)";

TEST(RunConfig, DefaultsAreValid) {
  RunConfig c;
  EXPECT_TRUE(c.validate().ok()) << c.validate().message();
  auto r = run_config_parse("", "empty.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(run_config_to_json(*r), run_config_to_json(c));
  ASSERT_EQ(r->reward.size(), 1u);
  EXPECT_EQ(r->reward[0].name, "correct");
}

TEST(RunConfig, ParsesEverySection) {
  auto r = run_config_parse(kFull, "full.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const RunConfig& c = *r;
  EXPECT_EQ(c.run.output_dir, "runs/gsm8k");
  EXPECT_EQ(c.model.device, (DeviceSpec{Device::cuda, 0}));
  EXPECT_EQ(c.data.env, EnvKind::gsm8k);
  EXPECT_EQ(c.data.prompt_template, "Question: {question}\nAnswer:");
  EXPECT_TRUE(c.data.use_chat_template);
  EXPECT_EQ(c.data.arithmetic.difficulty, 2);
  EXPECT_EQ(c.rollout.num_generations, 16);
  EXPECT_EQ(c.rollout.stop, std::vector<std::string>{"</answer>"});
  EXPECT_DOUBLE_EQ(c.rollout.min_p, 0.05);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-6);
  EXPECT_DOUBLE_EQ(c.train.max_grad_norm, 1.0);
  EXPECT_EQ(c.train.loss_type, LossType::dr_grpo);
  EXPECT_TRUE(c.train.mask_truncated_completions);
  ASSERT_EQ(c.reward.size(), 3u);
  EXPECT_EQ(c.reward[1].name, "format_strict");
  EXPECT_DOUBLE_EQ(c.reward[1].weight, 0.2);
  EXPECT_EQ(c.reward[1].params["think_in_prompt"], true);
  EXPECT_EQ(c.reward[2].params["max_len"], 512);
  EXPECT_EQ(c.eval.every, 50);
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_TRUE(c.log.tensorboard);
  EXPECT_EQ(c.log.plot_metrics.size(), 2u);
}

TEST(RunConfig, UnknownKeysAndSections) {
  expect_error("[train]\nlr = 1e-5\nlrr = 1e-5\n", {"cfg.toml:3:", "unknown key 'lrr' in section [train]", "valid keys:", "lr, lr_schedule"});
  expect_error("[data.arithmetic]\ndifficulti = 1\n", {"unknown key 'difficulti' in section [data.arithmetic]", "difficulty"});
  expect_error("[data.arith]\ndifficulty = 1\n", {"unknown key 'arith' in section [data]", "arithmetic.*"});
  expect_error("[trian]\nsteps = 1\n", {"unknown section [trian]", "valid sections: run, model, data, rollout, engine, train"});
  expect_error("steps = 1\n", {"unknown section [steps]"});
  expect_error("[[reward]]\nname = \"correct\"\nscale = 2\n", {"reward[0]", "unknown parameter 'scale'"});
}

TEST(RunConfig, WrongTypesNameKeyAndValue) {
  expect_error("[train]\nlr = \"fast\"\n", {"cfg.toml:2:", "train.lr = \"fast\": expected a number"});
  expect_error("[train]\nsteps = 1.5\n", {"train.steps = 1.5: expected an integer"});
  expect_error("[eval]\ngreedy = 1\n", {"eval.greedy = 1: expected a boolean"});
  expect_error("[model]\npath = 3\n", {"model.path = 3: expected a string"});
  expect_error("[rollout]\nstop = \"x\"\n", {"rollout.stop = \"x\": expected an array of strings"});
  expect_error("[rollout]\nstop = [1]\n", {"rollout.stop", "expected an array of strings"});
  expect_error("[train]\nlr = nan\n", {"train.lr = nan: must be a finite number"});
  expect_error("[[reward]]\nname = \"length_linear\"\ntarget = \"long\"\n", {"reward[0]", "target = \"long\": expected a number"});
  expect_error("[[reward]]\nweight = 1\n", {"reward[0]", "missing key 'name'"});
  expect_error("[[reward]]\nname = \"corect\"\n", {"unknown reward function 'corect'"});
  expect_error("reward = 3\n", {"[[reward]]"});
  expect_error("[train\nlr = 1\n", {"cfg.toml:1:", "TOML syntax error"});
}

TEST(RunConfig, OutOfRangeValuesNameKeyAndValue) {
  expect_error("[train]\nlr = -1\n", {"train.lr = -1: must be > 0"});
  expect_error("[rollout]\ntop_p = 1.5\n", {"rollout.top_p = 1.5: must be in (0, 1]"});
  expect_error("[rollout]\nnum_generations = 1\n", {"rollout.num_generations = 1: must be >= 2"});
  expect_error("[train]\nloss_type = \"ppo\"\n", {"train.loss_type = \"ppo\": must be one of grpo, bnpo, dr_grpo, dapo"});
  expect_error("[train]\nepsilon = 0.2\nepsilon_high = 0.1\n", {"train.epsilon_high = 0.1"});
  expect_error("[model]\ndevice = \"gpu\"\n", {"model.device = \"gpu\""});
  expect_error("[data]\nenv = \"jsonl\"\n", {"data.train_path", "required when data.env = \"jsonl\""});
  expect_error("[data]\nprompt_template = \"{q}\"\n", {"data.prompt_template", "unknown placeholder '{q}'"});
  expect_error("[data.arithmetic]\ndifficulty = 7\n", {"data.arithmetic.difficulty = 7: must be 0..3"});
  expect_error("[eval]\nearly_stopping_patience = 2\n", {"eval.early_stopping_patience = 2: needs eval.every > 0"});
  expect_error("[[reward]]\nname = \"length_overlong\"\nmax_len = 10\ncache_len = 20\n", {"cache_len = 20"});
  expect_error("[engine]\nkv_cache_dtype = \"fp16\"\n",
               {"engine.kv_cache_dtype = \"fp16\": must be one of auto, fp8, fp8_e4m3"});
}

TEST(RunConfig, RolloutServerKeys) {
  auto ok = run_config_parse("[rollout]\nserver_url = \"http://127.0.0.1:8001\"\nserver_timeout_s = 30\n"
                             "server_max_concurrency = 8\n", "cfg.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->rollout.server_url, "http://127.0.0.1:8001");
  EXPECT_DOUBLE_EQ(ok->rollout.server_timeout_s, 30);
  EXPECT_EQ(ok->rollout.server_max_concurrency, 8);
  auto dflt = run_config_parse("", "cfg.toml");
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ(dflt->rollout.server_url, "");  // the in-process engine
  EXPECT_DOUBLE_EQ(dflt->rollout.server_timeout_s, 600);
  EXPECT_EQ(dflt->rollout.server_max_concurrency, 64);
  // Round trip through the resolved config.
  auto back = run_config_parse(run_config_to_toml(ok.value()), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rollout.server_url, "http://127.0.0.1:8001");

  const char* how = "must be the base URL of a grpo serve (or vLLM-compatible) server, http://HOST:PORT";
  expect_error("[rollout]\nserver_url = \"127.0.0.1:8001\"\n",
               {"rollout.server_url = \"127.0.0.1:8001\"", "must start with http://", how});
  expect_error("[rollout]\nserver_url = \"http://127.0.0.1:80x\"\n", {"rollout.server_url", "port '80x'", how});
  expect_error("[rollout]\nserver_url = \"http://127.0.0.1:8001/v1\"\n",
               {"rollout.server_url = \"http://127.0.0.1:8001/v1\": has a path ('/v1')", "without /v1"});
  expect_error("[rollout]\nserver_url = \"https://example.org\"\n", {"rollout.server_url", "https is not supported"});
  expect_error("[rollout]\nserver_url = \"http://:8001\"\n", {"rollout.server_url", "no host"});
  expect_error("[rollout]\nserver_timeout_s = 0\n", {"rollout.server_timeout_s = 0: must be in (0, 86400] seconds"});
  expect_error("[rollout]\nserver_max_concurrency = 0\n", {"rollout.server_max_concurrency = 0: must be in [1, 4096]"});
  const std::string url = "[rollout]\nserver_url = \"http://127.0.0.1:8001\"\n";
  expect_error(url + "[tandem]\nenabled = true\n", {"rollout.server_url", "tandem.enabled = true needs the in-process engine"});
  expect_error(url + "[engine.speculative]\nmethod = \"ngram\"\n", {"rollout.server_url", "engine.speculative.method = \"off\""});
  expect_error(url + "[train]\non_policy = \"bitwise\"\n", {"rollout.server_url", "train.on_policy = \"default\""});
  expect_error(url + "[data]\nenv = \"remote\"\n[eval]\nevery = 0\n", {"rollout.server_url", "data.env = \"remote\""});
  expect_error(url + "[server]\nenabled = true\n", {"rollout.server_url", "set server.enabled = false"});
  auto bridged = run_config_parse(url + "[server]\nbridge = \"nccl\"\n", "cfg.toml");
  EXPECT_TRUE(bridged.ok()) << bridged.status().message();
  expect_error("", {"rollout.server_timeout_s = -1"}, {"rollout.server_timeout_s=-1"});
}

TEST(RunConfig, RolloutServerOnFailure) {
  auto dflt = run_config_parse("", "cfg.toml");
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ(dflt->rollout.server_on_failure, ServerOnFailure::error);
  const std::string url = "[rollout]\nserver_url = \"http://127.0.0.1:8001\"\n";
  auto local = run_config_parse(url + "server_on_failure = \"local\"\n", "cfg.toml");
  ASSERT_TRUE(local.ok()) << local.status().message();
  EXPECT_EQ(local->rollout.server_on_failure, ServerOnFailure::local);
  auto back = run_config_parse(run_config_to_toml(local.value()), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rollout.server_on_failure, ServerOnFailure::local);
  EXPECT_TRUE(run_config_parse(url, "cfg.toml", {"rollout.server_on_failure=error"}).ok());

  // Nothing to fall back from without a server.
  expect_error("[rollout]\nserver_on_failure = \"local\"\n",
               {"rollout.server_on_failure = \"local\"", "rollout.server_url is empty",
                "leave rollout.server_on_failure = \"error\""});
  // The NCCL bridge fails first when the server is lost: it must carry on too.
  expect_error(url + "server_on_failure = \"local\"\n[server]\nbridge = \"nccl\"\n",
               {"rollout.server_on_failure = \"local\"", "server.bridge = \"nccl\"",
                "server.bridge_on_failure = \"error\" stops the run there",
                "set server.bridge_on_failure = \"continue\""});
  auto bridged = run_config_parse(url + "server_on_failure = \"local\"\n[server]\nbridge = \"nccl\"\n"
                                        "bridge_on_failure = \"continue\"\n", "cfg.toml");
  EXPECT_TRUE(bridged.ok()) << bridged.status().message();
  // "error" needs neither; the other bridges do not stop the run when the server goes.
  EXPECT_TRUE(run_config_parse(url + "[server]\nbridge = \"nccl\"\n", "cfg.toml").ok());
  EXPECT_TRUE(run_config_parse(url + "server_on_failure = \"local\"\n[server]\nbridge = \"ipc\"\n", "cfg.toml").ok());
  // Asynchronous rollouts fall back on the trainer's thread (train/loop_async.h).
  auto async = run_config_parse(url + "server_on_failure = \"local\"\n[async]\nmax_staleness = 1\n", "cfg.toml");
  EXPECT_TRUE(async.ok()) << async.status().message();
}

TEST(RunConfig, OverridesUseDeclaredTypes) {
  auto r = run_config_parse(kFull, "full.toml",
                            {"train.lr=1e-5", "train.steps = 70", "model.path=/abs/model dir", "rollout.stop=</answer>,\\n\\n",
                             "eval.greedy=false", "data.system_prompt=\"quoted\"", "log.plot_metrics=[\"loss\"]",
                             "reward.format_soft.weight=0.5", "reward.length_overlong.max_len=1024", "reward.correct.weight=2"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->train.lr, 1e-5);
  EXPECT_EQ(r->train.steps, 70);
  EXPECT_EQ(r->model.path, "/abs/model dir");
  EXPECT_EQ(r->rollout.stop, (std::vector<std::string>{"</answer>", "\\n\\n"}));
  EXPECT_FALSE(r->eval.greedy);
  EXPECT_EQ(r->data.system_prompt, "quoted");
  EXPECT_EQ(r->log.plot_metrics, std::vector<std::string>{"loss"});
  ASSERT_EQ(r->reward.size(), 4u);  // format_soft was added
  EXPECT_EQ(r->reward[3].name, "format_soft");
  EXPECT_DOUBLE_EQ(r->reward[3].weight, 0.5);
  EXPECT_EQ(r->reward[2].params["max_len"], 1024);
  EXPECT_DOUBLE_EQ(r->reward[0].weight, 2.0);

  auto kv = run_config_parse(kFull, "full.toml", {"engine.kv_cache_dtype=fp8"});
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  EXPECT_EQ(kv->engine.kv_cache_dtype, KvCacheDtype::fp8_e4m3);
  EXPECT_EQ(RunConfig().engine.kv_cache_dtype, KvCacheDtype::automatic);

  expect_error("", {"--set train.steps=abc", "train.steps", "is not an integer"}, {"train.steps=abc"});
  expect_error("", {"train.steps = 2.5: expected an integer"}, {"train.steps=2.5"});
  expect_error("", {"unknown key 'lrr' in section [train]"}, {"train.lrr=1"});
  expect_error("", {"unknown section [trian]"}, {"trian.lr=1"});
  expect_error("", {"expected key=value"}, {"train.lr"});
  expect_error("", {"train.lr = -0.5: must be > 0"}, {"train.lr=-0.5"});  // overrides are validated too
  expect_error("", {"unknown parameter 'maxlen'"}, {"reward.length_overlong.maxlen=3"});
  expect_error("", {"unknown reward function 'nope'"}, {"reward.nope.weight=1"});
  expect_error("", {"reward weight must be a number"}, {"reward.correct.weight=heavy"});
}

TEST(RunConfig, DumpRoundTrip) {
  auto r = run_config_parse(kFull, "full.toml", {"train.lr=3.3e-7", "rollout.temperature=0.7"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::string toml = run_config_to_toml(*r);
  EXPECT_NE(toml.find("[[reward]]"), std::string::npos) << toml;
  EXPECT_NE(toml.find("[data.arithmetic]"), std::string::npos) << toml;
  auto back = run_config_parse(toml, "dumped.toml");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << toml;
  EXPECT_EQ(run_config_to_json(*back), run_config_to_json(*r)) << toml;
  auto j = run_config_to_json(*r);
  EXPECT_EQ(j["train"]["loss_type"], "dr_grpo");
  EXPECT_EQ(j["data"]["arithmetic"]["difficulty"], 2);
  EXPECT_EQ(j["reward"][2]["cache_len"], 128);
  // Every settable key appears once in the dump (leaves outside [[reward]]).
  size_t leaves = 0;
  std::function<void(const nlohmann::ordered_json&)> walk = [&](const nlohmann::ordered_json& o) {
    for (auto it = o.begin(); it != o.end(); ++it) {
      if (it.key() == "reward") continue;
      if (it->is_object()) walk(*it);
      else ++leaves;
    }
  };
  walk(j);
  EXPECT_EQ(run_config_keys().size(), leaves);
  EXPECT_GT(leaves, 60u);
}

TEST(RunConfig, FilesMustExist) {
  auto missing = run_config_load("/nonexistent/cfg.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/cfg.toml"), std::string::npos);

  std::string dir = testing::TempDir() + "cfg_files";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/model");
  std::string cfg = dir + "/c.toml";
  std::ofstream(cfg) << "[data]\nenv = \"jsonl\"\ntrain_path = \"" << dir << "/none.jsonl\"\n";
  auto r = run_config_load(cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("data.train_path = \"" + dir + "/none.jsonl\": no such file"), std::string::npos)
      << r.status().message();

  std::ofstream(cfg) << "[model]\npath = \"" << dir << "/model\"\n";
  r = run_config_load(cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has no config.json"), std::string::npos) << r.status().message();
  std::ofstream(dir + "/model/config.json") << "{}";
  r = run_config_load(cfg);
  ASSERT_TRUE(r.ok()) << r.status().message();

  // gsm8k defaults resolve to the shipped files.
  RunConfig g;
  g.data.env = EnvKind::gsm8k;
  auto p = run_config_resolve_paths(g, GRPO_SOURCE_DIR);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->train_data, std::string(GRPO_SOURCE_DIR) + "/data/gsm8k/train.jsonl");
  EXPECT_FALSE(run_config_resolve_paths(g, "/nonexistent").ok());
}

TEST(RunConfig, MakesEachEnvironment) {
  RunConfig a;
  a.data.arithmetic.test_size = 20;
  auto pa = run_config_resolve_paths(a);
  ASSERT_TRUE(pa.ok());
  auto ea = run_config_make_env(a, *pa);
  ASSERT_TRUE(ea.ok()) << ea.status().message();
  EXPECT_EQ((*ea)->name(), "arithmetic");
  EXPECT_EQ((*ea)->size(Split::test), 20u);

  RunConfig g;
  g.data.env = EnvKind::gsm8k;
  auto pg = run_config_resolve_paths(g, GRPO_SOURCE_DIR);
  ASSERT_TRUE(pg.ok());
  auto eg = run_config_make_env(g, *pg);
  ASSERT_TRUE(eg.ok()) << eg.status().message();
  EXPECT_EQ((*eg)->size(Split::test), 1319u);

  std::string p = testing::TempDir() + "env_rows.jsonl";
  std::ofstream(p) << "{\"q\":\"1+1?\",\"a\":2}\n{broken\n{\"q\":\"2+2?\",\"a\":\"4\"}\n";
  RunConfig j;
  j.data.env = EnvKind::jsonl;
  j.data.train_path = p;
  j.data.prompt_field = "q";
  j.data.answer_field = "a";
  auto pj = run_config_resolve_paths(j);
  ASSERT_TRUE(pj.ok());
  auto bad = run_config_make_env(j, *pj);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(p + ":2:"), std::string::npos) << bad.status().message();
  j.data.on_bad_line = BadLinePolicy::skip;
  auto ej = run_config_make_env(j, *pj);
  ASSERT_TRUE(ej.ok()) << ej.status().message();
  EXPECT_EQ((*ej)->size(Split::train), 2u);
  EXPECT_EQ((*ej)->score((*ej)->example(Split::train, 1), "<answer>4</answer>"), 1.0f);
}

// A directory given as a data file, and an empty eval file while evals are on,
// are errors naming the key and the path; evals are off only by eval.every = 0.
TEST(RunConfig, DataDirectoriesAndEmptyEvalSetsAreErrors) {
  const std::string dir = testing::TempDir() + "cfg_data_errors";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/shards");
  const std::string train = dir + "/train.jsonl", empty = dir + "/empty.jsonl";
  std::ofstream(train) << "{\"q\":\"1+1?\",\"a\":2}\n";
  std::ofstream(empty) << "";
  RunConfig j;
  j.data.env = EnvKind::jsonl;
  j.data.train_path = dir + "/shards";
  j.data.prompt_field = "q";
  j.data.answer_field = "a";
  auto p = run_config_resolve_paths(j);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("data.train_path = \"" + dir + "/shards\": is a directory"), std::string::npos)
      << p.status().message();
  j.data.train_path = train;
  j.data.eval_path = dir + "/shards";
  p = run_config_resolve_paths(j);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("data.eval_path = \"" + dir + "/shards\": is a directory"), std::string::npos)
      << p.status().message();

  j.data.eval_path = empty;
  j.eval.every = 5;
  p = run_config_resolve_paths(j);
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto e = run_config_make_env(j, *p);
  ASSERT_FALSE(e.ok()) << "an empty eval file must not silently turn evals off";
  for (const std::string f : {"data.eval_path = \"" + empty + "\": no examples", std::string("eval.every = 5"),
                              std::string("eval.every = 0")})
    EXPECT_NE(e.status().message().find(f), std::string::npos) << f << " in: " << e.status().message();
  j.eval.every = 0;  // evals off by the config: the empty file is fine
  e = run_config_make_env(j, *p);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->size(Split::test), 0u);

  // An empty train file, and a gsm8k eval file that holds no examples.
  j.data.train_path = empty;
  auto paths = run_config_resolve_paths(j);
  ASSERT_TRUE(paths.ok()) << paths.status().message();
  e = run_config_make_env(j, *paths);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("data.train_path = \"" + empty + "\": no examples (the file is empty)"),
            std::string::npos) << e.status().message();
  RunConfig g;
  g.data.env = EnvKind::gsm8k;
  g.data.train_path = std::string(GRPO_SOURCE_DIR) + "/data/gsm8k/test.jsonl";
  g.data.eval_path = empty;
  g.eval.every = 10;
  auto pg = run_config_resolve_paths(g);
  ASSERT_TRUE(pg.ok()) << pg.status().message();
  auto eg = run_config_make_env(g, *pg);
  ASSERT_FALSE(eg.ok());
  EXPECT_NE(eg.status().message().find("data.eval_path = \"" + empty + "\": no examples"), std::string::npos)
      << eg.status().message();
  g.data.eval_split = Split::train;  // evals on the train split need no eval file
  EXPECT_TRUE(run_config_make_env(g, *pg).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace grpo
