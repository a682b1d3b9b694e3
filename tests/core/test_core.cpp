// Core: dtype conversions (against bit patterns PyTorch produces), tensor views, thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "core/context.h"
#include "core/dtype.h"
#include "core/tensor.h"

using namespace grpo;

TEST(DType, Bf16RoundsToNearestEven) {
  // torch.tensor([1.0, 1.00390625, 1.01171875, -2.5, 3.14159265]).bfloat16().view(torch.int16)
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(f32_to_bf16(3.14159265f), 0x4049);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTrip) {
  // torch.tensor([1.0, 65504.0, 6.1035e-05, 5.96e-08, -0.333]).half().view(torch.int16)
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(6.1035e-05f), 0x0400);
  EXPECT_EQ(f32_to_f16(5.96e-08f), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.333f), 0xb554);
  for (uint32_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h);
}

TEST(Tensor, ViewsAndSlices) {
  Tensor t = tensor_from_f32(Device::cpu, DType::f32, {0, 1, 2, 3, 4, 5}, {3, 2});
  EXPECT_EQ(t.numel(), 6);
  Tensor s = t.slice0(1, 3);
  EXPECT_EQ(s.ptr<float>()[0], 2.f);
  Tensor r = t.index0(2);
  EXPECT_EQ(r.ndim, 1);
  EXPECT_EQ(r.ptr<float>()[1], 5.f);
  Tensor v = t.view({6});
  EXPECT_EQ(v.dim(-1), 6);
  Tensor b = tensor_empty(Device::cpu, DType::bf16, {6});
  tensor_copy_convert(b, v);
  auto back = tensor_to_f32(b);
  EXPECT_EQ(back[5], 5.f);
}

TEST(Context, ParallelForCoversRangeOnce) {
  ContextOptions o;
  o.n_threads = 3;
  Context ctx(o);
  std::vector<std::atomic<int>> hits(1000);
  ctx.parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}
