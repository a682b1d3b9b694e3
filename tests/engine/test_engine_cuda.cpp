// Engine on CUDA (skipped without a visible GPU): llama2.c's golden greedy
// prefix in f32, CUDA graphs giving the same outputs as eager decode, and
// batch-composition independence of sampled bf16 rollouts.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "engine_test_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

#define REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

ModelWeights& cuda_stories(DType dt) {
  static ModelWeights* f32 = nullptr;
  static ModelWeights* bf16 = nullptr;
  ModelWeights*& slot = dt == DType::f32 ? f32 : bf16;
  if (!slot) {
    auto w = model_load(stories().dir, Device::cuda, dt);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    slot = new ModelWeights(std::move(w).value());
  }
  return *slot;
}

ContextOptions cuda_ctx() {
  ContextOptions o;
  o.device = Device::cuda;
  o.deterministic = true;
  return o;
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

}  // namespace

TEST(EngineCuda, GreedyF32FollowsTheGoldenPrefix) {
  REQUIRE_CUDA();
  Context ctx(cuda_ctx());
  Engine eng(ctx, cuda_stories(DType::f32), nullptr, opts(false));
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = 40;
  p.ignore_eos = true;
  auto out = eng.generate({{1}}, p);
  ASSERT_TRUE(out.ok()) << out.status().message();
  auto golden = read_ids(stories_dir() + "/golden_greedy_t0_200steps.ids.txt");
  EXPECT_EQ(out.value()[0].completion_ids, std::vector<int32_t>(golden.begin() + 1, golden.begin() + 41));
}

TEST(EngineCuda, GraphsGiveTheSameOutputsAsEagerDecode) {
  REQUIRE_CUDA();
  SamplingParams p;
  p.seed = 21;
  p.n = 3;
  p.max_tokens = 48;
  p.ignore_eos = true;
  Context c1(cuda_ctx()), c2(cuda_ctx());
  Engine eager(c1, cuda_stories(DType::bf16), nullptr, opts(false));
  Engine graphs(c2, cuda_stories(DType::bf16), nullptr, opts(true));
  auto a = eager.generate(prompts(), p);
  auto b = graphs.generate(prompts(), p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(graphs.stats().graph_replays, 0);
  for (size_t i = 0; i < a.value().size(); ++i) {
    EXPECT_EQ(a.value()[i].completion_ids, b.value()[i].completion_ids) << i;
    EXPECT_EQ(a.value()[i].logprobs_raw, b.value()[i].logprobs_raw) << i;
  }
}

// Issue 3 asks for batch-composition independence in fp32. (In bf16, cuBLASLt picks
// different GEMM kernels for different batch sizes, so logprobs differ in the last
// bits and a near-tie sample may flip; docs/engine.md records this.)
TEST(EngineCuda, OutputsDoNotDependOnBatchComposition) {
  REQUIRE_CUDA();
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 8;
  p.max_tokens = 40;
  p.ignore_eos = true;
  const auto target = prompts()[2];
  Context c1(cuda_ctx()), c2(cuda_ctx());
  Engine alone(c1, cuda_stories(DType::f32), nullptr, opts(false));
  Engine crowd(c2, cuda_stories(DType::f32), nullptr, opts(false));
  auto a = alone.generate({target}, p);
  SamplingParams other = p;
  other.seed = 1;
  other.n = 4;
  for (const auto& pr : prompts()) ASSERT_TRUE(crowd.add_request(pr, other).ok());
  auto b = crowd.generate({prompts()[1], target}, p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a.value()[0].completion_ids, b.value()[1].completion_ids);
  // Logprobs agree to rounding, not bit for bit: cuBLASLt chooses its f32 GEMM kernel by
  // batch size (measured on an H200: |Δ| ≤ 3e-6). A batch-invariant GEMM would make them
  // equal; that is open work (docs/engine.md).
  const auto& la = a.value()[0].logprobs_raw;
  const auto& lb = b.value()[1].logprobs_raw;
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 + 1e-5 * std::fabs(la[i])) << i;
}
