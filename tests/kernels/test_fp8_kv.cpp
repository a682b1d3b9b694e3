// FP8 E4M3 KV cache (kv_cache_dtype = fp8) on CUDA: the cache writes (attention.cu, rope.cu)
// and attention_paged over FP8 caches on the CUDA-core paged kernel (and on whichever
// kernel attention_paged picks for the shape).
//  - Conversion: f32 → E4M3 through kv_cache_write equals PyTorch's on the fixture table
//    (tests/fixtures/fp8, tools/ref/make_fp8_fixtures.py): midpoints, subnormals, saturation.
//  - Cache writes (kv_cache_write, rope_qk_cache_write, rope_qkv_cache_write,
//    qk_norm_rope_cache_write; bf16 and f32; vector and fallback paths; padding tokens with
//    slot −1): every byte of the FP8 cache is f32_to_f8e4m3 of what the same op writes into a
//    cache of the model dtype (itself checked against the CPU by CudaRopeCache/CudaAttention),
//    slots that are not written keep their bytes, and q (k) come out bitwise as with that cache.
//  - attention_paged over FP8 caches: the fixture's float64 attention over E4M3 K/V (several
//    sequences in one batch on shuffled blocks; prefill-style rows without a tile list, decode
//    rows, rows with a tile list); contexts past 1024 keys (several partitions, the combine)
//    against a float64 reference over the cache's exact values, the CPU backend's FP8 path and
//    the path over a cache of the model dtype holding the same values; batch invariance (decode
//    rows == prefill rows, a sequence alone == in a batch, any max_context ≥ the contexts).
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "kernels/attention.h"
#include "kernels/rope.h"

using namespace grpo;
using namespace grpo::cudatest;
using nlohmann::json;

namespace {

// ---- bytes ----

std::vector<uint8_t> fetch_fp8(const Tensor& t) { return fetch_raw<uint8_t>(t); }
std::vector<uint8_t> to_e4m3(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_f8e4m3(v[i]);
  return b;
}
std::vector<float> from_e4m3(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = f8e4m3_to_f32(b[i]);
  return v;
}
// Random E4M3 codes without the NaN codes (0x7f, 0xff): cache contents before a write.
std::vector<uint8_t> random_fp8(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) {
    x = uint8_t(g() & 0xffu);
    if ((x & 0x7f) == 0x7f) x ^= 1;
  }
  return b;
}

::testing::AssertionResult same_bytes(const std::string& name, const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << name << ": " << got.size() << " bytes, expected " << want.size();
  int64_t n_bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      if (first < 0) first = int64_t(i);
      ++n_bad;
    }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  const size_t f = static_cast<size_t>(first);
  std::ostringstream os;
  os << name << ": " << n_bad << " of " << want.size() << " bytes differ; first at " << first << ": 0x" << std::hex
     << int(got[f]) << " (" << f8e4m3_to_f32(got[f]) << "), expected 0x" << int(want[f]) << " ("
     << f8e4m3_to_f32(want[f]) << ")";
  return ::testing::AssertionFailure() << os.str();
}

// Bytes of the cache slots that no token writes (slot_mapping entries >= 0 are written).
std::vector<uint8_t> unwritten(const std::vector<uint8_t>& cache, const std::vector<int32_t>& slots,
                               int64_t row_bytes) {
  const int64_t n_slots = int64_t(cache.size()) / row_bytes;
  std::vector<char> hit(static_cast<size_t>(n_slots), 0);
  for (int32_t s : slots)
    if (s >= 0) hit[static_cast<size_t>(s)] = 1;
  std::vector<uint8_t> out;
  for (int64_t s = 0; s < n_slots; ++s)
    if (!hit[static_cast<size_t>(s)])
      out.insert(out.end(), cache.begin() + s * row_bytes, cache.begin() + (s + 1) * row_bytes);
  return out;
}

// Values of mixed magnitude (E4M3 subnormals to saturation), rounded to dt.
std::vector<float> mixed(size_t n, uint32_t seed, DType dt) {
  auto v = randn(n, seed);
  const float scales[] = {1.f, 3e-3f, 0.08f, 1.f, 40.f, 700.f};
  for (size_t i = 0; i < n; ++i) v[i] *= scales[i % std::size(scales)];
  return rounded(v, dt);
}

std::string shape_tag(const char* op, DType dt, int64_t Hq, int64_t Hkv, int64_t D) {
  return std::string(op) + " [" + dtype_name(dt) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
         " D=" + std::to_string(D) + "]";
}

// ---- fixture ----

const json* fixture() {
  static const json* fx = []() -> const json* {
    const std::string path = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/fp8/fp8_reference.json";
    std::ifstream f(path);
    if (!f) return nullptr;
    json* j = new json(json::parse(f));
    if ((*j)["format"] != "grpo-fp8-fixture" || (*j)["version"] != 1) return nullptr;
    return j;
  }();
  return fx;
}
#define GRPO_REQUIRE_FIXTURE(fx)                                                                       \
  const json* fx = fixture();                                                                          \
  ASSERT_NE(fx, nullptr) << "tests/fixtures/fp8/fp8_reference.json missing or of another version: run " \
                            "python3 tools/ref/make_fp8_fixtures.py --out tests/fixtures/fp8"

// ---- paged batches ----

