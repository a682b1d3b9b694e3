// Bitwise on-policy on the CPU (train.on_policy = "bitwise", docs/bitwise.md): the
// logprob the engine reports for every sampled token equals, bit for bit, the one
// train_model_forward computes for it in the forward whose gradient is taken. Each
// case runs real rollouts through the scheduler (prefix-cache hits between samples
// and across calls, chunked prefill under a small token budget, preemption in a tiny
// KV pool, prompts of mixed lengths in one batch, temperatures 1 and 0.7, LoRA), then the
// trainer's forward over the same sequences packed into micro-batches of another
// composition, and compares the floats with memcmp. A last case shows that the
// default engine does not give the trainer's bits, so the property is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "../engine/engine_test_util.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "kernels/linear.h"
#include "model/presets.h"
#include "train/run_config.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

struct Rollout {
  std::vector<std::vector<int32_t>> seqs;  // prompt + completion
  std::vector<int32_t> prompt_lens;
  std::vector<std::vector<float>> logp;    // the logprobs the GRPO loop hands the trainer
  int64_t prefix_hits = 0, preemptions = 0;
};

EngineOptions opts(bool bitwise, int n_kv_blocks, const LoraWeights* lora = nullptr) {
  EngineOptions o;
  o.lora = lora;
  o.block_size = 4;
  o.n_kv_blocks = n_kv_blocks;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 12;  // prompts longer than this are prefilled in chunks
  o.bitwise_logprobs = bitwise;
  return o;
}

// Prompts of mixed lengths (1 to 29 tokens) drawn from the vocabulary.
std::vector<std::vector<int32_t>> mixed_prompts(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, vocab - 1);
  std::vector<std::vector<int32_t>> ps;
  for (int len : {13, 1, 29, 6, 17}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = id(rng);
    ps.push_back(p);
  }
  return ps;
}

// Two generate calls on one engine: the second repeats the first prompts (prefix hits
// on prompts cached by the first call) under another seed.
Rollout roll(Context& ctx, ModelWeights& w, const std::vector<std::vector<int32_t>>& prompts, float temperature,
             const EngineOptions& o, uint64_t seed0 = 11, int max_tokens = 14) {
  Engine eng(ctx, w, nullptr, o);
  Rollout r;
  for (uint64_t seed : {seed0, seed0 + 1}) {
    SamplingParams p;
    p.n = 3;  // siblings share their prompt's full blocks
    p.seed = seed;
    p.temperature = temperature;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.logprobs_mode = temperature == 1.f ? LogprobsMode::raw : LogprobsMode::processed;  // as the GRPO loop asks
    auto out = eng.generate(prompts, p);
    EXPECT_TRUE(out.ok()) << out.status().message();
    if (!out.ok()) return r;
    for (const RequestOutput& ro : out.value()) {
      std::vector<int32_t> s = ro.prompt_ids;
      s.insert(s.end(), ro.completion_ids.begin(), ro.completion_ids.end());
      r.seqs.push_back(s);
      r.prompt_lens.push_back(int32_t(ro.prompt_ids.size()));
      r.logp.push_back(ro.logprobs);
      r.prefix_hits += ro.telemetry.prefix_hit_tokens;
    }
  }
  r.preemptions = eng.stats().preemptions;
  return r;
}

// The trainer's logprobs of every completion token, from forwards that keep activations
// for backward, over micro-batches of `micro` sequences taken in reverse order.
std::vector<std::vector<float>> train_logprobs(Context& ctx, const ModelWeights& w, const Rollout& r,
                                               float temperature, int micro, const LoraWeights* lora = nullptr) {
  TrainModelOptions mo;
  mo.temperature = temperature;
  TrainModel m(mo);
  m.lora = lora;
  std::vector<std::vector<float>> lp(r.seqs.size());
  for (int end = int(r.seqs.size()); end > 0; end -= micro) {
    const int begin = std::max(0, end - micro);
    std::vector<std::vector<int32_t>> seqs;
    std::vector<int32_t> plens;
    for (int i = end - 1; i >= begin; --i) {
      seqs.push_back(r.seqs[size_t(i)]);
      plens.push_back(r.prompt_lens[size_t(i)]);
    }
    auto b = train_batch_build(ctx, seqs, plens, w.config.vocab_size);
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!b.ok()) return lp;
    Tensor logp = tensor_empty(ctx.device(), DType::f32, {int64_t(b->n_completion)});
    train_model_forward(ctx, m, w, *b, logp, nullptr, true);
    Tensor host = tensor_empty(Device::cpu, DType::f32, {int64_t(b->n_completion)});
    tensor_copy(host, logp);
    for (int k = 0; k < int(seqs.size()); ++k) {
      const int i = end - 1 - k;
      const float* p = host.ptr<float>() + b->completion_offsets[size_t(k)];
      lp[size_t(i)].assign(p, p + (b->completion_offsets[size_t(k) + 1] - b->completion_offsets[size_t(k)]));
    }
  }
  return lp;
}

