// Pure-math parts of the trainer: advantages, the GRPO loss and its gradient
// on hand-derived cases, micro-batch normalisation, LR schedules, SFT loss.
// Expected values are derived in the comments (Python's math module for the
// decimals), never produced by the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/advantages.h"
#include "train/grpo_loss.h"
#include "train/lr_schedule.h"

using namespace grpo;

namespace {
struct LossCase {
  std::vector<int32_t> off;
  std::vector<float> logp, adv, old, ref, roll, mask, w, ent;
  std::vector<uint8_t> trunc;
  GrpoLossInput in() const {
    GrpoLossInput i;
    i.seq_offsets = off;
    i.logp = logp;
    i.advantages = adv;
    i.old_logp = old;
    i.ref_logp = ref;
    i.rollout_logp = roll;
    i.mask = mask;
    i.weights = w;
    i.truncated = trunc;
    i.entropy = ent;
    return i;
  }
};
GrpoLossOutput run(const GrpoLossConfig& c, const LossCase& lc, GrpoLossNorm n = {}) {
  Status st = grpo_loss_check(c, lc.in());
  EXPECT_TRUE(st.ok()) << st.message();
  return grpo_loss(c, lc.in(), n);
}
}  // namespace

TEST(Advantages, GroupBatchNone) {
  // rewards: group 0 = [1, 0, 0.5] (mean 0.5, deviations ±0.5, 0; unbiased std
  // sqrt(0.5/2) = 0.5), group 1 = [0.2]*3 (std 0: advantages 0).
  // group: ±0.5 / 0.5001 = ±0.99980004; batch: std over all six = sqrt(0.635/5)
  // = 0.3563705936 -> ±0.5 / 0.3564705936 = ±1.4026402428.
  std::vector<float> r = {1.f, 0.f, 0.5f, 0.2f, 0.2f, 0.2f};
  AdvantageStats st;
  auto g = compute_advantages(r, 3, ScaleRewards::group, &st);
  ASSERT_TRUE(g.ok());
  const float eg[] = {0.99980004f, -0.99980004f, 0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*g)[size_t(i)], eg[i], 1e-6) << i;
  EXPECT_NEAR(st.frac_zero_std, 0.5, 1e-12);
  EXPECT_NEAR(st.reward_mean, 0.35, 1e-7);
  EXPECT_NEAR(st.reward_std, 0.3563705936, 1e-7);
  auto b = compute_advantages(r, 3, ScaleRewards::batch);
  ASSERT_TRUE(b.ok());
  const float eb[] = {1.40264024f, -1.40264024f, 0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*b)[size_t(i)], eb[i], 2e-6) << i;
  auto n = compute_advantages(r, 3, ScaleRewards::none);
  ASSERT_TRUE(n.ok());
  const float en[] = {0.5f, -0.5f, 0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*n)[size_t(i)], en[i], 1e-7) << i;
}

TEST(Advantages, Errors) {
  EXPECT_FALSE(compute_advantages({1.f, 2.f, 3.f}, 2, ScaleRewards::group).ok());
  EXPECT_FALSE(compute_advantages({1.f, NAN}, 2, ScaleRewards::group).ok());
  EXPECT_FALSE(compute_advantages({}, 2, ScaleRewards::group).ok());
  EXPECT_FALSE(scale_rewards_from_string("groups").ok());
  EXPECT_TRUE(scale_rewards_from_string("batch").ok());
}

// seq0: logp [-1, -2], old [-1.1, -1.5], A = +1; seq1: logp [-0.5], old = logp, A = -0.5.
//  t0: ρ = e^0.1 = 1.1051709181 (inside [0.8, 1.28]) -> pg = -1.1051709181, dpg = -A·ρ = -1.1051709181
//  t1: ρ = e^-0.5 = 0.6065306597 < 0.8 but A > 0: unclipped branch is the min -> pg = -0.6065306597,
//      dpg = -0.6065306597 (no clip counted: low clipping needs A < 0)
//  t2: ρ = 1, A = -0.5 -> pg = 0.5, dpg = 0.5
static LossCase hand_case() {
  LossCase c;
  c.off = {0, 2, 3};
  c.logp = {-1.f, -2.f, -0.5f};
  c.old = {-1.1f, -1.5f, -0.5f};
  c.adv = {1.f, -0.5f};
  return c;
}

