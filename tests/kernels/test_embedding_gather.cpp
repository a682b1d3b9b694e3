// The row gather on the CPU, as the embedding lookup (accumulating backward into the
// table's gradient) and as a row pick (backward overwrites); both are linear in their
// float input, so finite differences are exact up to rounding.
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/gather.h"

using namespace grpo;
using namespace grpo::test;

TEST(Embedding, ForwardAndBackward) {
  Context& ctx = test_ctx();
  const int64_t V = 11, C = 6, T = 9;
  auto table = randn(size_t(V * C), 1), r = randn(size_t(T * C), 2);
  std::vector<int32_t> ids = {3, 0, 10, 3, 3, 7, 0, 1, 10};  // repeats accumulate
  std::vector<float> out(size_t(T * C));
  Tensor to = host(out, {T, C}), ti = host(ids, {T});
  gather_rows_forward(ctx, to, host(table, {V, C}), ti);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[size_t(t * C + c)], table[size_t(ids[size_t(t)] * C + c)]);
  auto loss = [&] {
    std::vector<float> o(size_t(T * C));
    Tensor t2 = host(o, {T, C});
    gather_rows_forward(ctx, t2, host(table, {V, C}), ti);
    return dot(o, r);
  };
  std::vector<float> dt(size_t(V * C), 0.f);
  Tensor tdt = host(dt, {V, C});
  gather_rows_backward(ctx, tdt, host(r, {T, C}), ti, true);
  EXPECT_TRUE(grad_check("dtable", table, loss, dt));
  // accumulate adds to what is there: a second backward doubles the gradient
  std::vector<float> dt2 = dt;
  Tensor tdt2 = host(dt2, {V, C});
  gather_rows_backward(ctx, tdt2, host(r, {T, C}), ti, true);
  for (size_t i = 0; i < dt.size(); ++i) ASSERT_FLOAT_EQ(dt2[i], 2 * dt[i]) << i;
}

TEST(GatherRows, ForwardAndBackward) {
  Context& ctx = test_ctx();
  const int64_t T = 7, C = 5, R = 3;
  auto x = randn(size_t(T * C), 3), r = randn(size_t(R * C), 4);
  std::vector<int32_t> rows = {6, 2, 6};
  std::vector<float> out(size_t(R * C));
  Tensor to = host(out, {R, C}), tr = host(rows, {R});
  gather_rows_forward(ctx, to, host(x, {T, C}), tr);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[size_t(i * C + c)], x[size_t(rows[size_t(i)] * C + c)]);
  auto loss = [&] {
    std::vector<float> o(size_t(R * C));
    Tensor t2 = host(o, {R, C});
    gather_rows_forward(ctx, t2, host(x, {T, C}), tr);
    return dot(o, r);
  };
  std::vector<float> dx(size_t(T * C), 123.f);  // overwritten
  Tensor tdx = host(dx, {T, C});
  gather_rows_backward(ctx, tdx, host(r, {R, C}), tr, false);
  EXPECT_TRUE(grad_check("dx", x, loss, dx));
}

TEST(GatherIds, TableLookupOfEachIndex) {
  Context& ctx = test_ctx();
  std::vector<int32_t> table = {40, 7, 19, 3, 11}, idx = {4, 0, 0, 2, 3}, out(5, -1);
  Tensor to = host(out, {5});
  gather_ids(ctx, to, host(table, {5}), host(idx, {5}));
  EXPECT_EQ(out, (std::vector<int32_t>{11, 40, 40, 19, 3}));
  std::vector<float> wrong(5);
  Tensor tw = host(wrong, {5});
  EXPECT_DEATH(gather_ids(ctx, tw, host(table, {5}), host(idx, {5})), "must be i32");
}
