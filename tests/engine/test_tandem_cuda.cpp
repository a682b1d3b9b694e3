// Tandem decoding on CUDA (skipped without a visible GPU). The trained model is
// stories260K, the partner a random tiny-llama of another shape with the same
// vocabulary. Checks: p_trained = 1 is the vanilla CUDA engine bit for bit and
// p_trained = 0 the partner's own CUDA engine (eager and with CUDA graphs, which
// then cover both forwards); mixed rollouts are the same with and without graphs;
// in f32 every emitted token's logprobs under both models match a CPU full forward
// (both caches in sync, with preemption); logits_row_logprobs matches the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/engine.h"
#include "engine/tandem.h"
#include "engine_test_util.h"
#include "kernels/row_logprob.h"
#include "model/presets.h"

using namespace grpo;
using namespace grpo::test;

namespace {

#define REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

ContextOptions cuda_ctx() {
  ContextOptions o;
  o.device = Device::cuda;
  o.deterministic = true;
  return o;
}

ModelConfig partner_config() {
  PresetOverrides ov;
  ov.vocab_size = stories().w.config.vocab_size;
  ModelConfig c = preset_config("tiny-llama", ov).value();
  c.initializer_range = 0.3f;
  c.max_position_embeddings = stories().w.config.max_position_embeddings;
  return c;
}

// Models on the device (and the partner on the host for the CPU references), loaded once per dtype.
struct Pair {
  ModelWeights trained, partner, partner_host;
};
Pair& models(DType dt) {
  static Pair* slots[2] = {nullptr, nullptr};
  Pair*& p = slots[dt == DType::f32 ? 0 : 1];
  if (!p) {
    p = new Pair;
    auto w = model_load(stories().dir, Device::cuda, dt);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    p->trained = std::move(w).value();
    p->partner = weights_random(partner_config(), Device::cuda, dt, 77);
    p->partner_host = weights_random(partner_config(), Device::cpu, DType::f32, 77);
  }
  return *p;
}

EngineOptions opts(bool graphs) {
  EngineOptions o;
  o.block_size = 16;
  o.n_kv_blocks = 256;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  o.use_cuda_graphs = graphs;
  return o;
}

std::vector<std::vector<int32_t>> prompts() {
  auto g = read_ids(stories_dir() + "/golden_greedy_t0_200steps.ids.txt");
  return {{1}, std::vector<int32_t>(g.begin(), g.begin() + 9), std::vector<int32_t>(g.begin(), g.begin() + 40),
          {1, g[70], g[71]}};
}

SamplingParams sampled(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.n = 2;
  p.max_tokens = 40;
  p.ignore_eos = true;
  return p;
}

TandemOptions topts(TandemStrategy s, double p) {
  TandemOptions o;
  o.strategy = s;
  o.p_trained = p;
  o.chunk_size = 4;
  o.seed = 5;
  if (s == TandemStrategy::word) {
    GRPO_CHECK(stories().tok != nullptr);
    o.token_flags = tandem_word_flags(*stories().tok, stories().w.config.vocab_size);
  }
  return o;
}

std::vector<RequestOutput> run(const ModelWeights& w, const EngineOptions& eo, const EngineTandem* t,
                               const SamplingParams& p, int64_t* graph_replays = nullptr) {
  Context ctx(cuda_ctx());
  Engine eng(ctx, const_cast<ModelWeights&>(w), nullptr, eo, t);
  auto out = eng.generate(prompts(), p);
  GRPO_CHECK_MSG(out.ok(), out.status().message().c_str());
  if (graph_replays) *graph_replays = eng.stats().graph_replays;
  return std::move(out).value();
}

}  // namespace

TEST(TandemCuda, ExtremesAreTheSingleModelEnginesBitForBit) {
  REQUIRE_CUDA();
  Pair& m = models(DType::bf16);
  for (bool graphs : {false, true}) {
    const SamplingParams p = sampled(31);
    const auto vanilla = run(m.trained, opts(graphs), nullptr, p);
    const auto alone = run(m.partner, opts(graphs), nullptr, p);
    for (auto s : {TandemStrategy::token, TandemStrategy::chunk}) {
      EngineTandem one{&m.partner, topts(s, 1.0)}, zero{&m.partner, topts(s, 0.0)};
      int64_t replays = 0;
      const auto a = run(m.trained, opts(graphs), &one, p, &replays);
      const auto b = run(m.trained, opts(graphs), &zero, p);
      if (graphs) EXPECT_GT(replays, 0);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].completion_ids, vanilla[i].completion_ids) << "p=1 graphs=" << graphs << " " << i;
        EXPECT_EQ(a[i].logprobs_raw, vanilla[i].logprobs_raw) << "p=1 graphs=" << graphs << " " << i;
        EXPECT_EQ(b[i].completion_ids, alone[i].completion_ids) << "p=0 graphs=" << graphs << " " << i;
        EXPECT_EQ(b[i].logprobs_raw, alone[i].logprobs_raw) << "p=0 graphs=" << graphs << " " << i;
      }
    }
  }
}