TEST(GrpoLoss, HandGrpoBnpoDrGrpoDapo) {
  LossCase lc = hand_case();
  GrpoLossConfig c;
  c.epsilon = 0.2f;
  c.epsilon_high = 0.28f;
  // grpo: seq means (-1.1051709181 - 0.6065306597)/2 = -0.8558507889 and 0.5; mean = -0.1779253945.
  // dlogp = dpg / n_tokens(seq) / S: -0.2762927295, -0.1516326649, 0.25
  c.loss_type = LossType::grpo;
  auto o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.1779253945, 1e-6);
  EXPECT_NEAR(o.dlogp[0], -0.2762927295, 1e-6);
  EXPECT_NEAR(o.dlogp[1], -0.1516326649, 1e-6);
  EXPECT_NEAR(o.dlogp[2], 0.25, 1e-6);
  EXPECT_EQ(o.metrics.clip_region, 0);
  // bnpo: sum -1.2117015778 / 3 = -0.4039005259; dlogp = dpg / 3
  c.loss_type = LossType::bnpo;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.4039005259, 1e-6);
  EXPECT_NEAR(o.dlogp[0], -1.1051709181 / 3, 1e-6);
  EXPECT_NEAR(o.dlogp[2], 0.5 / 3, 1e-6);
  // dr_grpo with L = 4: sum / (2·4) = -0.1514626972
  c.loss_type = LossType::dr_grpo;
  c.max_completion_length = 4;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.1514626972, 1e-6);
  EXPECT_NEAR(o.dlogp[1], -0.6065306597 / 8, 1e-6);
  // dapo with a global count of 6 tokens: sum / 6 = -0.2019502630
  c.loss_type = LossType::dapo;
  GrpoLossNorm n;
  n.dapo_num_items = 6;
  o = run(c, lc, n);
  EXPECT_NEAR(o.loss, -0.2019502630, 1e-6);
  EXPECT_NEAR(o.dlogp[0], -1.1051709181 / 6, 1e-6);
}

TEST(GrpoLoss, ClippingAndMetrics) {
  // t0: ρ = e^0.3 = 1.3498588076 > 1.28, A = +1: clipped high, pg = -1.28, no gradient.
  // t1: ρ = e^-0.3 = 0.7408182207 < 0.8, A = -1 (seq1): clipped low, pg = -min(-0.7408, -0.8) = 0.8, no gradient.
  // t2: ρ = e^0.3, A = -1: unclipped branch is the min: pg = 1.3498588076, dpg = -A·ρ = 1.3498588076.
  LossCase lc;
  lc.off = {0, 1, 3};
  lc.logp = {-1.f, -1.3f, -0.7f};
  lc.old = {-1.3f, -1.f, -1.f};
  lc.adv = {1.f, -1.f};
  lc.ent = {2.f, 1.f, 3.f};
  GrpoLossConfig c;
  c.loss_type = LossType::bnpo;
  c.epsilon_high = 0.28f;
  auto o = run(c, lc);
  // (-1.28 + 0.8 + 1.3498588076) / 3 = 0.2899529359
  EXPECT_NEAR(o.loss, 0.2899529359, 1e-6);
  EXPECT_EQ(o.dlogp[0], 0.f);
  EXPECT_EQ(o.dlogp[1], 0.f);
  EXPECT_NEAR(o.dlogp[2], 1.3498588076 / 3, 1e-6);
  EXPECT_NEAR(o.metrics.clip_low_frac(), 1.0 / 3, 1e-12);
  EXPECT_NEAR(o.metrics.clip_high_frac(), 1.0 / 3, 1e-12);
  EXPECT_NEAR(o.metrics.clip_region_frac(), 2.0 / 3, 1e-12);
  EXPECT_NEAR(o.metrics.entropy_mean(), 2.0, 1e-12);
}

TEST(GrpoLoss, KlTerm) {
  // A = 0 and on-policy: only β·k3. d = ref - logp = -0.2: kl = e^-0.2 + 0.2 - 1 = 0.0187307531,
  // loss (bnpo, β = 0.1) = 0.0018730753, dlogp = β(1 - e^-0.2) = 0.0181269247.
  LossCase lc;
  lc.off = {0, 1};
  lc.logp = {-1.f};
  lc.ref = {-1.2f};
  lc.adv = {0.f};
  GrpoLossConfig c;
  c.loss_type = LossType::bnpo;
  c.beta = 0.1f;
  auto o = run(c, lc);
  EXPECT_NEAR(o.loss, 0.0018730753, 1e-8);
  EXPECT_NEAR(o.dlogp[0], 0.0181269247, 1e-7);
  EXPECT_NEAR(o.metrics.kl_mean(), 0.0187307531, 1e-7);
  c.beta = 0.f;
  lc.ref.clear();
  EXPECT_TRUE(grpo_loss_check(c, lc.in()).ok());
  c.beta = 0.1f;
  EXPECT_FALSE(grpo_loss_check(c, lc.in()).ok());  // β > 0 needs reference logprobs
}