struct Mismatch {
  int64_t n_tokens = 0, n_differ = 0;
  double max_abs = 0;
};

Mismatch compare(const Rollout& r, const std::vector<std::vector<float>>& trained) {
  Mismatch m;
  for (size_t i = 0; i < r.seqs.size(); ++i) {
    EXPECT_EQ(r.logp[i].size(), trained[i].size()) << "sequence " << i;
    const size_t n = std::min(r.logp[i].size(), trained[i].size());
    for (size_t j = 0; j < n; ++j) {
      ++m.n_tokens;
      if (std::memcmp(&r.logp[i][j], &trained[i][j], sizeof(float)) != 0) {
        ++m.n_differ;
        m.max_abs = std::max(m.max_abs, std::abs(double(r.logp[i][j]) - double(trained[i][j])));
      }
    }
  }
  return m;
}

ContextOptions det() {
  ContextOptions o;
  o.deterministic = true;
  o.n_threads = 2;
  return o;
}

// Every scenario on one model: roomy pool (prefix hits, chunked prefill, mixed batches)
// and a pool so small that sequences are preempted and recomputed; T = 1 and 0.7.
void expect_bitwise(ModelWeights& w, uint32_t seed, const LoraWeights* lora = nullptr) {
  const auto prompts = mixed_prompts(w.config.vocab_size, seed);
  for (float temperature : {1.f, 0.7f}) {
    for (int n_blocks : {256, 14}) {
      SCOPED_TRACE("temperature " + std::to_string(temperature) + ", " + std::to_string(n_blocks) + " KV blocks");
      Context ctx(det());
      const Rollout r = roll(ctx, w, prompts, temperature, opts(true, n_blocks, lora));
      ASSERT_EQ(r.seqs.size(), 2 * 3 * prompts.size());
      EXPECT_GT(r.prefix_hits, 0);
      if (n_blocks < 64) EXPECT_GT(r.preemptions, 0) << "the tiny pool should force preemption";
      for (int micro : {1, 7}) {
        const Mismatch m = compare(r, train_logprobs(ctx, w, r, temperature, micro, lora));
        EXPECT_GT(m.n_tokens, 0);
        EXPECT_EQ(m.n_differ, 0) << m.n_differ << " of " << m.n_tokens << " logprobs differ (max |Δ| " << m.max_abs
                                 << ") with trainer micro-batches of " << micro;
      }
    }
  }
}

ModelWeights preset_weights(const std::string& name, uint32_t seed, int window = 0) {
  auto cfg = preset_config(name);
  GRPO_CHECK_MSG(cfg.ok(), cfg.status().message().c_str());
  ModelConfig c = cfg.value();
  if (window > 0) {  // every layer windowed, narrower than the sequences
    c.sliding_window = window;
    c.layer_window.assign(size_t(c.n_layers), window);
  }
  return random_weights(c, seed);
}

}  // namespace

TEST(Bitwise, Stories260KLlama) { expect_bitwise(stories().w, 1); }

TEST(Bitwise, TinyQwen2Bias) {
  ModelWeights w = preset_weights("tiny-qwen2", 2);
  expect_bitwise(w, 2);
}

TEST(Bitwise, TinyQwen3QkNorm) {
  ModelWeights w = preset_weights("tiny-qwen3", 3);
  expect_bitwise(w, 3);
}

TEST(Bitwise, TinyLlamaRopeScalingUntiedHead) {
  ModelWeights w = preset_weights("tiny-llama", 4);
  expect_bitwise(w, 4);
}

