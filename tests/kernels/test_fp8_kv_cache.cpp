// FP8 E4M3 KV cache on the CPU (kv_cache_dtype = fp8): model tensors stay f32,
// cache writes store each element as f32_to_f8e4m3 of the f32 value, and paged
// attention reads the cached codes as their exact values.
// - Paged attention against PyTorch (tests/fixtures/fp8/fp8_reference.json, made by
//   tools/ref/make_fp8_fixtures.py): causal attention over E4M3-quantised K/V in
//   float64. The inputs are exact in f32 (q = int/16, K/V codes), so the only
//   difference is f32 arithmetic.
// - The fused rope cache writes into an fp8 cache equal rope + kv_cache_write.
// - The dispatchers reject caches that are neither the activations' dtype nor f8e4m3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

using namespace grpo;
using namespace grpo::test;

namespace {

const char* kScript = "python3 tools/ref/make_fp8_fixtures.py --out tests/fixtures/fp8";

const nlohmann::json& fixture() {
  static const nlohmann::json j = [] {
    std::ifstream f(std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/fp8/fp8_reference.json");
    if (!f) return nlohmann::json();
    nlohmann::json d = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (d.is_discarded() || d.value("format", "") != "grpo-fp8-fixture" || !d.contains("attention"))
      return nlohmann::json();
    return d;
  }();
  return j;
}

std::vector<float> sixteenths(const nlohmann::json& ints) {
  std::vector<float> v;
  v.reserve(ints.size());
  for (const auto& i : ints) v.push_back(float(i.get<int>()) / 16.f);  // exact in f32
  return v;
}

// A pool of block_size-token blocks shared by S sequences; each sequence owns
// blocks drawn from a seeded shuffle of the pool, so logical and physical block
// ids differ and a sequence's blocks are not contiguous.
struct Pool {
  int bs = 16, n_blocks = 0, max_blocks = 0;
  std::vector<int32_t> table;  // (S, max_blocks)
  int32_t slot(size_t s, int pos) const {
    return table[s * size_t(max_blocks) + size_t(pos / bs)] * bs + pos % bs;
  }
};
Pool make_pool(const std::vector<int>& lens, int bs, uint32_t seed) {
  Pool p;
  p.bs = bs;
  for (int L : lens) p.max_blocks = std::max(p.max_blocks, (L + bs - 1) / bs);
  p.n_blocks = int(lens.size()) * p.max_blocks + 3;  // spare blocks stay untouched
  std::vector<int32_t> ids(size_t(p.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  p.table.assign(ids.begin(), ids.begin() + int64_t(lens.size()) * p.max_blocks);
  return p;
}

// Host metadata of T query tokens over the pool's block table (max_context from the positions);
// the tensors borrow the vectors, which must outlive it.
PagedAttnMeta pool_meta(Pool& pool, size_t S, std::vector<int32_t>& seq, std::vector<int32_t>& pos,
                        std::vector<int32_t>& slot) {
  const int64_t T = int64_t(seq.size());
  PagedAttnMeta m;
  m.token_seq = host(seq, {T});
  m.token_pos = host(pos, {T});
  m.slot_mapping = host(slot, {T});
  m.block_table = host(pool.table, {int64_t(S), pool.max_blocks});
  m.block_size = pool.bs;
  for (int32_t p : pos) m.max_context = std::max(m.max_context, p + 1);
  return m;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const uint8_t* b = t.ptr<uint8_t>();
  return std::vector<uint8_t>(b, b + t.nbytes());
}

}  // namespace

TEST(Fp8KvCache, PagedAttentionMatchesPyTorchFixture) {
  const nlohmann::json& fx = fixture();
  ASSERT_FALSE(fx.is_null()) << "tests/fixtures/fp8/fp8_reference.json is missing or malformed: regenerate it with `"
                             << kScript << "`";
  Context& ctx = test_ctx();
  ASSERT_GE(fx["attention"].size(), 1u);
  for (size_t e = 0; e < fx["attention"].size(); ++e) {
    const nlohmann::json& c = fx["attention"][e];
    const int64_t Hq = c["Hq"], Hkv = c["Hkv"], D = c["D"];
    const size_t S = c["seqs"].size();
    std::vector<int> lens;
    for (const auto& s : c["seqs"]) lens.push_back(s["len"].get<int>());
    Pool pool = make_pool(lens, 16, uint32_t(100 + e));
    Tensor kc = tensor_zeros(Device::cpu, DType::f8e4m3, {pool.n_blocks, pool.bs, Hkv, D});
    Tensor vc = tensor_zeros(Device::cpu, DType::f8e4m3, {pool.n_blocks, pool.bs, Hkv, D});
    // The same K/V, decoded, in an f32 cache: attention over it must give the fp8 result bit for bit.
    Tensor kf = tensor_zeros(Device::cpu, DType::f32, {pool.n_blocks, pool.bs, Hkv, D});
    Tensor vf = tensor_zeros(Device::cpu, DType::f32, {pool.n_blocks, pool.bs, Hkv, D});
    const int64_t row = Hkv * D;

    // Cache writes in two batched steps, like chunked prefill: the first half of
    // every sequence, then the rest; one token of padding (slot -1) in each step.
    std::vector<std::vector<float>> k_all(S), v_all(S);
    for (size_t s = 0; s < S; ++s) {
      k_all[s] = sixteenths(c["seqs"][s]["k"]);
      v_all[s] = sixteenths(c["seqs"][s]["v"]);
      ASSERT_EQ(k_all[s].size(), size_t(lens[s] * row));
    }
    for (int half = 0; half < 2; ++half) {
      std::vector<int32_t> slot, seq, pos;
      std::vector<float> k, v, kq, vq;
      for (size_t s = 0; s < S; ++s) {
        const int p0 = half == 0 ? 0 : lens[s] / 2, p1 = half == 0 ? lens[s] / 2 : lens[s];
        for (int p = p0; p < p1; ++p) {
          slot.push_back(pool.slot(s, p));
          seq.push_back(int32_t(s));
          pos.push_back(p);
          k.insert(k.end(), k_all[s].begin() + p * row, k_all[s].begin() + (p + 1) * row);
          v.insert(v.end(), v_all[s].begin() + p * row, v_all[s].begin() + (p + 1) * row);
        }
      }
      slot.push_back(-1);  // padding row: writes nothing
      seq.push_back(0);
      pos.push_back(0);
      k.insert(k.end(), size_t(row), 99.f);
      v.insert(v.end(), size_t(row), -99.f);
      const int64_t T = int64_t(slot.size());
      for (float x : k) kq.push_back(f8e4m3_to_f32(f32_to_f8e4m3(x)));
      for (float x : v) vq.push_back(f8e4m3_to_f32(f32_to_f8e4m3(x)));
      const PagedAttnMeta m = pool_meta(pool, S, seq, pos, slot);
      kv_cache_write(ctx, kc, vc, host(k, {T, Hkv, D}), host(v, {T, Hkv, D}), m);
      kv_cache_write(ctx, kf, vf, host(kq, {T, Hkv, D}), host(vq, {T, Hkv, D}), m);
    }

    // Every cached byte is f32_to_f8e4m3 of its f32 element; unwritten slots stay 0.
    std::vector<uint8_t> kexp(kc.nbytes(), 0), vexp(vc.nbytes(), 0);
    for (size_t s = 0; s < S; ++s)
      for (int p = 0; p < lens[s]; ++p)
        for (int64_t i = 0; i < row; ++i) {
          kexp[size_t(pool.slot(s, p) * row + i)] = f32_to_f8e4m3(k_all[s][size_t(p * row + i)]);
          vexp[size_t(pool.slot(s, p) * row + i)] = f32_to_f8e4m3(v_all[s][size_t(p * row + i)]);
        }
    EXPECT_TRUE(bytes_of(kc) == kexp) << "entry " << e << ": k cache bytes";
    EXPECT_TRUE(bytes_of(vc) == vexp) << "entry " << e << ": v cache bytes";

    // One attention batch over the fixture's positions of every sequence.
    std::vector<int32_t> seq, pos, slot;
    std::vector<float> q;
    std::vector<double> ref;
    for (size_t s = 0; s < S; ++s) {
      const std::vector<float> qs = sixteenths(c["seqs"][s]["q"]);
      const std::vector<double> out = c["seqs"][s]["out"].get<std::vector<double>>();
      const std::vector<int> ps = c["seqs"][s]["positions"].get<std::vector<int>>();
      ASSERT_EQ(out.size(), ps.size() * size_t(Hq * D));
      for (int p : ps) {
        seq.push_back(int32_t(s));
        pos.push_back(p);
        slot.push_back(pool.slot(s, p));
        q.insert(q.end(), qs.begin() + p * Hq * D, qs.begin() + (p + 1) * Hq * D);
      }
      ref.insert(ref.end(), out.begin(), out.end());
    }
    const int64_t T = int64_t(seq.size());
    const PagedAttnMeta m = pool_meta(pool, S, seq, pos, slot);
    std::vector<float> got(q.size()), got_f32(q.size());
    Tensor tg = host(got, {T, Hq, D}), tf = host(got_f32, {T, Hq, D});
    attention_paged(ctx, tg, host(q, {T, Hq, D}), kc, vc, m);
    attention_paged(ctx, tf, host(q, {T, Hq, D}), kf, vf, m);
    // f32 accumulation over up to 200 keys of |q·k| <= 3·4·D against a float64 reference.
    const std::string name = "fp8 paged attention vs PyTorch, entry " + std::to_string(e) + " (Hq " +
                             std::to_string(Hq) + ", Hkv " + std::to_string(Hkv) + ", D " + std::to_string(D) + ")";
    auto r = all_close(name.c_str(), got, ref, 1e-5, 1e-5);
    EXPECT_TRUE(r);
    std::printf("[fp8] %s (%lld query rows)\n", r.message(), (long long)T);
    EXPECT_TRUE(std::memcmp(got.data(), got_f32.data(), got.size() * sizeof(float)) == 0)
        << "entry " << e << ": attention over the fp8 cache differs from attention over its decoded f32 copy";
  }
}

TEST(Fp8KvCache, FusedRopeCacheWritesEqualRopeThenKvCacheWrite) {
  Context& ctx = test_ctx();
  const int64_t T = 23, Hq = 4, Hkv = 2, D = 32, P = 64, bs = 16;
  const float eps = 1e-6f;
  // Two sequences (15 and 7 tokens) in one step, plus a padding token (slot -1). The
  // rotary positions of sequence 1 start at 20 (no attention runs here, so its slots
  // need not follow its positions).
  const std::vector<int> lens = {15, 7};
  Pool pool = make_pool(lens, int(bs), 7);
  std::vector<int32_t> pos, slot, seq;
  for (size_t s = 0; s < lens.size(); ++s)
    for (int p = 0; p < lens[s]; ++p) {
      pos.push_back(p + 20 * int(s));
      seq.push_back(int32_t(s));
      slot.push_back(pool.slot(s, p));
    }
  pos.push_back(0);
  seq.push_back(0);
  slot.push_back(-1);
  ASSERT_EQ(int64_t(pos.size()), T);
  std::vector<float> cos(size_t(P * D / 2)), sin(cos.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = double(p) * std::pow(10000.0, -2.0 * double(i) / double(D));
      cos[size_t(p * D / 2 + i)] = float(std::cos(a));
      sin[size_t(p * D / 2 + i)] = float(std::sin(a));
    }
  Tensor tp = host(pos, {T}), tc = host(cos, {P, D / 2}), ts = host(sin, {P, D / 2});
  PagedAttnMeta m;
  m.token_seq = host(seq, {T});
  m.token_pos = tp;
  m.slot_mapping = host(slot, {T});
  m.block_table = host(pool.table, {int64_t(lens.size()), pool.max_blocks});
  m.block_size = int(bs);
  // Standard deviation 150: a few |k| and |v| go past 448 (saturation), most land between E4M3 neighbours.
  std::vector<float> qkv = randn(size_t(T * (Hq + 2 * Hkv) * D), 11, 150.f);
  std::vector<float> q0(size_t(T * Hq * D)), k0(size_t(T * Hkv * D)), v0(k0.size());
  for (int64_t t = 0; t < T; ++t) {
    const float* r = qkv.data() + t * (Hq + 2 * Hkv) * D;
    std::copy(r, r + Hq * D, q0.begin() + t * Hq * D);
    std::copy(r + Hq * D, r + (Hq + Hkv) * D, k0.begin() + t * Hkv * D);
    std::copy(r + (Hq + Hkv) * D, r + (Hq + 2 * Hkv) * D, v0.begin() + t * Hkv * D);
  }
  auto fp8_cache = [&] { return tensor_zeros(Device::cpu, DType::f8e4m3, {pool.n_blocks, bs, Hkv, D}); };

  // Reference: rope_forward on q and k, then kv_cache_write into an fp8 and an f32 cache.
  std::vector<float> q_ref = q0, k_ref = k0, v_ref = v0;
  Tensor tq_ref = host(q_ref, {T, Hq, D}), tk_ref = host(k_ref, {T, Hkv, D});
  rope_forward(ctx, tq_ref, tp, tc, ts);
  rope_forward(ctx, tk_ref, tp, tc, ts);
  Tensor kc_ref = fp8_cache(), vc_ref = fp8_cache();
  kv_cache_write(ctx, kc_ref, vc_ref, tk_ref, host(v_ref, {T, Hkv, D}), m);
  Tensor kf = tensor_zeros(Device::cpu, DType::f32, {pool.n_blocks, bs, Hkv, D});
  Tensor vf = tensor_zeros(Device::cpu, DType::f32, {pool.n_blocks, bs, Hkv, D});
  kv_cache_write(ctx, kf, vf, tk_ref, host(v_ref, {T, Hkv, D}), m);
  // The fp8 cache holds f32_to_f8e4m3 of the f32 cache's elements (zeros where nothing was written).
  {
    const float *KF = kf.ptr<float>(), *VF = vf.ptr<float>();
    const uint8_t *KC = kc_ref.ptr<uint8_t>(), *VC = vc_ref.ptr<uint8_t>();
    int64_t n_bad = 0, n_sat = 0;
    for (int64_t i = 0; i < kf.numel(); ++i) {
      n_bad += KC[i] != f32_to_f8e4m3(KF[i]);
      n_bad += VC[i] != f32_to_f8e4m3(VF[i]);
      n_sat += std::fabs(KF[i]) > 448.f;
      n_sat += std::fabs(VF[i]) > 448.f;
    }
    EXPECT_EQ(n_bad, 0) << "cache bytes that are not f32_to_f8e4m3 of the f32 rows";
    EXPECT_GT(n_sat, 0) << "the data should reach the saturation range";
  }

  {  // rope_qk_cache_write
    std::vector<float> q = q0, k = k0, v = v0;
    Tensor tq = host(q, {T, Hq, D}), tk = host(k, {T, Hkv, D});
    Tensor kc = fp8_cache(), vc = fp8_cache();
    rope_qk_cache_write(ctx, tq, tk, host(v, {T, Hkv, D}), tp, tc, ts, kc, vc, m);
    EXPECT_TRUE(all_close("rope_qk_cache_write q", q, q_ref, 0.0, 0.0));
    EXPECT_TRUE(bytes_of(kc) == bytes_of(kc_ref)) << "rope_qk_cache_write: k cache";
    EXPECT_TRUE(bytes_of(vc) == bytes_of(vc_ref)) << "rope_qk_cache_write: v cache";
  }
  {  // rope_qkv_cache_write
    std::vector<float> q(q0.size(), 0.f);
    Tensor tq = host(q, {T, Hq, D});
    Tensor kc = fp8_cache(), vc = fp8_cache();
    rope_qkv_cache_write(ctx, tq, host(qkv, {T, (Hq + 2 * Hkv) * D}), tp, tc, ts, kc, vc, m);
    EXPECT_TRUE(all_close("rope_qkv_cache_write q", q, q_ref, 0.0, 0.0));
    EXPECT_TRUE(bytes_of(kc) == bytes_of(kc_ref)) << "rope_qkv_cache_write: k cache";
    EXPECT_TRUE(bytes_of(vc) == bytes_of(vc_ref)) << "rope_qkv_cache_write: v cache";
  }
  {  // qk_norm_rope_cache_write against rmsnorm per head, rope, kv_cache_write
    std::vector<float> qn_w = randn(size_t(D), 21, 0.5f), kn_w = randn(size_t(D), 22, 0.5f);
    for (float& x : qn_w) x += 1.f;
    for (float& x : kn_w) x += 1.f;
    std::vector<float> qn(q0.size()), kn(k0.size()), v = v0;
    Tensor tqn = host(qn, {T * Hq, D}), tkn = host(kn, {T * Hkv, D});
    rmsnorm_forward(ctx, tqn, nullptr, host(q0, {T * Hq, D}), host(qn_w, {D}), eps);
    rmsnorm_forward(ctx, tkn, nullptr, host(k0, {T * Hkv, D}), host(kn_w, {D}), eps);
    Tensor tqn3 = host(qn, {T, Hq, D}), tkn3 = host(kn, {T, Hkv, D});
    rope_forward(ctx, tqn3, tp, tc, ts);
    rope_forward(ctx, tkn3, tp, tc, ts);
    Tensor kc_n = fp8_cache(), vc_n = fp8_cache();
    kv_cache_write(ctx, kc_n, vc_n, tkn3, host(v, {T, Hkv, D}), m);

    std::vector<float> q(q0.size(), 0.f);
    Tensor tq = host(q, {T, Hq, D});
    Tensor kc = fp8_cache(), vc = fp8_cache();
    qk_norm_rope_cache_write(ctx, tq, host(qkv, {T, (Hq + 2 * Hkv) * D}), host(qn_w, {D}), host(kn_w, {D}), eps, tp,
                             tc, ts, kc, vc, m);
    EXPECT_TRUE(all_close("qk_norm_rope_cache_write q", q, qn, 0.0, 0.0));
    EXPECT_TRUE(bytes_of(kc) == bytes_of(kc_n)) << "qk_norm_rope_cache_write: k cache";
    EXPECT_TRUE(bytes_of(vc) == bytes_of(vc_n)) << "qk_norm_rope_cache_write: v cache";
    EXPECT_TRUE(bytes_of(vc) == bytes_of(vc_ref)) << "v rows are not normalised";
  }
}

TEST(Fp8KvCacheDeathTest, DispatchersRejectOtherCacheDtypes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Context& ctx = test_ctx();
  const int64_t T = 2, Hq = 2, Hkv = 1, D = 16, P = 4;
  std::vector<float> q(size_t(T * Hq * D), 0.5f), k(size_t(T * Hkv * D), 0.25f), v(k.size(), 1.f), out(q.size());
  std::vector<float> qkv(size_t(T * (Hq + 2 * Hkv) * D), 0.5f), nw(size_t(D), 1.f);
  std::vector<float> cos(size_t(P * D / 2), 1.f), sin(cos.size(), 0.f);
  std::vector<int32_t> seq = {0, 0}, pos = {0, 1}, slot = {0, 1}, table = {0};
  PagedAttnMeta m;
  m.token_seq = host(seq, {T});
  m.token_pos = host(pos, {T});
  m.slot_mapping = host(slot, {T});
  m.block_table = host(table, {1, 1});
  m.block_size = 16;
  m.max_context = 2;
  Tensor tq = host(q, {T, Hq, D}), tk = host(k, {T, Hkv, D}), tv = host(v, {T, Hkv, D}), tout = host(out, {T, Hq, D});
  Tensor tqkv = host(qkv, {T, (Hq + 2 * Hkv) * D}), tnw = host(nw, {D});
  Tensor tp = host(pos, {T}), tc = host(cos, {P, D / 2}), ts = host(sin, {P, D / 2});
  auto cache = [&](DType dt) { return tensor_zeros(Device::cpu, dt, {1, 16, Hkv, D}); };
  Tensor bf_k = cache(DType::bf16), bf_v = cache(DType::bf16), f8_k = cache(DType::f8e4m3), f32_v = cache(DType::f32);
  Tensor i32_k = cache(DType::i32), i32_v = cache(DType::i32);

  // Accepted: f32 (the activations' dtype) and f8e4m3.
  Tensor f8_v = cache(DType::f8e4m3);
  kv_cache_write(ctx, f8_k, f8_v, tk, tv, m);
  attention_paged(ctx, tout, tq, f8_k, f8_v, m);

  const char* allowed = "both caches must have one dtype, either the activations' \\(f32\\) or f8e4m3";
  EXPECT_DEATH(kv_cache_write(ctx, bf_k, bf_v, tk, tv, m),
               std::string("kv_cache_write: k_cache is bf16 and v_cache is bf16; ") + allowed);
  EXPECT_DEATH(attention_paged(ctx, tout, tq, bf_k, bf_v, m),
               std::string("attention_paged: k_cache is bf16 and v_cache is bf16; ") + allowed);
  EXPECT_DEATH(attention_paged(ctx, tout, tq, f8_k, f32_v, m),
               std::string("attention_paged: k_cache is f8_e4m3 and v_cache is f32; ") + allowed);
  EXPECT_DEATH(rope_qk_cache_write(ctx, tq, tk, tv, tp, tc, ts, i32_k, i32_v, m),
               std::string("rope_qk_cache_write: k_cache is i32 and v_cache is i32; ") + allowed);
  EXPECT_DEATH(rope_qkv_cache_write(ctx, tq, tqkv, tp, tc, ts, bf_k, bf_v, m),
               std::string("rope_qkv_cache_write: k_cache is bf16 and v_cache is bf16; ") + allowed);
  EXPECT_DEATH(qk_norm_rope_cache_write(ctx, tq, tqkv, tnw, tnw, 1e-6f, tp, tc, ts, f8_k, f32_v, m),
               std::string("qk_norm_rope_cache_write: k_cache is f8_e4m3 and v_cache is f32; ") + allowed);
}
