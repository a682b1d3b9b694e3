// The loop's trainer step (train/loop_train.h) on a generation batch whose
// rollout logprobs disagree with the trainer's: the importance-sampling
// correction compares the trainer's generation-time logprobs with the
// sampler's (ratio ≠ 1), and with num_iterations > 1 the clipped ratio of a
// later pass is taken against those generation-time trainer logprobs, not the
// sampler's. Expected losses and gradients come from the formulas written out
// here (dapo, token-level ratio) and the model backward of their dlogp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/loop_train.h"
#include "train/train_step.h"
#include "train_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {

double metric(const MetricList& m, const std::string& k) {
  for (auto& [n, v] : m)
    if (n == k) return v;
  ADD_FAILURE() << "metric " << k << " missing";
  return NAN;
}

RolloutBatch make_batch(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  RolloutBatch b;
  b.group_size = 2;
  const int lens[][2] = {{3, 4}, {3, 3}, {2, 5}, {2, 2}};
  const float adv[] = {0.8f, -0.8f, 1.1f, -1.1f};
  for (int i = 0; i < 4; ++i) {
    Completion cpl;
    for (int t = 0; t < lens[i][0]; ++t) cpl.out.prompt_ids.push_back(tok(rng));
    for (int t = 0; t < lens[i][1]; ++t) cpl.out.completion_ids.push_back(tok(rng));
    b.completions.push_back(cpl);
    b.advantages.push_back(adv[i]);
  }
  return b;
}

std::vector<GrpoSample> samples_of(const RolloutBatch& b) {
  std::vector<GrpoSample> s(b.completions.size());
  for (size_t i = 0; i < s.size(); ++i) {
    s[i].prompt = b.completions[i].out.prompt_ids;
    s[i].completion = b.completions[i].out.completion_ids;
  }
  return s;
}

// The IS weights of every token (dapo batch, no masking), as TRL's generation step computes them.
std::vector<double> is_weights(IsMode mode, double cap, const std::vector<std::vector<float>>& gen,
                               const std::vector<std::vector<float>>& roll, double* mean_ratio) {
  std::vector<double> w;
  double sum = 0;
  int n = 0;
  const bool seq = mode == IsMode::sequence_truncate || mode == IsMode::sequence_mask;
  const bool trunc = mode == IsMode::token_truncate || mode == IsMode::sequence_truncate;
  for (size_t s = 0; s < gen.size(); ++s) {
    double seq_diff = 0;
    for (size_t t = 0; t < gen[s].size(); ++t) seq_diff += double(gen[s][t]) - roll[s][t];
    if (seq) {
      sum += std::exp(seq_diff);
      ++n;
    }
    for (size_t t = 0; t < gen[s].size(); ++t) {
      const double r = seq ? std::exp(seq_diff) : std::exp(double(gen[s][t]) - roll[s][t]);
      if (!seq) {
        sum += r;
        ++n;
      }
      w.push_back(trunc ? std::min(r, cap) : (r > cap ? 0.0 : r));
    }
  }
  *mean_ratio = sum / n;
  return w;
}

}  // namespace