// Sequences on shuffled physical blocks (one spare block stays unused), and query tokens.
struct Batch {
  int32_t bs = 16;
  int64_t S = 0, max_blocks = 0, n_blocks = 0;
  std::vector<int32_t> lens, table;
  int32_t slot(int64_t s, int32_t p) const {
    return table[static_cast<size_t>(s * max_blocks + p / bs)] * bs + p % bs;
  }
};
Batch make_batch(const std::vector<int32_t>& lens, uint32_t seed) {
  Batch b;
  b.lens = lens;
  b.S = int64_t(lens.size());
  b.n_blocks = 1;
  for (int32_t l : lens) {
    b.max_blocks = std::max<int64_t>(b.max_blocks, (l + b.bs - 1) / b.bs);
    b.n_blocks += (l + b.bs - 1) / b.bs;
  }
  std::vector<int32_t> perm(static_cast<size_t>(b.n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  b.table.assign(static_cast<size_t>(b.S * b.max_blocks), -1);
  size_t next = 0;
  for (int64_t s = 0; s < b.S; ++s)
    for (int64_t j = 0; j < (lens[static_cast<size_t>(s)] + b.bs - 1) / b.bs; ++j)
      b.table[static_cast<size_t>(s * b.max_blocks + j)] = perm[next++];
  return b;
}

// Query tokens (seq, pos) of one attention_paged call, with device metadata.
struct Queries {
  std::vector<int32_t> seq, pos;
  int64_t n() const { return int64_t(seq.size()); }
};
PagedAttnMeta dev_meta(const Batch& b, Queries& qs, int max_context) {
  PagedAttnMeta m;
  m.block_size = b.bs;
  m.max_context = max_context;
  m.token_seq = dev_int(qs.seq, DType::i32, {qs.n()});
  m.token_pos = dev_int(qs.pos, DType::i32, {qs.n()});
  m.block_table = dev_int(b.table, DType::i32, {b.S, b.max_blocks});
  m.slot_mapping = dev_int(std::vector<int32_t>(static_cast<size_t>(qs.n()), -1), DType::i32, {qs.n()});
  return m;
}
PagedAttnMeta host_meta(Batch& b, Queries& qs, int max_context) {
  PagedAttnMeta m;
  m.block_size = b.bs;
  m.max_context = max_context;
  m.token_seq = host_i32(qs.seq, {qs.n()});
  m.token_pos = host_i32(qs.pos, {qs.n()});
  m.block_table = host_i32(b.table, {b.S, b.max_blocks});
  return m;
}

// Writes the k/v rows of every position of every sequence (k, v: (Σ lens, Hkv, D), sequence by
// sequence) into FP8 caches through cuda::kv_cache_write; returns the caches.
std::pair<Tensor, Tensor> fill_fp8_cache(const Batch& b, const std::vector<float>& k, const std::vector<float>& v,
                                         DType dt, int64_t Hkv, int64_t D, uint32_t seed) {
  std::vector<int32_t> slots;
  for (int64_t s = 0; s < b.S; ++s)
    for (int32_t p = 0; p < b.lens[static_cast<size_t>(s)]; ++p) slots.push_back(b.slot(s, p));
  const int64_t T = int64_t(slots.size());
  const std::vector<int64_t> cshape = {b.n_blocks, b.bs, Hkv, D};
  const size_t cn = static_cast<size_t>(b.n_blocks * b.bs * Hkv * D);
  Tensor kc = dev_fp8(random_fp8(cn, seed), cshape), vc = dev_fp8(random_fp8(cn, seed + 1), cshape);
  PagedAttnMeta m;
  m.block_size = b.bs;
  m.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
  cuda::kv_cache_write(gpu_ctx(), kc, vc, gk, gv, m);
  return {kc, vc};
}

// Causal attention of each query (q: (n, Hq, D)) over the cache values (exact), in double.
std::vector<float> reference(const Batch& b, const Queries& qs, const std::vector<float>& q,
                             const std::vector<float>& kc, const std::vector<float>& vc, int64_t Hq, int64_t Hkv,
                             int64_t D) {
  const int64_t G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<float> out(static_cast<size_t>(qs.n() * Hq * D));
  std::vector<double> s, acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < qs.n(); ++t) {
    const int64_t seq = qs.seq[static_cast<size_t>(t)], n = qs.pos[static_cast<size_t>(t)] + 1;
    s.assign(static_cast<size_t>(n), 0.0);
    for (int64_t h = 0; h < Hq; ++h) {
      const float* qr = q.data() + (t * Hq + h) * D;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* kr = kc.data() + (int64_t(b.slot(seq, int32_t(j))) * Hkv + h / G) * D;
        double d = 0.0;
        for (int64_t i = 0; i < D; ++i) d += double(qr[i]) * double(kr[i]);
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double l = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(s[static_cast<size_t>(j)] - mx);
        l += p;
        const float* vr = vc.data() + (int64_t(b.slot(seq, int32_t(j))) * Hkv + h / G) * D;
        for (int64_t i = 0; i < D; ++i) acc[static_cast<size_t>(i)] += p * double(vr[i]);
      }
      for (int64_t i = 0; i < D; ++i) out[static_cast<size_t>((t * Hq + h) * D + i)] = float(acc[static_cast<size_t>(i)] / l);
    }
  }
  return out;
}

// Rows (of Hq·D values) picked from `rows` by index.
std::vector<float> pick_rows(const std::vector<float>& rows, const std::vector<int64_t>& idx, int64_t width) {
  std::vector<float> out;
  for (int64_t i : idx) out.insert(out.end(), rows.begin() + i * width, rows.begin() + (i + 1) * width);
  return out;
}