TEST(Bitwise, TinyMistralSlidingWindow) {
  ModelWeights w = preset_weights("tiny-mistral", 5, 9);
  expect_bitwise(w, 5);
}

// LoRA adapters on every projection, unmerged on both sides (the engine adds them per row
// group after the base product, the trainer over the packed batch). B is random, not PEFT's
// zero start, so that the adapters change every output.
TEST(Bitwise, LoraAdaptersOnTinyQwen2) {
  ModelWeights w = preset_weights("tiny-qwen2", 6);
  LoraConfig lc;
  lc.enabled = true;
  lc.r = 4;
  LoraWeights lora = lora_allocate(w.config, lc, Device::cpu, DType::f32);
  lora_init(lora, 6);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (auto& [name, t] : lora.params())
    if (name.size() > 2 && name.compare(name.size() - 2, 2, ".B") == 0)
      for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = nd(rng);
  expect_bitwise(w, 6, &lora);
}

// The default engine (sampler's logprobs from its own logits, GEMMs shaped by the batch)
// does not reproduce the trainer's bits: what the bitwise mode changes is needed.
TEST(Bitwise, DefaultModeIsNotBitwise) {
  ModelWeights& w = stories().w;
  Context ctx;
  const Rollout r = roll(ctx, w, mixed_prompts(w.config.vocab_size, 1), 1.f, opts(false, 256));
  const Mismatch m = compare(r, train_logprobs(ctx, w, r, 1.f, 7));
  EXPECT_GT(m.n_differ, 0) << "the default mode matched the trainer bit for bit on " << m.n_tokens << " tokens";
  EXPECT_LT(m.max_abs, 1e-3);  // yet it is the same function up to f32 rounding
}

TEST(Bitwise, ConfigRefusesWhatItCannotMatch) {
  auto refused = [](const std::function<void(RunConfig&)>& edit, const std::string& needle) {
    RunConfig c;
    c.model.device = DeviceSpec{Device::cpu, -1};
    c.model.dtype = DType::f32;
    c.train.on_policy = OnPolicy::bitwise;
    edit(c);
    const Status s = c.validate();
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  {
    RunConfig c;
    c.model.device = DeviceSpec{Device::cpu, -1};
    c.model.dtype = DType::f32;
    c.train.on_policy = OnPolicy::bitwise;
    EXPECT_TRUE(c.validate().ok()) << c.validate().message();
  }
  {
    RunConfig c;
    const Status s = run_config_set(&c, "train.on_policy=exact");
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("must be one of default, bitwise"), std::string::npos) << s.message();
  }
  refused(
      [](RunConfig& c) {
        c.model.device = DeviceSpec{Device::cuda, -1};
        c.model.dtype = DType::f32;
      },
      "model.dtype = \"bf16\"");
  refused(
      [](RunConfig& c) {
        c.model.device = DeviceSpec{Device::cuda, -1};
        c.model.dtype = DType::bf16;
        c.lora.enabled = true;
      },
      "LoRA");
  refused([](RunConfig& c) { c.engine.kv_cache_dtype = KvCacheDtype::fp8_e4m3; }, "kv_cache_dtype");
  refused([](RunConfig& c) { c.rollout.top_p = 0.9; }, "top_p = 1");
  refused([](RunConfig& c) { c.tandem.enabled = true; }, "tandem");
}

// ---- CUDA (docs/bitwise.md): real architectures at their real sizes, random bf16 weights ----
// The engine with CUDA graphs, block size 16, chunked prefill (a 96-token budget against
// prompts up to 300 tokens, so contexts cross the attention's 256-key partitions),
// prefix-cache hits, and a pool small enough to preempt; the trainer's forward over the same
// sequences in micro-batches of 1 and 7. Skips without an sm_90 GPU.
namespace {

bool bitwise_cuda_ready(std::string* why) {
  if (!cuda_available()) {
    *why = "no CUDA device";
    return false;
  }
  ContextOptions o;
  o.device = Device::cuda;
  o.workspace_bytes = size_t(64) << 20;
  Context probe(o);
  *why = batch_invariant_gemm_problem(probe, DType::bf16);
  return why->empty();
}

std::vector<std::vector<int32_t>> long_prompts(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, std::min(vocab, 150000) - 1);
  std::vector<std::vector<int32_t>> ps;
  for (int len : {37, 1, 300, 120, 251}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = id(rng);
    ps.push_back(p);
  }
  return ps;
}

