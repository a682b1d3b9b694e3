// LoRA inside the inference forward, unmerged: a batch whose rows are grouped by
// adapter (two different adapters, prefill and decode) gives, row for row, the
// logits of the models with each adapter merged into the weights (f32, 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/lora.h"
#include "tf_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
LoraWeights random_adapter(const ModelConfig& c, const LoraConfig& lc, uint32_t seed) {
  LoraWeights lw = lora_allocate(c, lc, Device::cpu, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& [name, t] : lw.params()) {
    const float sd = 0.5f / std::sqrt(float(t->dim(-1)));
    for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = sd * nd(rng);
  }
  return lw;
}

void expect_rows_close(const std::vector<float>& got, int64_t got_row, const std::vector<float>& ref, int64_t ref_row,
                       int64_t V, const std::string& what) {
  double worst = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double a = got[size_t(got_row * V + v)], b = ref[size_t(ref_row * V + v)];
    worst = std::max(worst, std::fabs(a - b) / (1.0 + std::fabs(b)));
  }
  EXPECT_LT(worst, 1e-5) << what << ": max relative difference " << worst;
}
}  // namespace

TEST(LoraForward, RowGroupsEqualMergedModels) {
  Context& ctx = tf_ctx();
  for (Arch arch : {Arch::llama, Arch::qwen2, Arch::qwen3}) {
    const ModelConfig c = tiny_config(arch);
    const ModelWeights base = random_model(c, 3);
    LoraConfig la;
    la.r = 4;
    la.alpha = 8.f;
    LoraConfig lb = la;
    lb.r = 2;
    lb.use_rslora = true;
    lb.targets = {LoraTarget::v, LoraTarget::up, LoraTarget::down};
    const LoraWeights A = random_adapter(c, la, 1), B = random_adapter(c, lb, 2);

    ModelWeights wa = weights_allocate(c, Device::cpu, DType::f32), wb = weights_allocate(c, Device::cpu, DType::f32);
    tensor_copy(wa.arena, base.arena);
    tensor_copy(wb.arena, base.arena);
    lora_merge_into(wa, A);
    lora_merge_into(wb, B);

    const std::vector<int32_t> p0 = {1, 5, 9, 2, 7}, p1 = {3, 3, 8};
    const int64_t V = c.vocab_size;
    // Unmerged: sequence 0 with A, sequence 1 with B, in one batch; then one decode step each.
    PagedRunner run(ctx, base, 2, 16, 4, 16, 4);
    run.lora = {{&A, 0, 5}, {&B, 5, 8}};
    const auto pre = run.feed({{0, p0}, {1, p1}});
    run.lora = {{&A, 0, 1}, {&B, 1, 2}};
    const auto dec = run.feed({{0, {11}}, {1, {12}}});

    PagedRunner ra(ctx, wa, 1, 16, 4, 16), rb(ctx, wb, 1, 16, 4, 16);
    const auto ra_pre = ra.feed(0, p0), ra_dec = ra.feed(0, {11});
    const auto rb_pre = rb.feed(0, p1), rb_dec = rb.feed(0, {12});
    for (int64_t t = 0; t < 5; ++t) expect_rows_close(pre, t, ra_pre, t, V, "prefill row with adapter A");
    for (int64_t t = 0; t < 3; ++t) expect_rows_close(pre, 5 + t, rb_pre, t, V, "prefill row with adapter B");
    expect_rows_close(dec, 0, ra_dec, 0, V, "decode row with adapter A");
    expect_rows_close(dec, 1, rb_dec, 0, V, "decode row with adapter B");

    // The adapters matter: the base model's logits differ.
    PagedRunner rbase(ctx, base, 1, 16, 4, 16);
    const auto base_pre = rbase.feed(0, p0);
    double moved = 0;
    for (int64_t v = 0; v < V; ++v) moved = std::max(moved, double(std::fabs(base_pre[size_t(4 * V + v)] - pre[size_t(4 * V + v)])));
    EXPECT_GT(moved, 1e-3);
  }
}
