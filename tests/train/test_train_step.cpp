// Optimizer-step orchestration: micro-batch planning, GRPO steps that give the
// same gradients however the samples are split, and an SFT run that fits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/train_step.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

TEST(MicroBatches, Plan) {
  // Tokens [5, 3, 4, 10, 2] under 8 per micro-batch: 5+3 fits, 4 alone (4+10 > 8),
  // 10 alone (over the budget but a sequence is never split), 2.
  MicroBatchOptions mb;
  mb.max_tokens = 8;
  auto p = plan_micro_batches({5, 3, 4, 10, 2}, mb);
  std::vector<std::pair<int, int>> want = {{0, 2}, {2, 3}, {3, 4}, {4, 5}};
  EXPECT_EQ(p, want);
  mb.max_tokens = 100;
  mb.max_seqs = 2;
  want = {{0, 2}, {2, 4}, {4, 5}};
  EXPECT_EQ(plan_micro_batches({5, 3, 4, 10, 2}, mb), want);
}

namespace {
std::vector<GrpoSample> make_samples(const ModelConfig& c, uint32_t seed, bool with_ref) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<GrpoSample> out;
  const int lens[][2] = {{3, 4}, {3, 2}, {3, 5}, {2, 3}, {2, 6}, {2, 1}};
  for (int i = 0; i < 6; ++i) {
    GrpoSample s;
    for (int t = 0; t < lens[i][0]; ++t) s.prompt.push_back(tok(rng));
    for (int t = 0; t < lens[i][1]; ++t) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
    s.truncated = i == 4;
    for (int t = 0; t < lens[i][1]; ++t) {
      s.rollout_logp.push_back(-2.f + 0.3f * nd(rng));
      if (with_ref) s.ref_logp.push_back(-2.f + 0.3f * nd(rng));
      s.weights.push_back(0.5f + 0.1f * float(t));
    }
    out.push_back(s);
  }
  return out;
}
}  // namespace

TEST(GrpoTrainStep, SameGradientsForAnyMicroBatching) {
  Context ctx;
  ModelConfig c = tiny_config(true, true, true);
  for (LossType lt : {LossType::grpo, LossType::dr_grpo, LossType::dapo}) {
    std::vector<float> grads[2];
    double loss[2];
    for (int k = 0; k < 2; ++k) {
      ModelWeights w = random_weights(c, 17);
      Optimizer opt = optimizer_create(ctx, w, AdamWConfig{});
      TrainModel m;
      GrpoStepOptions so;
      so.loss.loss_type = lt;
      so.loss.beta = 0.04f;
      so.loss.epsilon_high = 0.28f;
      so.loss.is_mode = IsMode::token_truncate;
      so.loss.mask_truncated_completions = true;
      so.loss.max_completion_length = 6;
      so.micro.max_tokens = k == 0 ? 1000 : 9;  // one micro-batch vs several of unequal size
      auto samples = make_samples(c, 4, true);
      auto r = grpo_train_step(ctx, m, w, opt, 1e-3, samples, so);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(r->n_micro > 1, k == 1);
      grads[k] = tensor_to_f32(opt.grad_arena);
      loss[k] = r->metrics.loss;
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-6 * (1 + std::fabs(loss[0]))) << loss_type_name(lt);
    double gmax = 0;
    for (float x : grads[0]) gmax = std::max(gmax, double(std::fabs(x)));
    expect_close(grads[1].data(), grads[0].data(), int64_t(grads[0].size()), 1e-6 * gmax, 1e-4,
                 std::string("micro-batching ") + loss_type_name(lt));
  }
}

TEST(GrpoTrainStep, ReferenceLogprobsAndErrors) {
  Context ctx;
  ModelConfig c = tiny_config(false, false, false);
  ModelWeights w = random_weights(c, 2);
  TrainModel m;
  auto samples = make_samples(c, 9, false);
  MicroBatchOptions mb;
  mb.max_tokens = 7;
  auto lp = compute_logprobs(ctx, m, w, samples, mb);
  ASSERT_TRUE(lp.ok());
  ASSERT_EQ(lp->size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    ASSERT_EQ((*lp)[i].size(), samples[i].completion.size());
    for (float x : (*lp)[i]) EXPECT_LT(x, 0.f);
  }
  // The reference model equal to the policy: KL 0 in the step metrics.
  for (size_t i = 0; i < samples.size(); ++i) samples[i].ref_logp = (*lp)[i];
  Optimizer opt = optimizer_create(ctx, w, AdamWConfig{});
  GrpoStepOptions so;
  so.loss.beta = 0.1f;
  auto r = grpo_train_step(ctx, m, w, opt, 0.0, samples, so);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(r->metrics.kl_mean(), 0.0, 1e-6);
  samples[2].weights.pop_back();  // wrong length -> an error naming the field
  auto bad = grpo_train_step(ctx, m, w, opt, 0.0, samples, so);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("weights"), std::string::npos) << bad.status().message();
}

TEST(SftTrainStep, FitsTwoExamples) {
  Context ctx;
  ModelConfig c = tiny_config(true, false, false);
  ModelWeights w = random_weights(c, 6);
  AdamWConfig oc;
  oc.weight_decay = 0.01f;
  Optimizer opt = optimizer_create(ctx, w, oc);
  TrainModel m;
  std::vector<GrpoSample> data(2);
  data[0].prompt = {1, 2, 3};
  data[0].completion = {4, 5, 6, 7};
  data[1].prompt = {8, 9};
  data[1].completion = {10, 11, 12};
  MicroBatchOptions mb;
  mb.max_tokens = 7;  // two micro-batches
  double first = 0, last = 0;
  for (int s = 0; s < 40; ++s) {
    auto r = sft_train_step(ctx, m, w, opt, 1e-2, data, mb);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->n_micro, 2);
    if (s == 0) first = r->metrics.loss;
    last = r->metrics.loss;
  }
  EXPECT_GT(first, 1.0);
  EXPECT_LT(last, 0.2 * first);
}