TEST(TandemCuda, GraphsCoverBothForwardsWithTheSameOutputs) {
  REQUIRE_CUDA();
  Pair& m = models(DType::bf16);
  EngineTandem t{&m.partner, topts(TandemStrategy::token, 0.5)};
  const SamplingParams p = sampled(41);
  int64_t replays = 0;
  const auto eager = run(m.trained, opts(false), &t, p);
  const auto graphs = run(m.trained, opts(true), &t, p, &replays);
  EXPECT_GT(replays, 0);
  int switches = 0;
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(eager[i].completion_ids, graphs[i].completion_ids) << i;
    EXPECT_EQ(eager[i].model_mask, graphs[i].model_mask) << i;
    EXPECT_EQ(eager[i].logprobs_raw, graphs[i].logprobs_raw) << i;
    EXPECT_EQ(eager[i].logprobs_trained, graphs[i].logprobs_trained) << i;
    for (size_t j = 1; j < eager[i].model_mask.size(); ++j) switches += eager[i].model_mask[j] != eager[i].model_mask[j - 1];
  }
  EXPECT_GT(switches, 5);
}

TEST(TandemCuda, F32CachesStayInSyncWithPreemption) {
  REQUIRE_CUDA();
  Pair& m = models(DType::f32);
  EngineTandem t{&m.partner, topts(TandemStrategy::token, 0.5)};
  EngineOptions tight = opts(true);
  tight.block_size = 4;
  tight.n_kv_blocks = 40;
  tight.max_num_batched_tokens = 16;
  Context ctx(cuda_ctx());
  Engine eng(ctx, m.trained, nullptr, tight, &t);
  auto out = eng.generate(prompts(), sampled(51));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_GT(eng.stats().preemptions, 0);
  for (const auto& o : out.value()) {
    std::vector<int32_t> seq = o.prompt_ids;
    seq.insert(seq.end(), o.completion_ids.begin(), o.completion_ids.end());
    Context cpu;
    const auto lt = full_logprobs(cpu, stories().w, seq);
    const auto lq = full_logprobs(cpu, m.partner_host, seq);
    const size_t P = o.prompt_ids.size();
    for (size_t i = 0; i < o.completion_ids.size(); ++i) {
      const size_t row = P + i - 1, tok = size_t(o.completion_ids[i]);
      EXPECT_NEAR(o.logprobs_raw[i], o.model_mask[i] ? lt[row][tok] : lq[row][tok], 2e-3) << i;
      EXPECT_NEAR(o.logprobs_trained[i], lt[row][tok], 2e-3) << i;
    }
  }
}

TEST(TandemCuda, RowLogprobsMatchTheCpu) {
  REQUIRE_CUDA();
  const int64_t R = 5, V = 151936;  // a real vocabulary: many partial sums per thread
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<float> z(size_t(R * V)), temps = {1.f, 0.f, 0.7f, 1.3f, 1.f};
  for (float& x : z) x = nd(rng);
  std::vector<int32_t> ids = {0, 151935, 77, 100000, 5};
  Context cpu, gpu(cuda_ctx());
  Tensor hz = tensor_borrow(z.data(), DType::f32, Device::cpu, {R, V});
  Tensor hi = tensor_borrow(ids.data(), DType::i32, Device::cpu, {R});
  Tensor ht = tensor_borrow(temps.data(), DType::f32, Device::cpu, {R});
  Tensor hl = tensor_zeros(Device::cpu, DType::f32, {R});
  logits_row_logprobs(cpu, hl, hz, hi, ht);
  auto to_gpu = [](const Tensor& h) {
    Tensor d = tensor_empty(Device::cuda, h.dtype, std::vector<int64_t>(h.shape, h.shape + h.ndim));
    tensor_copy(d, h);
    return d;
  };
  Tensor dz = to_gpu(hz), di = to_gpu(hi), dt = to_gpu(ht), dl = tensor_zeros(Device::cuda, DType::f32, {R});
  logits_row_logprobs(gpu, dl, dz, di, dt);
  gpu.synchronize();
  const std::vector<float> back = tensor_to_f32(dl);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = z.data() + r * V;
    const double inv = temps[size_t(r)] > 0 ? 1.0 / temps[size_t(r)] : 1.0;
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v] * inv);
    for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] * inv - m);
    const double want = row[ids[size_t(r)]] * inv - m - std::log(s);
    EXPECT_NEAR(hl.ptr<float>()[r], want, 1e-4) << "cpu row " << r;
    EXPECT_NEAR(back[size_t(r)], want, 1e-4) << "cuda row " << r;
  }
}