// The CUDA-core paged kernel serves every bf16 query of these shapes (the tensor-core kernels
// take head dims 64/128 with 4..16 query heads per kv head): its bf16 rows are then the f32
// rows rounded to bf16, bit for bit (q enters in f32, the partition length depends on the cache
// dtype only, and all arithmetic is f32).
bool cuda_core_only(int64_t Hq, int64_t Hkv, int64_t D) { return Hq / Hkv < 4 || (D != 64 && D != 128); }

std::vector<float> bf16_rounded(std::vector<float> v) { return rounded(std::move(v), DType::bf16); }

Tol tol_fp8_attn(DType dt) { return dt == DType::f32 ? Tol{2e-5, 1e-4} : tol_reduce(DType::bf16); }

// ---- cache-write runs ----

struct WriteCase {
  int64_t Hq, Hkv, D;
};

// kv_cache_write into FP8 caches: the bytes are f32_to_f8e4m3 of the (dt-rounded) rows, the
// CPU backend writes the same bytes, padding tokens and unused slots leave the cache alone.
void run_kv_write(DType dt, int64_t Hkv, int64_t D, uint32_t seed) {
  const int64_t T = 41, n_blocks = 6, bs = 16, row = Hkv * D;
  const std::string nm = shape_tag("kv_cache_write fp8", dt, Hkv, Hkv, D);
  auto k = mixed(static_cast<size_t>(T * row), seed, dt), v = mixed(static_cast<size_t>(T * row), seed + 1, dt);
  // Edge values: ±inf and beyond 448 saturate, 464 is the tie above 448, 2^-10 and 3·2^-10 are
  // subnormal ties (to even), ±1e-8 round to ±0.
  const float edges[] = {INFINITY, -INFINITY, 1e6f, -464.f, 464.f, 0x1p-10f, 3 * 0x1p-10f, 1e-8f, -1e-8f, 0.f, -0.f};
  for (size_t i = 0; i < std::size(edges); ++i) {
    k[i * 7] = edges[i];
    v[i * 5 + 3] = edges[i];
  }
  k = rounded(k, dt);
  v = rounded(v, dt);
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks * bs));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> slots(perm.begin(), perm.begin() + T);
  slots[3] = slots[17] = slots[40] = -1;  // padding tokens
  const auto k0 = random_fp8(static_cast<size_t>(n_blocks * bs * row), seed + 2);
  const auto v0 = random_fp8(k0.size(), seed + 3);

  std::vector<uint8_t> want_k = k0, want_v = v0;
  const auto kb = to_e4m3(k), vb = to_e4m3(v);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = slots[static_cast<size_t>(t)];
    if (s < 0) continue;
    std::copy(kb.begin() + t * row, kb.begin() + (t + 1) * row, want_k.begin() + s * row);
    std::copy(vb.begin() + t * row, vb.begin() + (t + 1) * row, want_v.begin() + s * row);
  }

  PagedAttnMeta gm;
  gm.block_size = int(bs);
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gkc = dev_fp8(k0, {n_blocks, bs, Hkv, D}), gvc = dev_fp8(v0, {n_blocks, bs, Hkv, D});
  Tensor gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
  cuda::kv_cache_write(gpu_ctx(), gkc, gvc, gk, gv, gm);
  const auto got_k = fetch_fp8(gkc), got_v = fetch_fp8(gvc);
  EXPECT_TRUE(same_bytes(nm + " k cache", got_k, want_k));
  EXPECT_TRUE(same_bytes(nm + " v cache", got_v, want_v));
  EXPECT_TRUE(same_bytes(nm + " unwritten k slots", unwritten(got_k, slots, row), unwritten(k0, slots, row)));

  // The CPU backend (f32 rows holding the same values) writes the same bytes.
  std::vector<uint8_t> hk_c = k0, hv_c = v0;
  PagedAttnMeta hm;
  hm.block_size = int(bs);
  hm.slot_mapping = host_i32(slots, {T});
  Tensor hkc = tensor_borrow(hk_c.data(), DType::f8e4m3, Device::cpu, {n_blocks, bs, Hkv, D});
  Tensor hvc = tensor_borrow(hv_c.data(), DType::f8e4m3, Device::cpu, {n_blocks, bs, Hkv, D});
  Tensor hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D});
  cpu::kv_cache_write(cpu_ctx(), hkc, hvc, hk, hv, hm);
  EXPECT_TRUE(same_bytes(nm + " k cache vs CPU", got_k, hk_c));
  EXPECT_TRUE(same_bytes(nm + " v cache vs CPU", got_v, hv_c));
}