TEST(GrpoLoss, ImportanceSampling) {
  // One token, on-policy (ρ = 1), A = 1, rollout logp 0.5 below: r = e^0.5 = 1.6487212707.
  LossCase lc;
  lc.off = {0, 1};
  lc.logp = {-1.f};
  lc.roll = {-1.5f};
  lc.adv = {1.f};
  GrpoLossConfig c;
  c.loss_type = LossType::bnpo;
  c.is_cap = 1.5f;
  c.is_mode = IsMode::token_truncate;  // min(r, 1.5) = 1.5: loss -1.5, dlogp -1.5
  auto o = run(c, lc);
  EXPECT_NEAR(o.loss, -1.5, 1e-6);
  EXPECT_NEAR(o.dlogp[0], -1.5, 1e-6);
  EXPECT_EQ(o.metrics.is_capped, 1);
  c.is_mode = IsMode::token_mask;  // r > cap: dropped
  o = run(c, lc);
  EXPECT_EQ(o.loss, 0.0);
  EXPECT_EQ(o.dlogp[0], 0.f);
  c.is_cap = 2.f;  // under the cap: weight r itself
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -1.6487212707, 1e-6);
  // Sequence level: two tokens with old - rollout = 0.2 and 0.3 (old = logp, mu = 1).
  // product: e^0.5 = 1.6487 -> truncated to 1.5; geometric mean e^0.25 = 1.2840254167.
  // Each token pg = -1 (ρ = 1, A = 1); bnpo: loss = -w.
  lc.off = {0, 2};
  lc.logp = {-1.f, -2.f};
  lc.roll = {-1.2f, -2.3f};
  c.is_mode = IsMode::sequence_truncate;
  c.is_cap = 1.5f;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -1.5, 1e-6);
  c.is_sequence_geomean = true;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -1.2840254167, 1e-6);
  EXPECT_NEAR(o.dlogp[1], -1.2840254167 / 2, 1e-6);
  c.is_sequence_geomean = false;
  c.is_mode = IsMode::sequence_mask;
  o = run(c, lc);
  EXPECT_EQ(o.loss, 0.0);
  // Rollout metrics (current logp vs rollout): |Δ| = 0.2, 0.3; k3 = e^Δ - Δ - 1:
  // e^0.2 - 1.2 = 0.0214027582, e^0.3 - 1.3 = 0.0498588076 -> mean 0.0356307829.
  EXPECT_NEAR(o.metrics.roll_abs_max, 0.3, 1e-6);
  EXPECT_NEAR(o.metrics.rollout_abs_diff_mean(), 0.25, 1e-6);
  EXPECT_NEAR(o.metrics.rollout_kl(), 0.0356307829, 1e-6);
}

TEST(GrpoLoss, WeightsAndTruncation) {
  LossCase lc = hand_case();
  GrpoLossConfig c;
  c.loss_type = LossType::grpo;
  c.epsilon_high = 0.28f;
  // weights [0.5, 1, 2]; a token of weight w counts w times in its sequence's mean:
  // seq0 (0.5·-1.1051709181 - 0.6065306597)/(0.5 + 1) = -0.7727441261, seq1 2·0.5/2 = 0.5;
  // mean = -0.1363720396.
  lc.w = {0.5f, 1.f, 2.f};
  auto o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.1363720396, 1e-6);
  EXPECT_NEAR(o.dlogp[0], 0.5 * -1.1051709181 / 1.5 / 2, 1e-6);
  EXPECT_NEAR(o.dlogp[2], 2 * 0.5 / 2 / 2, 1e-6);
  // Truncated seq0 with mask_truncated_completions: it counts as a sequence with no tokens.
  lc.w.clear();
  lc.trunc = {1, 0};
  c.mask_truncated_completions = true;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, 0.25, 1e-7);  // (0 + 0.5) / 2
  EXPECT_EQ(o.dlogp[0], 0.f);
  EXPECT_EQ(o.metrics.n_tokens, 1);
}

