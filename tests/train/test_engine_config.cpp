// The [engine] section and the other keys of issue 14: every key parsed and
// dumped, enum-like values parsed once through their one name table (errors
// list it), the moved rollout.kv_cache_dtype, EngineOptions built from the
// section, and the KV budget arithmetic against hand-computed numbers.
#include <gtest/gtest.h>

#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "model/train_model.h"
#include "train/run_config.h"

namespace grpo {
namespace {

void expect_error(const std::string& toml, std::initializer_list<const char*> fragments,
                  const std::vector<std::string>& overrides = {}) {
  auto r = run_config_parse(toml, "cfg.toml", overrides);
  ASSERT_FALSE(r.ok()) << "expected an error for:\n" << toml;
  for (const char* f : fragments)
    EXPECT_NE(r.status().message().find(f), std::string::npos) << "missing '" << f << "' in: " << r.status().message();
}

constexpr const char* kEngine = R"(
[run]
deterministic = true
[rollout]
max_new_tokens = 64
ignore_eos = true
min_new_tokens = 64
[engine]
block_size = 32
max_num_seqs = 48
max_num_batched_tokens = 4096
max_model_len = 2048
enable_prefix_caching = false
enable_chunked_prefill = false
cuda_graphs = "off"
cuda_graph_max_context = 1024
kv_cache_dtype = "fp8_e4m3"
gpu_memory_utilization = 0.75
kv_cache_mib = 512
[train]
weight_decay_all = true
micro_batch_tokens = 4096
activation_recompute = true
importance_sampling = "sequence_truncate"
importance_sampling_geomean = true
)";

TEST(EngineConfig, EveryKeyParsesAndRoundTrips) {
  auto r = run_config_parse(kEngine, "engine.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const EngineConfig& e = r->engine;
  EXPECT_EQ(e.block_size, 32);
  EXPECT_EQ(e.max_num_seqs, 48);
  EXPECT_EQ(e.max_num_batched_tokens, 4096);
  EXPECT_EQ(e.max_model_len, 2048);
  EXPECT_FALSE(e.enable_prefix_caching);
  EXPECT_FALSE(e.enable_chunked_prefill);
  EXPECT_EQ(e.cuda_graphs, CudaGraphsMode::off);
  EXPECT_EQ(e.cuda_graph_max_context, 1024);
  EXPECT_EQ(e.kv_cache_dtype, KvCacheDtype::fp8_e4m3);
  EXPECT_DOUBLE_EQ(e.gpu_memory_utilization, 0.75);
  EXPECT_EQ(e.kv_cache_mib, 512);
  EXPECT_TRUE(r->run.deterministic);
  EXPECT_TRUE(r->rollout.ignore_eos);
  EXPECT_EQ(r->rollout.min_new_tokens, 64);
  EXPECT_EQ(r->train.micro_batch_tokens, 4096);
  EXPECT_TRUE(r->train.activation_recompute);
  EXPECT_TRUE(r->train.weight_decay_all);
  EXPECT_TRUE(r->train.importance_sampling_geomean);
  // Dump: enum values by their canonical names; the dump parses back to the same config.
  auto j = run_config_to_json(*r);
  EXPECT_EQ(j["engine"]["cuda_graphs"], "off");
  EXPECT_EQ(j["engine"]["kv_cache_dtype"], "fp8");
  auto back = run_config_parse(run_config_to_toml(*r), "dumped.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(run_config_to_json(*back), j);
  // Defaults.
  const RunConfig d;
  EXPECT_EQ(d.engine.cuda_graphs, CudaGraphsMode::automatic);
  EXPECT_EQ(d.engine.kv_cache_dtype, KvCacheDtype::automatic);
  EXPECT_DOUBLE_EQ(d.engine.gpu_memory_utilization, 0.9);
  EXPECT_EQ(d.engine.kv_cache_mib, 0);
  EXPECT_TRUE(d.engine.enable_prefix_caching);
}

TEST(EngineConfig, EnumValuesComeFromOneTable) {
  expect_error("[engine]\ncuda_graphs = \"yes\"\n", {"cfg.toml:2:", "engine.cuda_graphs = \"yes\": must be one of auto, on, off"});
  expect_error("[engine]\ncuda_graphs = true\n", {"engine.cuda_graphs = true: expected a string (one of auto, on, off)"});
  expect_error("", {"engine.kv_cache_dtype = \"int8\": must be one of auto, fp8, fp8_e4m3"}, {"engine.kv_cache_dtype=int8"});
  // Unquoted override values are names too.
  auto r = run_config_parse("", "cfg.toml", {"engine.cuda_graphs=on", "engine.kv_cache_dtype=\"fp8\""});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->engine.cuda_graphs, CudaGraphsMode::on);
  EXPECT_EQ(r->engine.kv_cache_dtype, KvCacheDtype::fp8_e4m3);
  // The key listing shows the same lists.
  EXPECT_EQ(run_config_key_values("engine.cuda_graphs"), "auto, on, off");
  EXPECT_EQ(run_config_key_values("engine.kv_cache_dtype"), "auto, fp8, fp8_e4m3");
  EXPECT_EQ(run_config_key_values("engine.block_size"), "");
  // The other enum-like keys go through their tables too.
  expect_error("[train]\nlr_schedule = \"exp\"\n", {"train.lr_schedule = \"exp\": must be one of constant, linear, cosine"});
  expect_error("[train]\nscale_rewards = \"std\"\n", {"train.scale_rewards = \"std\": must be one of group, batch, none"});
  expect_error("[log]\nlevel = \"loud\"\n", {"log.level = \"loud\": must be one of debug, info, warn, error, quiet"});
  expect_error("[log]\nprogress = \"fancy\"\n", {"log.progress = \"fancy\": must be one of auto, bar, plain, off"});
  expect_error("[data]\non_bad_line = \"drop\"\n", {"data.on_bad_line = \"drop\": must be one of fail, skip"});
  expect_error("[data.arithmetic]\nstyle = \"long\"\n",
               {"data.arithmetic.style = \"long\": must be one of compact, verbose, expression"});
  auto o = run_config_parse("[train]\nlr_schedule = \"cosine\"\n[log]\nlevel = \"warn\"\nprogress = \"off\"\n", "cfg.toml",
                            {"train.scale_rewards=none", "data.on_bad_line=skip", "data.arithmetic.style=verbose"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->train.lr_schedule, LrScheduleType::cosine);
  EXPECT_EQ(o->log.level, LogLevel::warn);
  EXPECT_EQ(o->log.progress, ProgressSetting::off);
  EXPECT_EQ(o->train.scale_rewards, ScaleRewards::none);
  EXPECT_EQ(o->data.on_bad_line, BadLinePolicy::skip);
  EXPECT_EQ(o->data.arithmetic.style, ArithmeticStyle::verbose);
  EXPECT_EQ(run_config_key_values("log.level"), "debug, info, warn, error, quiet");
}

TEST(EngineConfig, MovedKeySaysWhereItWent) {
  expect_error("[rollout]\nkv_cache_dtype = \"fp8\"\n",
               {"cfg.toml:2:", "rollout.kv_cache_dtype has moved to engine.kv_cache_dtype", "[engine]"});
  expect_error("", {"--set rollout.kv_cache_dtype=fp8", "has moved to engine.kv_cache_dtype"},
               {"rollout.kv_cache_dtype=fp8"});
}

TEST(EngineConfig, BadValuesNameTheKey) {
  expect_error("[engine]\nblock_size = 0\n", {"engine.block_size = 0: must be in 1..1024"});
  expect_error("[engine]\ngpu_memory_utilization = 1.5\n", {"engine.gpu_memory_utilization = 1.5: must be in (0, 1]"});
  expect_error("[engine]\ngpu_memory_utilization = 0\n", {"engine.gpu_memory_utilization = 0"});
  expect_error("[engine]\nkv_cache_mib = -1\n", {"engine.kv_cache_mib = -1"});
  expect_error("[engine]\nmax_num_seqs = 100\nmax_num_batched_tokens = 50\n",
               {"engine.max_num_seqs = 100: must be <= max_num_batched_tokens (50)"});
  expect_error("[engine]\nmax_model_len = -3\n", {"engine.max_model_len = -3"});
  expect_error("[engine]\nblock_size = \"big\"\n", {"engine.block_size = \"big\": expected an integer"});
  expect_error("[engine]\nblocksize = 16\n", {"unknown key 'blocksize' in section [engine]", "block_size"});
  expect_error("[rollout]\nmax_new_tokens = 8\nmin_new_tokens = 9\n", {"rollout.min_new_tokens = 9"});
  expect_error("[train]\nmicro_batch_tokens = 0\n", {"train.micro_batch_tokens = 0: must be >= 1"});
}

ModelConfig small_model();

TEST(EngineConfig, SpeculativeKeys) {
  auto r = run_config_parse("[engine.speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 6\nngram_min = 2\n"
                            "ngram_max = 5\nadaptive = false\nprobe_every = 8\n",
                            "cfg.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SpeculativeConfig& sp = r->engine.speculative;
  EXPECT_EQ(sp.method, SpecMethod::ngram);
  EXPECT_EQ(sp.num_speculative_tokens, 6);
  EXPECT_EQ(sp.ngram_min, 2);
  EXPECT_EQ(sp.ngram_max, 5);
  EXPECT_FALSE(sp.adaptive);
  EXPECT_EQ(sp.probe_every, 8);
  auto j = run_config_to_json(*r);
  EXPECT_EQ(j["engine"]["speculative"]["method"], "ngram");
  auto back = run_config_parse(run_config_to_toml(*r), "dumped.toml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(run_config_to_json(*back), j);
  EXPECT_EQ(RunConfig{}.engine.speculative.method, SpecMethod::off);
  EXPECT_EQ(run_config_key_values("engine.speculative.method"), "off, draft, ngram");
  // The options the engine gets.
  const SpeculativeOptions o = sp.options();
  EXPECT_EQ(o.method, SpecMethod::ngram);
  EXPECT_EQ(o.num_speculative_tokens, 6);
  EXPECT_FALSE(o.adaptive);
  auto eo = engine_options_from_config(r->engine, Device::cpu, small_model(), DType::f32, {}, 8);
  ASSERT_TRUE(eo.ok()) << eo.status().message();
  EXPECT_EQ(eo->speculative.method, SpecMethod::ngram);
  EXPECT_EQ(eo->speculative.ngram_max, 5);
  // Errors name the key.
  expect_error("", {"engine.speculative.method = \"eagle\": must be one of off, draft, ngram"},
               {"engine.speculative.method=eagle"});
  expect_error("", {"engine.speculative.draft_model", "required with speculative.method = \"draft\""},
               {"engine.speculative.method=draft"});
  expect_error("", {"engine.speculative.draft_model", "is set but speculative.method = \"off\""},
               {"engine.speculative.draft_model=/tmp/x"});
  expect_error("", {"engine.speculative.num_speculative_tokens = 0: must be in [1, 16]"},
               {"engine.speculative.method=ngram", "engine.speculative.num_speculative_tokens=0"});
  expect_error("", {"engine.speculative.ngram_min = 3"},
               {"engine.speculative.method=ngram", "engine.speculative.ngram_min=3", "engine.speculative.ngram_max=2"});
  expect_error("", {"tandem.enabled", "cannot be combined"}, {"tandem.enabled=true", "engine.speculative.method=ngram"});
}

// A small Llama-shaped config for the arithmetic below.
ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  return c;
}

TEST(EngineConfig, KvBudgetArithmetic) {
  EngineConfig c;
  c.gpu_memory_utilization = 0.5;
  MemoryUse m;
  m.total = 1000 << 20;  // 1000 MiB
  m.weights = 100 << 20;
  m.optimizer = 120 << 20;
  m.reference = 30 << 20;
  m.activations = 50 << 20;
  m.engine_buffers = 20 << 20;
  m.other = 80 << 20;
  // 500 MiB allowed − 400 MiB held = 100 MiB.
  auto b = engine_kv_budget(c, Device::cuda, m, 1 << 20);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b.value(), size_t(100) << 20);
  // Too little left: the error names the key, the parts and what to change.
  c.gpu_memory_utilization = 0.35;
  auto e = engine_kv_budget(c, Device::cuda, m, 1 << 20);
  ASSERT_FALSE(e.ok());
  for (const char* w : {"engine.gpu_memory_utilization = 0.35", "weights 100.0 MiB", "optimizer 120.0 MiB",
                        "activations 50.0 MiB", "nothing", "engine.kv_cache_mib"})
    EXPECT_NE(e.status().message().find(w), std::string::npos) << e.status().message();
  // An explicit budget wins; the CPU has a fixed default.
  c.kv_cache_mib = 64;
  EXPECT_EQ(engine_kv_budget(c, Device::cuda, m, 1 << 20).value(), size_t(64) << 20);
  c.kv_cache_mib = 0;
  EXPECT_EQ(engine_kv_budget(c, Device::cpu, m, 1 << 20).value(), size_t(kCpuKvCacheMib) << 20);
}

TEST(EngineConfig, OptionsFromConfig) {
  const ModelConfig mc = small_model();
  EngineConfig c;
  c.block_size = 8;
  c.max_num_batched_tokens = 256;
  c.enable_chunked_prefill = true;
  c.enable_prefix_caching = false;
  c.cuda_graph_max_context = 128;
  MemoryUse m;
  m.total = size_t(64) << 20;
  m.weights = size_t(10) << 20;
  c.gpu_memory_utilization = 0.5;
  // CUDA: graphs on by default; budget = 32 MiB − 10 MiB − the engine's buffers.
  auto g = engine_options_from_config(c, Device::cuda, mc, DType::bf16, m, 24);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(g->use_cuda_graphs);
  EXPECT_EQ(g->max_num_seqs, 24);  // the caller's default for max_num_seqs = 0
  EXPECT_EQ(g->block_size, 8);
  EXPECT_EQ(g->max_num_batched_tokens, 256);
  EXPECT_FALSE(g->enable_prefix_caching);
  EXPECT_EQ(g->cuda_graph_max_context, 128);
  const size_t buffers = engine_buffer_bytes(mc, DType::bf16, 24, 256, 512, 8);
  EXPECT_EQ(g->kv_cache_bytes, (size_t(32) << 20) - (size_t(10) << 20) - buffers);
  // Hand count of the largest part, the logits rows: 24 × 1000 × 4 bytes.
  EXPECT_GT(buffers, size_t(24) * 1000 * 4);
  // KV blocks: budget / (2 · L · block · Hkv · D · 2 bytes).
  const size_t per_block = size_t(2) * 2 * 8 * 2 * 16 * 2;
  EXPECT_EQ(kv_block_bytes(mc, DType::bf16, 8), per_block);
  EXPECT_EQ(engine_kv_blocks(mc, DType::bf16, *g).value(), int(g->kv_cache_bytes / per_block));
  // CPU: graphs off under auto, refused when asked for; explicit sizes pass through.
  auto cpu = engine_options_from_config(c, Device::cpu, mc, DType::f32, {}, 24);
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->use_cuda_graphs);
  EXPECT_EQ(cpu->kv_cache_bytes, size_t(kCpuKvCacheMib) << 20);
  c.cuda_graphs = CudaGraphsMode::off;
  EXPECT_FALSE(engine_options_from_config(c, Device::cuda, mc, DType::bf16, m, 24)->use_cuda_graphs);
  c.cuda_graphs = CudaGraphsMode::on;
  auto on_cpu = engine_options_from_config(c, Device::cpu, mc, DType::f32, {}, 24);
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_NE(on_cpu.status().message().find("engine.cuda_graphs"), std::string::npos);
  c.cuda_graphs = CudaGraphsMode::automatic;
  c.max_num_seqs = 300;  // more sequences than tokens per step
  auto too_many = engine_options_from_config(c, Device::cpu, mc, DType::f32, {}, 24);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("max_num_batched_tokens"), std::string::npos);
  c.max_num_seqs = 0;
  c.kv_cache_dtype = KvCacheDtype::fp8_e4m3;  // head_dim 16: allowed, one byte per element
  auto f8 = engine_options_from_config(c, Device::cpu, mc, DType::f32, {}, 24);
  ASSERT_TRUE(f8.ok()) << f8.status().message();
  EXPECT_EQ(engine_kv_blocks(mc, DType::f32, *f8).value(), int((size_t(kCpuKvCacheMib) << 20) / (per_block / 2)));
}

TEST(EngineConfig, ActivationEstimateShrinksWithRecompute) {
  const ModelConfig mc = small_model();
  const size_t full = train_model_activation_bytes(mc, DType::bf16, 1024, false);
  const size_t rec = train_model_activation_bytes(mc, DType::bf16, 1024, true);
  // Lower bound by hand: the stored q, k, v, attention output and MLP activations of
  // both layers, 1024 tokens, 2 bytes each: 2 · 1024 · (64 + 2·32 + 64 + 3·128) · 2.
  EXPECT_GE(full, size_t(2) * 1024 * (64 + 2 * 32 + 64 + 3 * 128) * 2);
  EXPECT_LT(rec, full);
  EXPECT_EQ(train_model_activation_bytes(mc, DType::bf16, 2048, false), 2 * full);
}

}  // namespace
}  // namespace grpo