// Slots of the rope tests: distinct, shuffled, one padding token.
std::vector<int32_t> rope_slots(int64_t T, int64_t n_slots, int64_t pad, uint32_t seed) {
  std::vector<int32_t> perm(static_cast<size_t>(n_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> slots(perm.begin(), perm.begin() + T);
  slots[static_cast<size_t>(pad)] = -1;
  return slots;
}

// One fused write op run twice on the GPU: into caches of the model dtype holding the values of
// the initial FP8 bytes, and into FP8 caches holding those bytes. `op` runs the op into
// (k_cache, v_cache) and returns its q output and what else it wrote (k for rope_qk_cache_write).
struct CacheRun {
  std::vector<float> q, extra;
};
template <class Op>
void compare_cache_runs(const std::string& nm, DType dt, int64_t n_blocks, int64_t bs, int64_t Hkv, int64_t D,
                        const std::vector<int32_t>& slots, uint32_t seed, Op op) {
  const std::vector<int64_t> cshape = {n_blocks, bs, Hkv, D};
  const auto k0 = random_fp8(static_cast<size_t>(n_blocks * bs * Hkv * D), seed);
  const auto v0 = random_fp8(k0.size(), seed + 1);
  Tensor ak = dev(from_e4m3(k0), dt, cshape), av = dev(from_e4m3(v0), dt, cshape);
  Tensor fk = dev_fp8(k0, cshape), fv = dev_fp8(v0, cshape);
  CacheRun a = op(ak, av), f = op(fk, fv);
  EXPECT_TRUE(close(nm + " q, bitwise vs the model-dtype cache run", f.q, a.q, Tol{0, 0}));
  if (!a.extra.empty()) {
    EXPECT_TRUE(close(nm + " k, bitwise vs the model-dtype cache run", f.extra, a.extra, Tol{0, 0}));
  }
  const auto got_k = fetch_fp8(fk), got_v = fetch_fp8(fv);
  EXPECT_TRUE(same_bytes(nm + " k cache == e4m3(model-dtype k cache)", got_k, to_e4m3(fetch(ak))));
  EXPECT_TRUE(same_bytes(nm + " v cache == e4m3(model-dtype v cache)", got_v, to_e4m3(fetch(av))));
  EXPECT_TRUE(same_bytes(nm + " unwritten k slots", unwritten(got_k, slots, Hkv * D), unwritten(k0, slots, Hkv * D)));
  EXPECT_TRUE(same_bytes(nm + " unwritten v slots", unwritten(got_v, slots, Hkv * D), unwritten(v0, slots, Hkv * D)));
}

void run_rope_qk(DType dt, const WriteCase& c, uint32_t seed) {
  const int64_t T = 37, P = 300, half = c.D / 2, n_blocks = 8, bs = 16, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  const std::string nm = shape_tag("rope_qk_cache_write fp8", dt, Hq, Hkv, D);
  auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed), dt);
  auto k = mixed(static_cast<size_t>(T * Hkv * D), seed + 1, dt), v = mixed(static_cast<size_t>(T * Hkv * D), seed + 2, dt);
  auto cs = randn(static_cast<size_t>(P * half), seed + 3), sn = randn(static_cast<size_t>(P * half), seed + 4);
  std::vector<int32_t> pos;
  for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t((t * 7) % P));
  const auto slots = rope_slots(T, n_blocks * bs, 5, seed + 5);
  PagedAttnMeta gm;
  gm.block_size = int(bs);
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  Tensor gv = dev(v, dt, {T, Hkv, D});
  compare_cache_runs(nm, dt, n_blocks, bs, Hkv, D, slots, seed + 6, [&](Tensor& kc, Tensor& vc) {
    Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D});
    cuda::rope_qk_cache_write(gpu_ctx(), gq, gk, gv, gp, gc, gs, kc, vc, gm);
    return CacheRun{fetch(gq), fetch(gk)};
  });
  // The unfused ops (rope ×2, then kv_cache_write into FP8 caches) write the same bytes.
  const auto k0 = random_fp8(static_cast<size_t>(n_blocks * bs * Hkv * D), seed + 7);
  const auto v0 = random_fp8(k0.size(), seed + 8);
  Tensor fk = dev_fp8(k0, {n_blocks, bs, Hkv, D}), fv = dev_fp8(v0, {n_blocks, bs, Hkv, D});
  Tensor uk = dev_fp8(k0, {n_blocks, bs, Hkv, D}), uv = dev_fp8(v0, {n_blocks, bs, Hkv, D});
  Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D});
  cuda::rope_qk_cache_write(gpu_ctx(), gq, gk, gv, gp, gc, gs, fk, fv, gm);
  Tensor uq = dev(q, dt, {T, Hq, D}), ukr = dev(k, dt, {T, Hkv, D});
  cuda::rope_forward(gpu_ctx(), uq, gp, gc, gs);
  cuda::rope_forward(gpu_ctx(), ukr, gp, gc, gs);
  cuda::kv_cache_write(gpu_ctx(), uk, uv, ukr, gv, gm);
  EXPECT_TRUE(same_bytes(nm + " k cache == unfused ops", fetch_fp8(fk), fetch_fp8(uk)));
  EXPECT_TRUE(same_bytes(nm + " v cache == unfused ops", fetch_fp8(fv), fetch_fp8(uv)));
}

void run_rope_qkv(DType dt, const WriteCase& c, uint32_t seed) {
  const int64_t T = 29, P = 200, half = c.D / 2, n_blocks = 4, bs = 16, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  const int64_t W = (Hq + 2 * Hkv) * D;
  const std::string nm = shape_tag("rope_qkv_cache_write fp8", dt, Hq, Hkv, D);
  auto qkv = mixed(static_cast<size_t>(T * W), seed, dt);
  auto cs = randn(static_cast<size_t>(P * half), seed + 1), sn = randn(static_cast<size_t>(P * half), seed + 2);
  std::vector<int32_t> pos;
  for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t((t * 11) % P));
  const auto slots = rope_slots(T, n_blocks * bs, 3, seed + 3);
  PagedAttnMeta gm;
  gm.block_size = int(bs);
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  Tensor gqkv = dev(qkv, dt, {T, W});
  compare_cache_runs(nm, dt, n_blocks, bs, Hkv, D, slots, seed + 4, [&](Tensor& kc, Tensor& vc) {
    Tensor gq = poisoned(dt, {T, Hq, D});
    cuda::rope_qkv_cache_write(gpu_ctx(), gq, gqkv, gp, gc, gs, kc, vc, gm);
    return CacheRun{fetch(gq), {}};
  });
}

