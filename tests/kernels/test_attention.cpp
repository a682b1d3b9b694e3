// Attention on the CPU: varlen forward against a double softmax reference,
// backward by finite differences, and the paged form against the varlen one
// on the same data (whole prompts, prompt chunks, decode steps); each also with a
// sliding window (keys p-W+1..p), the reference masking it independently.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/attention.h"

using namespace grpo;
using namespace grpo::test;

namespace {
struct Qkv {
  int64_t T, Hq, Hkv, D;
  std::vector<float> q, k, v;
};
Qkv make_qkv(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed) {
  return {T, Hq, Hkv, D, randn(size_t(T * Hq * D), seed), randn(size_t(T * Hkv * D), seed + 1),
          randn(size_t(T * Hkv * D), seed + 2)};
}
AttnVarlen varlen(std::vector<int32_t> cu, int window = 0) {
  AttnVarlen m;
  m.window = window;
  m.cu_seqlens = std::move(cu);
  for (size_t i = 0; i + 1 < m.cu_seqlens.size(); ++i)
    m.max_seqlen = std::max(m.max_seqlen, m.cu_seqlens[i + 1] - m.cu_seqlens[i]);
  return m;
}
// Causal softmax attention in double; lse is (Hq, T). window > 0: a key j of the
// query at t is kept when t - j < window (transformers' sliding-window mask).
void attention_ref(const Qkv& a, const std::vector<int32_t>& cu, std::vector<double>& out, std::vector<double>& lse,
                   int window = 0) {
  const int64_t G = a.Hq / a.Hkv;
  out.assign(size_t(a.T * a.Hq * a.D), 0.0);
  lse.assign(size_t(a.Hq * a.T), 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
      for (int64_t h = 0; h < a.Hq; ++h) {
        std::vector<double> sc;
        double m = -1e300;
        auto masked = [&](int64_t j) { return window > 0 && t - j >= window; };
        for (int64_t j = cu[s]; j <= t; ++j) {
          if (masked(j)) {
            sc.push_back(-INFINITY);
            continue;
          }
          double d = 0;
          for (int64_t e = 0; e < a.D; ++e)
            d += double(a.q[size_t((t * a.Hq + h) * a.D + e)]) * a.k[size_t((j * a.Hkv + h / G) * a.D + e)];
          sc.push_back(d / std::sqrt(double(a.D)));
          m = std::max(m, sc.back());
        }
        double l = 0;
        for (double& x : sc) l += std::exp(x - m);
        for (int64_t j = cu[s]; j <= t; ++j) {
          const double p = std::exp(sc[size_t(j - cu[s])] - m) / l;
          for (int64_t e = 0; e < a.D; ++e)
            out[size_t((t * a.Hq + h) * a.D + e)] += p * a.v[size_t((j * a.Hkv + h / G) * a.D + e)];
        }
        lse[size_t(h * a.T + t)] = m + std::log(l);
      }
}
}  // namespace

TEST(Attention, VarlenForwardMatchesReference) {
  Context& ctx = test_ctx();
  std::vector<int32_t> cu = {0, 5, 5, 13};  // includes an empty sequence
  Qkv a = make_qkv(13, 4, 2, 8, 1);
  for (int window : {0, 1, 3, 8}) {  // 8: the longest sequence fits, same as no window
    SCOPED_TRACE("window " + std::to_string(window));
    std::vector<float> out(a.q.size()), lse(size_t(a.Hq * a.T));
    Tensor to = host(out, {a.T, a.Hq, a.D}), tl = host(lse, {a.Hq, a.T});
    attention_forward(ctx, to, &tl, host(a.q, {a.T, a.Hq, a.D}), host(a.k, {a.T, a.Hkv, a.D}),
                      host(a.v, {a.T, a.Hkv, a.D}), varlen(cu, window));
    std::vector<double> ro, rl;
    attention_ref(a, cu, ro, rl, window);
    EXPECT_TRUE(all_close("out", out, ro, 1e-5, 1e-5));
    EXPECT_TRUE(all_close("lse", lse, rl, 1e-5, 1e-5));
  }
}

TEST(Attention, SlidingWindowChangesOutputsOnlyPastTheWindow) {
  Context& ctx = test_ctx();
  const std::vector<int32_t> cu = {0, 9};
  Qkv a = make_qkv(9, 2, 1, 8, 5);
  std::vector<float> full(a.q.size()), win(a.q.size());
  Tensor tf = host(full, {a.T, a.Hq, a.D}), tw = host(win, {a.T, a.Hq, a.D});
  const Tensor tq = host(a.q, {a.T, a.Hq, a.D}), tk = host(a.k, {a.T, a.Hkv, a.D}), tv = host(a.v, {a.T, a.Hkv, a.D});
  attention_forward(ctx, tf, nullptr, tq, tk, tv, varlen(cu));
  attention_forward(ctx, tw, nullptr, tq, tk, tv, varlen(cu, 4));
  // Positions 0..3 see all their keys through a window of 4; position 4 loses key 0.
  const size_t row = size_t(a.Hq * a.D);
  for (size_t i = 0; i < 4 * row; ++i) ASSERT_EQ(full[i], win[i]) << "index " << i;
  double diff = 0;
  for (size_t i = 4 * row; i < 5 * row; ++i) diff = std::max(diff, double(std::fabs(full[i] - win[i])));
  EXPECT_GT(diff, 1e-3);
}

class AttentionBackward : public ::testing::TestWithParam<int> {};

TEST_P(AttentionBackward, VarlenFiniteDifferences) {
  Context& ctx = test_ctx();
  std::vector<int32_t> cu = {0, 3, 7};
  Qkv a = make_qkv(7, 4, 2, 4, 11);
  auto r = randn(a.q.size(), 20);
  const AttnVarlen meta = varlen(cu, GetParam());
  auto loss = [&] {
    std::vector<float> out(a.q.size());
    Tensor to = host(out, {a.T, a.Hq, a.D});
    attention_forward(ctx, to, nullptr, host(a.q, {a.T, a.Hq, a.D}), host(a.k, {a.T, a.Hkv, a.D}),
                      host(a.v, {a.T, a.Hkv, a.D}), meta);
    return dot(out, r);
  };
  std::vector<float> out(a.q.size()), lse(size_t(a.Hq * a.T));
  Tensor to = host(out, {a.T, a.Hq, a.D}), tl = host(lse, {a.Hq, a.T});
  Tensor tq = host(a.q, {a.T, a.Hq, a.D}), tk = host(a.k, {a.T, a.Hkv, a.D}), tv = host(a.v, {a.T, a.Hkv, a.D});
  attention_forward(ctx, to, &tl, tq, tk, tv, meta);
  std::vector<float> dq(a.q.size(), 9.f), dk(a.k.size(), 9.f), dv(a.v.size(), 9.f);  // overwritten
  Tensor tdq = host(dq, {a.T, a.Hq, a.D}), tdk = host(dk, {a.T, a.Hkv, a.D}), tdv = host(dv, {a.T, a.Hkv, a.D});
  attention_backward(ctx, tdq, tdk, tdv, host(r, {a.T, a.Hq, a.D}), tq, tk, tv, to, tl, meta);
  EXPECT_TRUE(grad_check("dq", a.q, loss, dq));
  EXPECT_TRUE(grad_check("dk", a.k, loss, dk));
  EXPECT_TRUE(grad_check("dv", a.v, loss, dv));
}

// 0: full causal; 2: a window shorter than both sequences.
INSTANTIATE_TEST_SUITE_P(Window, AttentionBackward, ::testing::Values(0, 2));

namespace {
// A paged layout for sequences of the given lengths: blocks are handed out in a
// scrambled order so that logical and physical block ids differ.
struct Paged {
  int block_size, n_blocks, max_blocks;
  std::vector<int32_t> table;  // (S, max_blocks)
  int32_t slot(int s, int pos) const { return table[size_t(s * max_blocks + pos / block_size)] * block_size + pos % block_size; }
};
Paged make_paged(const std::vector<int>& lens, int bs) {
  Paged p{bs, 0, 0, {}};
  for (int L : lens) p.max_blocks = std::max(p.max_blocks, (L + bs - 1) / bs);
  p.n_blocks = int(lens.size()) * p.max_blocks + 1;
  p.table.assign(size_t(lens.size()) * p.max_blocks, 0);
  int next = 0;
  for (size_t i = 0; i < p.table.size(); ++i) p.table[i] = (next = (next + 5) % p.n_blocks);  // 5 ⊥ n_blocks
  return p;
}
}  // namespace

class AttentionPaged : public ::testing::TestWithParam<int> {};

TEST_P(AttentionPaged, EqualsVarlenForPrefillChunksAndDecode) {
  Context& ctx = test_ctx();
  const int window = GetParam();
  // Two sequences of 11 and 6 tokens, varlen-packed.
  const std::vector<int> lens = {11, 6};
  const std::vector<int32_t> cu = {0, 11, 17};
  Qkv a = make_qkv(17, 4, 2, 8, 31);
  std::vector<float> ref(a.q.size()), ref_lse(size_t(a.Hq * a.T));
  Tensor tref = host(ref, {a.T, a.Hq, a.D}), tref_lse = host(ref_lse, {a.Hq, a.T});
  attention_forward(ctx, tref, &tref_lse, host(a.q, {a.T, a.Hq, a.D}), host(a.k, {a.T, a.Hkv, a.D}),
                    host(a.v, {a.T, a.Hkv, a.D}), varlen(cu, window));
  std::vector<float> got_lse(ref_lse.size(), 0.f);

  const int bs = 4;
  Paged pg = make_paged(lens, bs);
  std::vector<float> kc(size_t(pg.n_blocks * bs * a.Hkv * a.D), 0.f), vc(kc.size(), 0.f);
  Tensor tkc = host(kc, {pg.n_blocks, bs, a.Hkv, a.D}), tvc = host(vc, {pg.n_blocks, bs, a.Hkv, a.D});
  std::vector<float> got(a.q.size(), 0.f);
  // Steps: (seq, first pos, count). Sequence 0 in chunks 4 + 5 + decode 1 + 1,
  // sequence 1 as one prompt of 6 batched together with sequence 0's first chunk.
  struct Piece { int s, p0, n; };
  const std::vector<std::vector<Piece>> steps = {{{0, 0, 4}, {1, 0, 6}}, {{0, 4, 5}}, {{0, 9, 1}}, {{0, 10, 1}}};
  for (const auto& step : steps) {
    std::vector<int32_t> seq, pos, slot;
    std::vector<float> q, k, v;
    std::vector<int64_t> rows;
    for (const Piece& pc : step)
      for (int i = 0; i < pc.n; ++i) {
        const int64_t t = cu[size_t(pc.s)] + pc.p0 + i;  // packed index in the reference
        rows.push_back(t);
        seq.push_back(pc.s);
        pos.push_back(pc.p0 + i);
        slot.push_back(pg.slot(pc.s, pc.p0 + i));
        q.insert(q.end(), a.q.begin() + t * a.Hq * a.D, a.q.begin() + (t + 1) * a.Hq * a.D);
        k.insert(k.end(), a.k.begin() + t * a.Hkv * a.D, a.k.begin() + (t + 1) * a.Hkv * a.D);
        v.insert(v.end(), a.v.begin() + t * a.Hkv * a.D, a.v.begin() + (t + 1) * a.Hkv * a.D);
      }
    const int64_t n = int64_t(rows.size());
    PagedAttnMeta m;
    m.token_seq = host(seq, {n});
    m.token_pos = host(pos, {n});
    m.slot_mapping = host(slot, {n});
    m.block_table = host(pg.table, {int64_t(lens.size()), pg.max_blocks});
    m.block_size = bs;
    m.window = window;
    for (int32_t p : pos) m.max_context = std::max(m.max_context, p + 1);
    kv_cache_write(ctx, tkc, tvc, host(k, {n, a.Hkv, a.D}), host(v, {n, a.Hkv, a.D}), m);
    std::vector<float> out(q.size()), lse(size_t(a.Hq * n));
    Tensor tout = host(out, {n, a.Hq, a.D}), tlse = host(lse, {a.Hq, n});
    attention_paged(ctx, tout, host(q, {n, a.Hq, a.D}), tkc, tvc, m, &tlse);
    for (int64_t i = 0; i < n; ++i) {
      std::copy(out.begin() + i * a.Hq * a.D, out.begin() + (i + 1) * a.Hq * a.D, got.begin() + rows[size_t(i)] * a.Hq * a.D);
      for (int64_t h = 0; h < a.Hq; ++h) got_lse[size_t(h * a.T + rows[size_t(i)])] = lse[size_t(h * n + i)];
    }
  }
  EXPECT_TRUE(all_close("paged vs varlen", got, ref, 1e-6, 1e-5));
  EXPECT_TRUE(all_close("paged vs varlen, log-sum-exp", got_lse, ref_lse, 1e-6, 1e-5));
  // the cache holds k at the mapped slot: sequence 1, position 5
  const int32_t s15 = pg.slot(1, 5);
  for (int64_t e = 0; e < a.Hkv * a.D; ++e)
    ASSERT_EQ(kc[size_t(s15 * a.Hkv * a.D + e)], a.k[size_t((11 + 5) * a.Hkv * a.D + e)]);
}

// 0: full causal; 3: inside one 4-token block; 5: spans a block boundary.
INSTANTIATE_TEST_SUITE_P(Window, AttentionPaged, ::testing::Values(0, 3, 5));