// Per-token loss weights w_t in every normalisation: the numerator takes w_t·term_t and the
// token counts become Σ m_t·w_t (hand_case's pg terms, weights [0.5, 1, 2]; decimals from
// Python's math module).
TEST(GrpoLoss, WeightedTokenMeans) {
  LossCase lc = hand_case();
  lc.w = {0.5f, 1.f, 2.f};
  GrpoLossConfig c;
  c.epsilon_high = 0.28f;
  // numerator Σ w·pg = 0.5·-1.1051709181 - 0.6065306597 + 2·0.5 = -0.1591161188; Σ w = 3.5.
  c.loss_type = LossType::bnpo;
  auto o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.0454617482, 1e-6);
  EXPECT_NEAR(o.dlogp[0], -0.1578815597, 1e-6);
  EXPECT_NEAR(o.dlogp[2], 0.2857142857, 1e-6);
  EXPECT_EQ(o.metrics.n_tokens, 3);  // metrics stay unweighted token counts
  // dapo without a global count: the same weighted mean over this micro-batch.
  c.loss_type = LossType::dapo;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.0454617482, 1e-6);
  // dr_grpo divides by a constant (S·L = 8): weights enter only the numerator.
  c.loss_type = LossType::dr_grpo;
  c.max_completion_length = 4;
  o = run(c, lc);
  EXPECT_NEAR(o.loss, -0.1591161188 / 8, 1e-6);
  EXPECT_NEAR(o.dlogp[1], -0.0758163325, 1e-6);
  // With a mask [1, 0, 1] the masked token's weight leaves the count: (0.5·p0 + 2·p2) / 2.5.
  c.loss_type = LossType::bnpo;
  lc.mask = {1.f, 0.f, 1.f};
  o = run(c, lc);
  EXPECT_NEAR(o.loss, 0.1789658164, 1e-6);
  EXPECT_EQ(o.dlogp[1], 0.f);
  // All-ones weights are the unweighted loss.
  lc.mask.clear();
  lc.w = {1.f, 1.f, 1.f};
  EXPECT_NEAR(run(c, lc).loss, -0.4039005259, 1e-6);
}

TEST(GrpoLoss, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.3f, 1.f);
  LossCase lc;
  lc.off = {0, 5, 7, 12};
  for (int t = 0; t < 12; ++t) {
    lc.logp.push_back(-1.f + 0.3f * nd(rng));
    lc.old.push_back(lc.logp.back() + 0.1f * nd(rng));
    lc.ref.push_back(lc.logp.back() + 0.1f * nd(rng));
    lc.roll.push_back(lc.logp.back() + 0.1f * nd(rng));
    lc.w.push_back(ud(rng));
  }
  lc.adv = {0.7f, -1.1f, 0.4f};
  for (LossType lt : {LossType::grpo, LossType::bnpo, LossType::dr_grpo, LossType::dapo})
    for (IsMode im : {IsMode::none, IsMode::token_truncate, IsMode::sequence_mask}) {
      GrpoLossConfig c;
      c.loss_type = lt;
      c.beta = 0.04f;
      c.epsilon_high = 0.28f;
      c.is_mode = im;
      c.is_cap = 1.1f;
      c.max_completion_length = 6;
      auto o = run(c, lc);
      for (size_t t = 0; t < lc.logp.size(); ++t) {
        LossCase p = lc, m = lc;
        const float h = 1e-3f;
        p.logp[t] += h;
        m.logp[t] -= h;
        const double fd = (run(c, p).loss - run(c, m).loss) / double(p.logp[t] - m.logp[t]);
        EXPECT_NEAR(o.dlogp[t], fd, 2e-4 + 2e-3 * std::fabs(fd)) << loss_type_name(lt) << " " << is_mode_name(im) << " t=" << t;
      }
    }
}