void run_qk_norm(DType dt, const WriteCase& c, uint32_t seed) {
  const int64_t T = 23, P = 100, half = c.D / 2, n_blocks = 4, bs = 16, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  const int64_t W = (Hq + 2 * Hkv) * D;
  const std::string nm = shape_tag("qk_norm_rope_cache_write fp8", dt, Hq, Hkv, D);
  auto qkv = mixed(static_cast<size_t>(T * W), seed, dt);
  auto wq = rounded(randn(static_cast<size_t>(D), seed + 1, 4.f), dt), wk = rounded(randn(static_cast<size_t>(D), seed + 2, 4.f), dt);
  auto cs = randn(static_cast<size_t>(P * half), seed + 3), sn = randn(static_cast<size_t>(P * half), seed + 4);
  std::vector<int32_t> pos;
  for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t((t * 13) % P));
  const auto slots = rope_slots(T, n_blocks * bs, 7, seed + 5);
  PagedAttnMeta gm;
  gm.block_size = int(bs);
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  Tensor gqkv = dev(qkv, dt, {T, W}), gwq = dev(wq, dt, {D}), gwk = dev(wk, dt, {D});
  compare_cache_runs(nm, dt, n_blocks, bs, Hkv, D, slots, seed + 6, [&](Tensor& kc, Tensor& vc) {
    Tensor gq = poisoned(dt, {T, Hq, D});
    cuda::qk_norm_rope_cache_write(gpu_ctx(), gq, gqkv, gwq, gwk, 1e-6f, gp, gc, gs, kc, vc, gm);
    return CacheRun{fetch(gq), {}};
  });
}

}  // namespace

TEST(CudaFp8Kv, ConversionMatchesPyTorch) {
  GRPO_SKIP_WITHOUT_CUDA();
  GRPO_REQUIRE_FIXTURE(fx);
  const auto& bits = (*fx)["convert"]["f32_bits"];
  const auto& want_j = (*fx)["convert"]["e4m3"];
  ASSERT_EQ(bits.size(), want_j.size());
  std::vector<float> x;
  std::vector<uint8_t> want;
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = bits[i].get<uint32_t>();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
    want.push_back(want_j[i].get<uint8_t>());
  }
  // As k rows of (T, 1, D) tokens in slots 0..T-1, v = k: D = 16 takes the 16-byte vector
  // kernel, D = 2 the scalar one.
  for (int64_t D : {int64_t(16), int64_t(2)}) {
    const int64_t T = (int64_t(x.size()) + D - 1) / D, n = T * D;
    std::vector<float> k(x);
    k.resize(static_cast<size_t>(n), 0.f);
    std::vector<int32_t> slots(static_cast<size_t>(T));
    std::iota(slots.begin(), slots.end(), 0);
    PagedAttnMeta m;
    m.block_size = 16;
    m.slot_mapping = dev_int(slots, DType::i32, {T});
    const int64_t n_blocks = (T + 15) / 16;
    Tensor kc = dev_fp8(std::vector<uint8_t>(static_cast<size_t>(n_blocks * 16 * D), 0), {n_blocks, 16, 1, D});
    Tensor vc = dev_fp8(std::vector<uint8_t>(static_cast<size_t>(n_blocks * 16 * D), 0), {n_blocks, 16, 1, D});
    Tensor gk = dev(k, DType::f32, {T, 1, D});
    cuda::kv_cache_write(gpu_ctx(), kc, vc, gk, gk, m);
    auto got = fetch_fp8(kc);
    got.resize(want.size());
    EXPECT_TRUE(same_bytes("kv_cache_write f32 -> e4m3 vs PyTorch, D=" + std::to_string(D), got, want));
    EXPECT_TRUE(same_bytes("host f32_to_f8e4m3 vs PyTorch", to_e4m3(x), want));
  }
}

TEST(CudaFp8Kv, KvCacheWriteBitwise) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 9100;
  for (DType dt : kDTypes) {
    run_kv_write(dt, 2, 64, seed += 10);   // Qwen2.5-0.5B rows: vector kernel
    run_kv_write(dt, 8, 128, seed += 10);  // Qwen3-0.6B rows
    run_kv_write(dt, 3, 20, seed += 10);   // row of 60: scalar kernel
  }
}

TEST(CudaFp8Kv, RopeQkCacheWriteBitwise) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 9300;
  for (DType dt : kDTypes)
    for (const WriteCase& c : {WriteCase{14, 2, 64}, WriteCase{16, 8, 128}, WriteCase{6, 3, 20}})  // last: unfused
      run_rope_qk(dt, c, seed += 10);
}

TEST(CudaFp8Kv, RopeQkvCacheWriteBitwise) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 9500;
  for (DType dt : kDTypes)
    for (const WriteCase& c : {WriteCase{14, 2, 64}, WriteCase{16, 8, 128}, WriteCase{6, 3, 20}})  // last: unfused
      run_rope_qkv(dt, c, seed += 10);
}

TEST(CudaFp8Kv, QkNormRopeCacheWriteBitwise) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 9700;
  for (DType dt : kDTypes)
    for (const WriteCase& c : {WriteCase{16, 8, 128}, WriteCase{14, 2, 64}, WriteCase{6, 3, 32}})  // last: unfused
      run_qk_norm(dt, c, seed += 10);
}