EngineOptions cuda_opts(bool bitwise, int n_kv_blocks) {
  EngineOptions o;
  o.block_size = 16;
  o.n_kv_blocks = n_kv_blocks;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 96;
  o.max_model_len = 512;
  o.use_cuda_graphs = true;
  o.bitwise_logprobs = bitwise;
  return o;
}

Rollout roll_cuda(Context& ctx, ModelWeights& w, const std::vector<std::vector<int32_t>>& prompts, float temperature,
                  const EngineOptions& o) {
  return roll(ctx, w, prompts, temperature, o, 21, 24);
}

ContextOptions cuda_bitwise() {
  ContextOptions o;
  o.device = Device::cuda;
  o.deterministic = true;
  o.batch_invariant = true;
  return o;
}

// window > 0: every layer attends over a sliding window of that many keys (Mistral's layers).
void expect_bitwise_cuda(const std::string& preset, int window = 0) {
  std::string why;
  if (!bitwise_cuda_ready(&why)) GTEST_SKIP() << why;
  auto cfg = preset_config(preset);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  if (window > 0) {
    cfg->sliding_window = window;
    cfg->layer_window.assign(size_t(cfg->n_layers), window);
  }
  Context ctx(cuda_bitwise());
  ModelWeights w = weights_random(cfg.value(), Device::cuda, DType::bf16, 7, &ctx);
  const auto prompts = long_prompts(cfg->vocab_size, 7);
  for (float temperature : {1.f, 0.7f}) {
    // 120 blocks hold every sequence at once; 40 blocks (640 positions) force preemption.
    for (int n_blocks : {120, 40}) {
      SCOPED_TRACE(preset + ", temperature " + std::to_string(temperature) + ", " + std::to_string(n_blocks) +
                   " KV blocks");
      const Rollout r = roll_cuda(ctx, w, prompts, temperature, cuda_opts(true, n_blocks));
      ASSERT_EQ(r.seqs.size(), 2 * 3 * prompts.size());
      EXPECT_GT(r.prefix_hits, 0);
      if (n_blocks < 64) EXPECT_GT(r.preemptions, 0) << "the small pool should force preemption";
      for (int micro : {1, 7}) {
        const Mismatch m = compare(r, train_logprobs(ctx, w, r, temperature, micro));
        EXPECT_GT(m.n_tokens, 0);
        EXPECT_EQ(m.n_differ, 0) << m.n_differ << " of " << m.n_tokens << " logprobs differ (max |Δ| " << m.max_abs
                                 << ") with trainer micro-batches of " << micro;
      }
    }
  }
}

}  // namespace

TEST(BitwiseCuda, Qwen25HalfB) { expect_bitwise_cuda("qwen2.5-0.5b"); }
TEST(BitwiseCuda, Qwen3SixTenthsB) { expect_bitwise_cuda("qwen3-0.6b"); }
TEST(BitwiseCuda, Llama32OneB) { expect_bitwise_cuda("llama-3.2-1b"); }
TEST(BitwiseCuda, Qwen25SlidingWindow) { expect_bitwise_cuda("qwen2.5-0.5b", 100); }

// The default CUDA engine (cuBLASLt by shape, tensor-core prefill tiles, the sampler's own
// logprobs) differs from the default trainer: the property above is not vacuous.
TEST(BitwiseCuda, DefaultModeIsNotBitwise) {
  std::string why;
  if (!bitwise_cuda_ready(&why)) GTEST_SKIP() << why;
  auto cfg = preset_config("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  ContextOptions o;
  o.device = Device::cuda;
  Context ctx(o);
  ModelWeights w = weights_random(cfg.value(), Device::cuda, DType::bf16, 7, &ctx);
  const Rollout r = roll_cuda(ctx, w, long_prompts(cfg->vocab_size, 7), 1.f, cuda_opts(false, 120));
  const Mismatch m = compare(r, train_logprobs(ctx, w, r, 1.f, 7));
  EXPECT_GT(m.n_differ, 0) << "the default mode matched the trainer bit for bit on " << m.n_tokens << " tokens";
  std::printf("default mode on CUDA: %lld of %lld logprobs differ, max |d| %.3g\n", (long long)m.n_differ,
              (long long)m.n_tokens, m.max_abs);
}