// Splitting a batch into micro-batches: the micro-batch losses add up to the
// big batch's loss and the gradients are the same, for grpo (S_tot), dr_grpo, dapo.
TEST(GrpoLoss, MicroBatchesEqualOneBatch) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  LossCase all;
  all.off = {0, 3, 7, 9, 14};
  for (int t = 0; t < 14; ++t) {
    all.logp.push_back(-1.f + 0.3f * nd(rng));
    all.old.push_back(all.logp.back() + 0.2f * nd(rng));
    all.ref.push_back(all.logp.back() + 0.1f * nd(rng));
  }
  all.adv = {0.5f, -1.f, 1.2f, -0.3f};
  auto sub = [&](int s0, int s1) {
    LossCase c;
    const int b = all.off[size_t(s0)], e = all.off[size_t(s1)];
    for (int s = s0; s <= s1; ++s) c.off.push_back(all.off[size_t(s)] - b);
    c.logp.assign(all.logp.begin() + b, all.logp.begin() + e);
    c.old.assign(all.old.begin() + b, all.old.begin() + e);
    c.ref.assign(all.ref.begin() + b, all.ref.begin() + e);
    c.adv.assign(all.adv.begin() + s0, all.adv.begin() + s1);
    return c;
  };
  for (LossType lt : {LossType::grpo, LossType::dr_grpo, LossType::dapo})
    for (int split : {1, 2, 3}) {  // unequal (1+3, 3+1) and equal (2+2) micro-batches
      GrpoLossConfig c;
      c.loss_type = lt;
      c.beta = 0.04f;
      c.max_completion_length = 5;
      GrpoLossNorm big;
      big.dapo_num_items = 14;
      auto ref = run(c, all, big);
      GrpoLossNorm n;
      n.n_micro = 2;
      n.n_seqs_total = 4;
      n.dapo_num_items = 14;
      auto a = run(c, sub(0, split), n), b = run(c, sub(split, 4), n);
      EXPECT_NEAR(a.loss + b.loss, ref.loss, 1e-6) << loss_type_name(lt) << " split " << split;
      std::vector<float> g = a.dlogp;
      g.insert(g.end(), b.dlogp.begin(), b.dlogp.end());
      for (size_t t = 0; t < g.size(); ++t) EXPECT_NEAR(g[t], ref.dlogp[t], 1e-7) << loss_type_name(lt) << t;
      GrpoMetrics mm = a.metrics;
      mm.merge(b.metrics);
      EXPECT_NEAR(mm.kl_mean(), ref.metrics.kl_mean(), 1e-9);
    }
}

TEST(LrSchedule, MatchesTransformersFormulas) {
  LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 2;
  s.total_steps = 10;
  // linear: warmup 0, 1/2; then (10 - k) / 8: k=2 -> 1, k=6 -> 0.5, k=10 -> 0.
  s.type = LrScheduleType::linear;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 2), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 6), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 12), 0.0);
  // cosine: p = (k - 2)/8; 0.5(1 + cos(πp)): k=4 -> 0.8535533906, k=6 -> 0.5, k=10 -> 0.
  s.type = LrScheduleType::cosine;
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 2), 1.0);
  EXPECT_NEAR(lr_at(s, 4), 0.8535533905932737, 1e-15);
  EXPECT_NEAR(lr_at(s, 6), 0.5, 1e-15);
  EXPECT_NEAR(lr_at(s, 10), 0.0, 1e-15);
  // constant with warmup 3: 0, 1/3, 2/3, 1, 1.
  s.type = LrScheduleType::constant;
  s.warmup_steps = 3;
  s.lr = 2e-6;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.0);
  EXPECT_NEAR(lr_at(s, 1), 2e-6 / 3, 1e-20);
  EXPECT_DOUBLE_EQ(lr_at(s, 3), 2e-6);
  EXPECT_DOUBLE_EQ(lr_at(s, 100), 2e-6);
  EXPECT_EQ(warmup_steps_from_ratio(0.1, 95), 10);  // ceil(9.5)
  EXPECT_FALSE(lr_schedule_from_string("cosine_with_restarts").ok());
}

TEST(SftLoss, MeanOverMaskedTokens) {
  // logp [-1, -2, -3] with mask [1, 0, 1] over a step of 4 masked tokens: loss = (1 + 3)/4 = 1,
  // dlogp = -mask / 4.
  std::vector<float> lp = {-1.f, -2.f, -3.f}, mask = {1.f, 0.f, 1.f}, d;
  EXPECT_NEAR(sft_loss(lp, mask, 4.0, d), 1.0, 1e-12);
  EXPECT_EQ(d[0], -0.25f);
  EXPECT_EQ(d[1], 0.f);
  EXPECT_EQ(d[2], -0.25f);
}