// The fixture's sequences of each head shape in one batch on shuffled blocks: every position of
// every sequence as a query row (no tile list), the last position of each as a decode row, and
// (bf16) the prefill rows with a tile list, against PyTorch's float64 attention over the E4M3
// K/V. Decode rows equal the prefill rows of the same tokens bit for bit.
TEST(CudaFp8Kv, PagedMatchesFixture) {
  GRPO_SKIP_WITHOUT_CUDA();
  GRPO_REQUIRE_FIXTURE(fx);
  uint32_t seed = 9900;
  for (const json& c : (*fx)["attention"]) {
    const int64_t Hq = c["Hq"].get<int64_t>(), Hkv = c["Hkv"].get<int64_t>(), D = c["D"].get<int64_t>(), HD = Hq * D;
    std::vector<int32_t> lens;
    for (const json& s : c["seqs"]) lens.push_back(s["len"].get<int32_t>());
    Batch b = make_batch(lens, seed++);
    // Rows of every position, sequence by sequence; the fixture's values are integers / 16.
    std::vector<float> q, k, v, want;
    Queries pre, dec;
    std::vector<int64_t> listed, last;  // rows of `pre` with a fixture output; decode rows in `pre`
    for (int64_t s = 0; s < b.S; ++s) {
      const json& sq = c["seqs"][static_cast<size_t>(s)];
      for (const json& x : sq["q"]) q.push_back(x.get<float>() / 16.f);
      for (const json& x : sq["k"]) k.push_back(x.get<float>() / 16.f);
      for (const json& x : sq["v"]) v.push_back(x.get<float>() / 16.f);
      for (const json& x : sq["out"]) want.push_back(x.get<float>());
      const int64_t row0 = pre.n();
      for (int32_t p = 0; p < lens[static_cast<size_t>(s)]; ++p) {
        pre.seq.push_back(int32_t(s));
        pre.pos.push_back(p);
      }
      for (const json& p : sq["positions"]) listed.push_back(row0 + p.get<int64_t>());
      dec.seq.push_back(int32_t(s));
      dec.pos.push_back(lens[static_cast<size_t>(s)] - 1);
      last.push_back(row0 + lens[static_cast<size_t>(s)] - 1);
    }
    ASSERT_EQ(int64_t(want.size()), int64_t(listed.size()) * HD);
    const std::vector<float> want_dec = [&] {  // the last listed position of each sequence is len − 1
      std::vector<int64_t> idx;
      for (size_t i = 0; i < listed.size(); ++i)
        if (std::find(last.begin(), last.end(), listed[i]) != last.end()) idx.push_back(int64_t(i));
      return pick_rows(want, idx, HD);
    }();
    const int max_ctx = *std::max_element(lens.begin(), lens.end());
    std::vector<float> f32_pre;
    for (DType dt : kDTypes) {
      const std::string nm = shape_tag("attention_paged fp8 fixture", dt, Hq, Hkv, D);
      auto [kc, vc] = fill_fp8_cache(b, k, v, dt, Hkv, D, seed++);
      // The cache holds PyTorch's E4M3 of the rows (f32_to_f8e4m3 is checked against it above).
      {
        const auto kb = fetch_fp8(kc), vb = fetch_fp8(vc);
        const auto k8 = to_e4m3(k), v8 = to_e4m3(v);
        std::vector<uint8_t> gk8, gv8;
        for (int64_t t = 0; t < pre.n(); ++t) {
          const int64_t off = (int64_t(b.slot(pre.seq[static_cast<size_t>(t)], pre.pos[static_cast<size_t>(t)])) * Hkv) * D;
          gk8.insert(gk8.end(), kb.begin() + off, kb.begin() + off + Hkv * D);
          gv8.insert(gv8.end(), vb.begin() + off, vb.begin() + off + Hkv * D);
        }
        EXPECT_TRUE(same_bytes(nm + " k cache rows", gk8, k8));
        EXPECT_TRUE(same_bytes(nm + " v cache rows", gv8, v8));
      }
      Tensor gq = dev(q, dt, {pre.n(), Hq, D}), go = poisoned(dt, {pre.n(), Hq, D});
      PagedAttnMeta pm = dev_meta(b, pre, max_ctx);
      cuda::attention_paged(gpu_ctx(), go, gq, kc, vc, pm);
      const auto got_pre = fetch(go);
      EXPECT_TRUE(close(nm + " prefill rows vs PyTorch", pick_rows(got_pre, listed, HD), want, tol_fp8_attn(dt)));

      std::vector<float> dq = pick_rows(q, last, HD);
      Tensor gdq = dev(dq, dt, {dec.n(), Hq, D}), gdo = poisoned(dt, {dec.n(), Hq, D});
      PagedAttnMeta dm = dev_meta(b, dec, max_ctx);
      cuda::attention_paged(gpu_ctx(), gdo, gdq, kc, vc, dm);
      const auto got_dec = fetch(gdo);
      EXPECT_TRUE(close(nm + " decode rows vs PyTorch", got_dec, want_dec, tol_fp8_attn(dt)));
      EXPECT_TRUE(close(nm + " decode rows == prefill rows, bitwise", got_dec, pick_rows(got_pre, last, HD), Tol{0, 0}));

      // With a tile list (tiles of <= 64 rows of one sequence): the tensor-core prefill kernel
      // where it takes FP8 caches, else the per-token kernels: the same attention to tolerance.
      std::vector<int32_t> tiles;
      for (int64_t s = 0, row0 = 0; s < b.S; row0 += lens[static_cast<size_t>(s)], ++s)
        for (int32_t p0 = 0; p0 < lens[static_cast<size_t>(s)]; p0 += 64)
          tiles.insert(tiles.end(), {int32_t(row0 + p0), std::min(64, lens[static_cast<size_t>(s)] - p0), int32_t(s), p0});
      PagedAttnMeta tm = pm;
      tm.n_prefill_tiles = int(tiles.size() / 4);
      tm.prefill_tiles = dev_int(tiles, DType::i32, {int64_t(tm.n_prefill_tiles), 4});
      Tensor gto = poisoned(dt, {pre.n(), Hq, D});
      cuda::attention_paged(gpu_ctx(), gto, gq, kc, vc, tm);
      EXPECT_TRUE(close(nm + " prefill rows with a tile list vs PyTorch", pick_rows(fetch(gto), listed, HD), want,
                        tol_fp8_attn(dt)));

      if (dt == DType::f32) {
        f32_pre = got_pre;
      } else if (cuda_core_only(Hq, Hkv, D)) {
        EXPECT_TRUE(close(nm + " bf16 rows == f32 rows rounded to bf16, bitwise", got_pre, bf16_rounded(f32_pre), Tol{0, 0}));
      }
    }
  }
}