TEST(PolicyTrainStep, ImportanceSamplingAgainstTrainerLogprobsInEveryMode) {
  for (IsMode mode : {IsMode::token_truncate, IsMode::token_mask, IsMode::sequence_truncate, IsMode::sequence_mask}) {
    SCOPED_TRACE(is_mode_name(mode));
    Context ctx;
    ModelConfig c = tiny_config(false, false, false);
    ModelWeights w = random_weights(c, 31);
    PolicyTrainer tr;
    tr.ctx = &ctx;
    tr.w = &w;
    AdamWConfig ac;
    ac.max_grad_norm = 0.f;  // the gradient arena then holds the loss gradient itself
    tr.opt = optimizer_create(ctx, w, ac);
    tr.loss.loss_type = LossType::dapo;
    tr.loss.epsilon = 0.02f;
    tr.loss.epsilon_high = 0.02f;
    tr.loss.is_mode = mode;
    tr.loss.is_cap = mode == IsMode::sequence_truncate || mode == IsMode::sequence_mask ? 1.6f : 1.25f;
    tr.sched.type = LrScheduleType::constant;
    tr.sched.lr = 1e-4;
    tr.sched.total_steps = 10;

    RolloutBatch batch = make_batch(c, 5);
    const std::vector<GrpoSample> plain = samples_of(batch);
    // The trainer's logprobs under the generating weights, and a sampler that disagrees with them.
    auto gen_r = compute_logprobs(ctx, tr.model, w, plain, MicroBatchOptions{});
    ASSERT_TRUE(gen_r.ok()) << gen_r.status().message();
    const std::vector<std::vector<float>> gen = gen_r.value();
    std::vector<std::vector<float>> roll = gen;
    int k = 0;
    for (size_t s = 0; s < roll.size(); ++s) {
      for (float& x : roll[s]) x -= 0.35f * float(k++ % 3) - 0.2f;  // shifts -0.2 ... +0.5 around the trainer's
      batch.completions[s].out.logprobs = roll[s];
    }
    double n_tok = 0;
    for (auto& g : gen) n_tok += double(g.size());

    double want_ratio = 0;
    const std::vector<double> isw = is_weights(mode, tr.loss.is_cap, gen, roll, &want_ratio);
    // Iteration 1 of num_iterations = 2: the weights are those that generated the batch, so ρ = 1
    // and the loss is Σ_t is_t·(−A_s) / N.
    double want1 = 0;
    size_t ti = 0;
    for (size_t s = 0; s < gen.size(); ++s)
      for (size_t t = 0; t < gen[s].size(); ++t) want1 += isw[ti++] * -batch.advantages[s] / n_tok;
    auto m1 = policy_train_step(tr, batch, 0, 4, true);
    ASSERT_TRUE(m1.ok()) << m1.status().message();
    ASSERT_EQ(batch.old_logp.size(), gen.size());
    for (size_t s = 0; s < gen.size(); ++s)
      for (size_t t = 0; t < gen[s].size(); ++t) EXPECT_NEAR(batch.old_logp[s][t], gen[s][t], 1e-6);
    EXPECT_GT(std::fabs(want_ratio - 1.0), 0.05);
    EXPECT_NEAR(metric(m1.value(), "is_ratio/mean"), want_ratio, 1e-5 * want_ratio);
    EXPECT_GT(metric(m1.value(), "is_ratio/capped_frac"), 0.0);
    EXPECT_NEAR(metric(m1.value(), "loss"), want1, 1e-5);

    // Iteration 2: the weights moved. Expected loss and gradient with ρ = exp(cur − gen), from
    // the current logprobs and the model backward of the dlogp written out here.
    std::vector<std::vector<int32_t>> seqs;
    std::vector<int32_t> pl;
    for (auto& s : plain) {
      std::vector<int32_t> q = s.prompt;
      q.insert(q.end(), s.completion.begin(), s.completion.end());
      seqs.push_back(q);
      pl.push_back(int32_t(s.prompt.size()));
    }
    auto tb = train_batch_build(ctx, seqs, pl, c.vocab_size);
    ASSERT_TRUE(tb.ok());
    TrainModel m;
    Tensor lp = tensor_empty(Device::cpu, DType::f32, {tb->n_completion});
    train_model_forward(ctx, m, w, *tb, lp, nullptr, true);
    const std::vector<float> cur = tensor_to_f32(lp);
    const double lo = 1.0 - tr.loss.epsilon, hi = 1.0 + double(tr.loss.epsilon_high);
    double want2 = 0, want2_if_old_were_rollout = 0, n_clipped = 0;
    std::vector<float> dlogp(cur.size());
    ti = 0;
    for (size_t s = 0; s < gen.size(); ++s) {
      const double A = batch.advantages[s];
      for (size_t t = 0; t < gen[s].size(); ++t, ++ti) {
        const double rho = std::exp(double(cur[ti]) - gen[s][t]);
        const bool clipped = (rho > hi && A > 0) || (rho < lo && A < 0);
        n_clipped += clipped;
        want2 += isw[ti] * -std::min(rho * A, std::clamp(rho, lo, hi) * A) / n_tok;
        dlogp[ti] = float(clipped ? 0.0 : isw[ti] * -A * rho / n_tok);
        const double rho_roll = std::exp(double(cur[ti]) - roll[s][t]);
        want2_if_old_were_rollout += -std::min(rho_roll * A, std::clamp(rho_roll, lo, hi) * A) / n_tok;
      }
    }
    ModelWeights g_want = zero_grads(c);
    Tensor d = tensor_from_f32(Device::cpu, DType::f32, dlogp, {int64_t(dlogp.size())});
    train_model_backward(ctx, m, w, *tb, d, g_want);

    auto m2 = policy_train_step(tr, batch, 0, 4, true);
    ASSERT_TRUE(m2.ok()) << m2.status().message();
    EXPECT_GT(n_clipped, 0) << "the first step should move some ratios out of [1-ε, 1+ε]";
    EXPECT_LT(n_clipped, n_tok) << "every ratio clipped: no gradient to compare";
    EXPECT_NEAR(metric(m2.value(), "clip_ratio"), n_clipped / n_tok, 1e-9);
    EXPECT_NEAR(metric(m2.value(), "loss"), want2, 1e-5 * (1 + std::fabs(want2)));
    EXPECT_GT(std::fabs(want2 - want2_if_old_were_rollout), 1e-3) << "the case cannot tell the two old logprobs apart";
    const std::vector<float> got = tensor_to_f32(tr.opt.grad_arena), want = tensor_to_f32(g_want.arena);
    double gmax = 0;
    for (float x : want) gmax = std::max(gmax, double(std::fabs(x)));
    ASSERT_GT(gmax, 0.0);
    expect_close(got.data(), want.data(), int64_t(want.size()), 1e-5 * gmax, 1e-4, "iteration-2 gradient");
  }
}

TEST(PolicyTrainStep, OnPolicyStepComputesNoOldLogprobs) {
  // num_iterations = 1 and one step per generation: the ratio's old logprobs are the detached
  // current ones (TRL skips the extra pass); the IS correction still sees the sampler mismatch.
  Context ctx;
  ModelConfig c = tiny_config(false, false, false);
  ModelWeights w = random_weights(c, 32);
  PolicyTrainer tr;
  tr.ctx = &ctx;
  tr.w = &w;
  tr.opt = optimizer_create(ctx, w, AdamWConfig{});
  tr.loss.is_mode = IsMode::token_truncate;
  tr.loss.is_cap = 3.f;
  tr.sched.lr = 1e-3;
  RolloutBatch batch = make_batch(c, 6);
  auto gen = compute_logprobs(ctx, tr.model, w, samples_of(batch), MicroBatchOptions{});
  ASSERT_TRUE(gen.ok());
  double sum = 0, n = 0;
  for (size_t s = 0; s < batch.completions.size(); ++s) {
    std::vector<float> r = gen.value()[s];
    for (float& x : r) {
      x -= 0.3f;
      sum += std::exp(0.3);
      n += 1;
    }
    batch.completions[s].out.logprobs = r;
  }
  auto m = policy_train_step(tr, batch, 0, 4, false);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(batch.old_logp.empty());
  EXPECT_NEAR(metric(m.value(), "is_ratio/mean"), sum / n, 1e-5);
  EXPECT_EQ(metric(m.value(), "clip_ratio"), 0.0);
}