// Decode batches with contexts from 1 to 2100 keys (partition edges of 128, several blocks of
// partitions per token, the combine), and prefill-style rows (the last five positions of each
// sequence, no tile list): against a float64 reference over the cache's exact values, the CPU
// backend's FP8 path and the same kernels over a cache of the model dtype holding those values;
// rows bitwise independent of max_context and of the rest of the batch.
TEST(CudaFp8Kv, PagedLongContextsAndBatchInvariance) {
  GRPO_SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t Hq, Hkv, D;
  };
  // Qwen3-0.6B (G = 2: the CUDA-core kernel with two heads per block), Qwen2.5-0.5B (G = 7),
  // and head dims 96 and 16 (CUDA-core kernel only).
  const Shape shapes[] = {{16, 8, 128}, {14, 2, 64}, {6, 2, 96}, {4, 1, 16}};
  const std::vector<int32_t> lens = {1, 2, 127, 128, 129, 255, 256, 257, 700, 1025, 1500, 2100};
  uint32_t seed = 10100;
  for (const Shape& sh : shapes) {
    const int64_t Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, HD = Hq * D;
    Batch b = make_batch(lens, seed++);
    int64_t n_rows = 0;
    for (int32_t l : lens) n_rows += l;
    const auto k = randn(static_cast<size_t>(n_rows * Hkv * D), seed++, 1.5f);
    const auto v = randn(static_cast<size_t>(n_rows * Hkv * D), seed++);
    Queries dec, pre;
    std::vector<int64_t> pre_last;  // the decode row of each sequence among the prefill-style rows
    for (int64_t s = 0; s < b.S; ++s) {
      const int32_t L = lens[static_cast<size_t>(s)];
      dec.seq.push_back(int32_t(s));
      dec.pos.push_back(L - 1);
      for (int32_t p = std::max(0, L - 5); p < L; ++p) {
        pre.seq.push_back(int32_t(s));
        pre.pos.push_back(p);
      }
      pre_last.push_back(pre.n() - 1);
    }
    const int max_ctx = 2100;
    for (DType dt : kDTypes) {
      const std::string nm = shape_tag("attention_paged fp8 long", dt, Hq, Hkv, D);
      auto [kc, vc] = fill_fp8_cache(b, rounded(k, dt), rounded(v, dt), dt, Hkv, D, seed++);
      const auto kb = fetch_fp8(kc), vb = fetch_fp8(vc);
      const auto kf = from_e4m3(kb), vf = from_e4m3(vb);
      const auto q = rounded(randn(static_cast<size_t>(dec.n() * HD), seed++), dt);
      const auto pq = rounded(randn(static_cast<size_t>(pre.n() * HD), seed++), dt);

      // Decode rows.
      Tensor gq = dev(q, dt, {dec.n(), Hq, D}), go = poisoned(dt, {dec.n(), Hq, D});
      cuda::attention_paged(gpu_ctx(), go, gq, kc, vc, dev_meta(b, dec, max_ctx));
      const auto got = fetch(go);
      const auto ref = reference(b, dec, q, kf, vf, Hq, Hkv, D);
      EXPECT_TRUE(close(nm + " decode vs float64 reference", got, ref, tol_reduce(dt)));

      // The CPU backend over the same FP8 bytes.
      {
        std::vector<uint8_t> hk = kb, hv = vb;
        std::vector<float> hq = q, hout(q.size());
        Tensor hkc = tensor_borrow(hk.data(), DType::f8e4m3, Device::cpu, {b.n_blocks, b.bs, Hkv, D});
        Tensor hvc = tensor_borrow(hv.data(), DType::f8e4m3, Device::cpu, {b.n_blocks, b.bs, Hkv, D});
        Tensor tq = host(hq, {dec.n(), Hq, D}), to = host(hout, {dec.n(), Hq, D});
        cpu::attention_paged(cpu_ctx(), to, tq, hkc, hvc, host_meta(b, dec, max_ctx));
        EXPECT_TRUE(close(nm + " decode vs CPU fp8", got, hout, tol_reduce(dt)));
      }

      // The same attention over caches of the model dtype holding the E4M3 values (exact).
      {
        const std::vector<int64_t> cshape = {b.n_blocks, b.bs, Hkv, D};
        Tensor wk = dev(kf, dt, cshape), wv = dev(vf, dt, cshape), wo = poisoned(dt, {dec.n(), Hq, D});
        cuda::attention_paged(gpu_ctx(), wo, gq, wk, wv, dev_meta(b, dec, max_ctx));
        EXPECT_TRUE(close(nm + " decode vs a " + dtype_name(dt) + " cache of the same values", got, fetch(wo),
                          tol_reduce(dt)));
      }

      // Batch invariance: a wider max_context (CUDA-graph replays), every third sequence alone in
      // reverse order, the longest sequence alone: the same rows bit for bit.
      Tensor go2 = poisoned(dt, {dec.n(), Hq, D});
      cuda::attention_paged(gpu_ctx(), go2, gq, kc, vc, dev_meta(b, dec, 4096));
      EXPECT_TRUE(close(nm + " decode, max_context 4096, bitwise", fetch(go2), got, Tol{0, 0}));
      for (int64_t stride : {int64_t(3), int64_t(100)}) {
        Queries sub;
        std::vector<int64_t> idx;
        for (int64_t s = b.S - 1; s >= 0; s -= stride) {
          sub.seq.push_back(dec.seq[static_cast<size_t>(s)]);
          sub.pos.push_back(dec.pos[static_cast<size_t>(s)]);
          idx.push_back(s);
        }
        const int sub_ctx = *std::max_element(sub.pos.begin(), sub.pos.end()) + 1;
        Tensor sq = dev(pick_rows(q, idx, HD), dt, {sub.n(), Hq, D}), so = poisoned(dt, {sub.n(), Hq, D});
        cuda::attention_paged(gpu_ctx(), so, sq, kc, vc, dev_meta(b, sub, sub_ctx));
        EXPECT_TRUE(close(nm + " decode, " + std::to_string(sub.n()) + " of the sequences alone, bitwise", fetch(so),
                          pick_rows(got, idx, HD), Tol{0, 0}));
      }
      // An underestimated max_context: the last partition takes the rest; equal to tolerance.
      Tensor go3 = poisoned(dt, {dec.n(), Hq, D});
      cuda::attention_paged(gpu_ctx(), go3, gq, kc, vc, dev_meta(b, dec, 200));
      EXPECT_TRUE(close(nm + " decode, max_context 200", fetch(go3), ref, tol_reduce(dt)));

      // Prefill-style rows: several query tokens per sequence in one call; the last one of each
      // sequence with the decode query equals the decode row bit for bit.
      std::vector<float> pq2 = pq;
      for (int64_t s = 0; s < b.S; ++s)
        std::copy(q.begin() + s * HD, q.begin() + (s + 1) * HD, pq2.begin() + pre_last[static_cast<size_t>(s)] * HD);
      Tensor gpq = dev(pq2, dt, {pre.n(), Hq, D}), gpo = poisoned(dt, {pre.n(), Hq, D});
      cuda::attention_paged(gpu_ctx(), gpo, gpq, kc, vc, dev_meta(b, pre, max_ctx));
      const auto got_pre = fetch(gpo);
      EXPECT_TRUE(close(nm + " prefill-style rows vs float64 reference", got_pre,
                        reference(b, pre, pq2, kf, vf, Hq, Hkv, D), tol_reduce(dt)));
      EXPECT_TRUE(close(nm + " prefill-style last rows == decode rows, bitwise", pick_rows(got_pre, pre_last, HD), got,
                        Tol{0, 0}));

      if (dt == DType::bf16 && cuda_core_only(Hq, Hkv, D)) {
        // f32 queries holding the same (bf16) values over these caches: the same rows, rounded.
        Tensor fq = dev(q, DType::f32, {dec.n(), Hq, D}), fo = poisoned(DType::f32, {dec.n(), Hq, D});
        cuda::attention_paged(gpu_ctx(), fo, fq, kc, vc, dev_meta(b, dec, max_ctx));
        EXPECT_TRUE(close(nm + " bf16 rows == f32 rows rounded to bf16, bitwise", got, bf16_rounded(fetch(fo)), Tol{0, 0}));
      }
    }
  }
}

// FP8 caches need head dims that are multiples of 16 (16-byte rows of E4M3).
TEST(CudaFp8KvDeathTest, HeadDimNotMultipleOf16) {
  GRPO_SKIP_WITHOUT_CUDA();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int64_t Hq = 2, Hkv = 1, D = 8;
  Batch b = make_batch({4}, 1);
  Queries dec;
  dec.seq = {0};
  dec.pos = {3};
  Tensor kc = dev_fp8(std::vector<uint8_t>(static_cast<size_t>(b.n_blocks * b.bs * Hkv * D), 0x38),
                      {b.n_blocks, b.bs, Hkv, D});
  Tensor q = dev(std::vector<float>(static_cast<size_t>(Hq * D), 1.f), DType::f32, {1, Hq, D});
  Tensor out = poisoned(DType::f32, {1, Hq, D});
  PagedAttnMeta m = dev_meta(b, dec, 4);
  EXPECT_DEATH(cuda::attention_paged(gpu_ctx(), out, q, kc, kc, m), "multiple of 16");
}

#else
TEST(CudaFp8Kv, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
