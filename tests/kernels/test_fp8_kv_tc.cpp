// FP8 (E4M3) KV cache in the tensor-core paged attention kernels: the prefill kernel over
// 64-row query tiles (attention_prefill_tc.cu) and the per-token decode kernel for GQA groups of
// 4..16 (attention_decode.cu), both reached through cuda::attention_paged with bf16 q/out and
// f8e4m3 caches. Widening E4M3 to bf16 is exact and both kernels feed the widened values to
// the same mma code as with bf16 caches, so the output over an FP8 cache must equal, bit for
// bit, the output over a bf16 cache that holds the widened values. Also checked: the CPU
// reference on those values (f32, to bf16 tolerance) and the PyTorch fixture
// (tests/fixtures/fp8/fp8_reference.json, written by tools/ref/make_fp8_fixtures.py).
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "kernels/attention.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

// E4M3 bytes of a cache and their values. Tame: N(0, 1) draws rounded to E4M3 (subnormals
// included: |x| < 2^-6). Wild: one element in eight is instead a random non-NaN byte (the
// whole range: subnormals, ±0, up to ±448).
struct Fp8Values {
  std::vector<uint8_t> bytes;
  std::vector<float> vals;
};

Fp8Values fp8_values(size_t n, uint32_t seed, bool wild) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Fp8Values f;
  f.bytes.resize(n);
  f.vals.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint8_t b = f32_to_f8e4m3(nd(rng));
    if (wild && rng() % 8 == 0) {
      do {
        b = uint8_t(rng() & 0xffu);
      } while ((b & 0x7fu) == 0x7fu);  // 0x7f / 0xff: NaN
    }
    f.bytes[i] = b;
    f.vals[i] = f8e4m3_to_f32(b);
  }
  return f;
}

// The raw bf16 bits of a device tensor.
std::vector<uint16_t> fetch_bits(const Tensor& t) { return fetch_raw<uint16_t>(t); }

::testing::AssertionResult same_bits(const std::string& name, const Tensor& got, const Tensor& ref) {
  const auto g = fetch_bits(got), r = fetch_bits(ref);
  if (g.size() != r.size()) return ::testing::AssertionFailure() << name << ": sizes " << g.size() << " != " << r.size();
  int64_t n_bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != r[i]) {
      if (first < 0) first = int64_t(i);
      ++n_bad;
    }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  const size_t f = static_cast<size_t>(first);
  return ::testing::AssertionFailure() << name << ": " << n_bad << " of " << g.size()
                                       << " bf16 outputs differ; first at " << first << ": fp8 cache " << bf16_to_f32(g[f])
                                       << " (0x" << std::hex << g[f] << "), bf16 cache " << bf16_to_f32(r[f]) << " (0x"
                                       << r[f] << std::dec << ")";
}

// A paged batch: sequence s has query rows at positions pos0 .. pos0 + n - 1 and its cache
// holds positions 0 .. pos0 + n - 1 (a cached prefix, then this step's rows). Physical blocks
// are shuffled (two spare blocks stay unused, so their slots hold values nobody may read) and
// block-table entries past a sequence's blocks are -1.
struct SeqRun {
  int32_t pos0, n;
};

struct Batch {
  int32_t bs = 16;
  int64_t S = 0, T = 0, n_blocks = 0, max_blocks = 0;
  int max_context = 0;
  std::vector<int32_t> table, tseq, tpos;
  std::vector<int32_t> tiles, alt_tiles;  // (row0, n_rows, seq, pos0) ×n, shuffled
};

Batch make_batch(const std::vector<SeqRun>& runs, int32_t bs, uint32_t seed) {
  Batch b;
  b.bs = bs;
  b.S = int64_t(runs.size());
  b.n_blocks = 2;
  for (const SeqRun& r : runs) {
    const int64_t nb = (r.pos0 + r.n + bs - 1) / bs;
    b.max_blocks = std::max(b.max_blocks, nb);
    b.n_blocks += nb;
    b.T += r.n;
    b.max_context = std::max(b.max_context, int(r.pos0 + r.n));
  }
  b.max_blocks += 2;  // trailing -1 entries
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(b.n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.table.assign(static_cast<size_t>(b.S * b.max_blocks), -1);
  int64_t next = 0;
  for (int64_t s = 0; s < b.S; ++s) {
    const SeqRun& r = runs[static_cast<size_t>(s)];
    for (int64_t k = 0; k < (r.pos0 + r.n + bs - 1) / bs; ++k)
      b.table[static_cast<size_t>(s * b.max_blocks + k)] = perm[static_cast<size_t>(next++)];
    for (int32_t i = 0; i < r.n; ++i) {
      b.tseq.push_back(int32_t(s));
      b.tpos.push_back(r.pos0 + i);
    }
  }
  auto make_tiles = [&](auto cut) { return shuffled_prefill_tiles(runs, b.S, cut, rng); };
  b.tiles = make_tiles([](int) { return 64; });  // the model runner's tiling
  const int32_t alt_cuts[] = {17, 64, 1, 40, 33, 64};
  b.alt_tiles = make_tiles([&](int k) { return alt_cuts[k % 6]; });
  return b;
}

PagedAttnMeta host_meta(Batch& b) {
  PagedAttnMeta m;
  m.block_size = b.bs;
  m.max_context = b.max_context;
  m.token_seq = host_i32(b.tseq, {b.T});
  m.token_pos = host_i32(b.tpos, {b.T});
  m.block_table = host_i32(b.table, {b.S, b.max_blocks});
  return m;
}

// Device metadata; with a tile list when tiles is not null.
PagedAttnMeta dev_meta(const Batch& b, const std::vector<int32_t>* tiles) {
  PagedAttnMeta m;
  m.block_size = b.bs;
  m.max_context = b.max_context;
  m.token_seq = dev_int(b.tseq, DType::i32, {b.T});
  m.token_pos = dev_int(b.tpos, DType::i32, {b.T});
  m.block_table = dev_int(b.table, DType::i32, {b.S, b.max_blocks});
  if (tiles) {
    m.n_prefill_tiles = int(tiles->size() / 4);
    m.prefill_tiles = dev_int(*tiles, DType::i32, {int64_t(m.n_prefill_tiles), 4});
  }
  return m;
}

struct Shape {
  int64_t Hq, Hkv, D;
  int32_t bs;
};

std::string shape_name(const Shape& sh, bool wild) {
  return "[Hq=" + std::to_string(sh.Hq) + " Hkv=" + std::to_string(sh.Hkv) + " G=" + std::to_string(sh.Hq / sh.Hkv) +
         " D=" + std::to_string(sh.D) + " bs=" + std::to_string(sh.bs) + (wild ? " wild" : " tame") + "]";
}

// Runs `b` over an FP8 cache and over the widened bf16 cache with the same metadata (with the
// tile lists of `tile_lists`, or none when it is empty): bitwise equal outputs; with tame
// values also the CPU reference (f32 over the widened values) to bf16 tolerance.
void check_fp8_vs_bf16(Batch& b, const Shape& sh, bool wild, uint32_t& seed,
                       const std::vector<const std::vector<int32_t>*>& tile_lists, const std::string& what) {
  const int64_t Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, T = b.T;
  const std::string nm = what + " " + shape_name(sh, wild);
  const std::vector<int64_t> cshape = {b.n_blocks, b.bs, Hkv, D};
  const size_t n_cache = static_cast<size_t>(b.n_blocks * b.bs * Hkv * D);
  auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), DType::bf16);
  Fp8Values k = fp8_values(n_cache, seed++, wild), v = fp8_values(n_cache, seed++, wild);

  Tensor gq = dev(q, DType::bf16, {T, Hq, D});
  Tensor gk8 = dev_fp8(k.bytes, cshape), gv8 = dev_fp8(v.bytes, cshape);
  Tensor gk16 = dev(k.vals, DType::bf16, cshape), gv16 = dev(v.vals, DType::bf16, cshape);  // exact

  std::vector<float> ref;
  if (!wild) {
    ref.resize(q.size());
    PagedAttnMeta hm = host_meta(b);
    Tensor hq = host(q, {T, Hq, D}), ho = host(ref, {T, Hq, D});
    Tensor hk = host(k.vals, cshape), hv = host(v.vals, cshape);
    cpu::attention_paged(cpu_ctx(), ho, hq, hk, hv, hm);
  }
  std::vector<const std::vector<int32_t>*> lists = tile_lists;
  if (lists.empty()) lists.push_back(nullptr);
  std::vector<uint16_t> first;
  for (size_t li = 0; li < lists.size(); ++li) {
    const std::string ln = nm + (lists[li] ? " tiling " + std::to_string(li) : std::string(" no tiles"));
    PagedAttnMeta gm = dev_meta(b, lists[li]);
    Tensor o8 = poisoned(DType::bf16, {T, Hq, D}), o16 = poisoned(DType::bf16, {T, Hq, D});
    cuda::attention_paged(gpu_ctx(), o8, gq, gk8, gv8, gm);
    cuda::attention_paged(gpu_ctx(), o16, gq, gk16, gv16, gm);
    EXPECT_TRUE(same_bits("fp8 cache vs widened bf16 cache, bitwise " + ln, o8, o16));
    if (!wild) {
      EXPECT_TRUE(close("fp8 cache vs cpu " + ln, fetch(o8), ref, tol_reduce(DType::bf16)));
    }
    // Another tiling of the same rows: the same outputs bit for bit (key tiles start at
    // position 0 whichever query tile holds a row).
    const auto bits = fetch_bits(o8);
    if (li == 0) {
      first = bits;
    } else {
      EXPECT_TRUE(bits == first) << "fp8 cache, tiling " << li << " vs tiling 0 differ " << ln;
    }
  }
}

}  // namespace

// Prefill steps through the tensor-core tile kernel: whole prompts, tile edges, chunked
// prefill after a cached prefix (query and key tiles straddle), a prefix ending on a key-tile
// boundary, a decode-like row and a one-token prompt in the same step; GQA groups 2, 4, 7;
// head dims 64 and 128; block sizes 16 and 32; the runner's 64-row tiling and an irregular one.
TEST(CudaFp8KvTc, PagedPrefillBitwiseVsWidenedBf16) {
  GRPO_SKIP_WITHOUT_CUDA();
  const std::vector<SeqRun> runs = {{0, 150}, {0, 63}, {0, 64}, {0, 65}, {37, 65}, {128, 64}, {300, 1}, {0, 1}, {70, 150}};
  const Shape shapes[] = {
      {14, 2, 64, 16},   // Qwen2.5-0.5B: G = 7
      {8, 2, 128, 16},   // G = 4, D = 128
      {4, 2, 64, 16},    // G = 2
      {16, 8, 128, 16},  // Qwen3-0.6B: G = 2, D = 128
      {28, 4, 128, 32},  // G = 7, D = 128, block size 32
      {16, 4, 64, 32},   // G = 4, block size 32
  };
  uint32_t seed = 51000;
  for (const Shape& sh : shapes) {
    Batch b = make_batch(runs, sh.bs, seed++);
    for (bool wild : {false, true})
      check_fp8_vs_bf16(b, sh, wild, seed, {&b.tiles, &b.alt_tiles}, "paged prefill tc");
  }
}

// Decode rows through the tensor-core decode kernel (no tile list): one token per sequence at
// contexts from 1 to 2100 (partition edges at 256, contexts of up to 9 partitions, so the
// partition partials and their combine are exercised), plus a sequence with three consecutive
// rows; GQA groups 4, 7, 8, 16 with head dims 64 and 128.
TEST(CudaFp8KvTc, PagedDecodeBitwiseVsWidenedBf16) {
  GRPO_SKIP_WITHOUT_CUDA();
  std::vector<SeqRun> runs;
  for (int32_t c : {1, 17, 64, 65, 255, 256, 257, 511, 700, 1030, 2100}) runs.push_back({c - 1, 1});
  runs.push_back({510, 3});
  const Shape shapes[] = {
      {8, 2, 64, 16},    // G = 4
      {14, 2, 64, 16},   // Qwen2.5-0.5B: G = 7
      {16, 2, 128, 16},  // G = 8, D = 128
      {16, 1, 64, 32},   // G = 16, block size 32
      {32, 2, 128, 16},  // G = 16, D = 128
      {28, 4, 128, 16},  // G = 7, D = 128
  };
  uint32_t seed = 52000;
  for (const Shape& sh : shapes) {
    Batch b = make_batch(runs, sh.bs, seed++);
    for (bool wild : {false, true}) check_fp8_vs_bf16(b, sh, wild, seed, {}, "paged decode tc");
  }
}

// The PyTorch fixture: causal attention over keys and values stored as E4M3 (float64
// reference). Every position of each sequence is a query row of one prefill step (the tile
// kernel), then the fixture's listed positions are decode rows (the decode kernel for G = 4;
// the G = 2 case takes the CUDA-core kernel). Both against the fixture to bf16 tolerance, and
// the tensor-core runs against the widened bf16 cache bit for bit.
TEST(CudaFp8KvTc, FixtureAttention) {
  GRPO_SKIP_WITHOUT_CUDA();
  const std::string path = std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/fp8/fp8_reference.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing " << path << ": run python3 tools/ref/make_fp8_fixtures.py --out tests/fixtures/fp8";
  const nlohmann::json fx = nlohmann::json::parse(in);
  ASSERT_EQ(fx.at("format").get<std::string>(), "grpo-fp8-fixture");
  ASSERT_FALSE(fx.at("attention").empty());
  uint32_t seed = 53000;
  for (const auto& c : fx.at("attention")) {
    const int64_t Hq = c.at("Hq").get<int64_t>(), Hkv = c.at("Hkv").get<int64_t>(), D = c.at("D").get<int64_t>();
    const auto& seqs = c.at("seqs");
    const int32_t bs = 16;
    const std::string nm = "[fixture Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
    std::vector<SeqRun> prefill_runs;
    for (const auto& s : seqs) prefill_runs.push_back({0, s.at("len").get<int32_t>()});
    Batch pb = make_batch(prefill_runs, bs, seed++);

    // Cache contents: the fixture's k/v (value = int / 16) as E4M3, at each position's slot.
    const std::vector<int64_t> cshape = {pb.n_blocks, bs, Hkv, D};
    const size_t n_cache = static_cast<size_t>(pb.n_blocks * bs * Hkv * D);
    std::vector<uint8_t> k8(n_cache, 0), v8(n_cache, 0);
    std::vector<float> qrows;  // prefill q rows, sequence after sequence
    std::vector<float> dq, dref;  // decode rows at the listed positions and their reference
    std::vector<int32_t> dseq, dpos;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto& sq = seqs[s];
      const int64_t L = sq.at("len").get<int64_t>();
      const auto qi = sq.at("q").get<std::vector<int>>(), ki = sq.at("k").get<std::vector<int>>(),
                 vi = sq.at("v").get<std::vector<int>>();
      const auto pos = sq.at("positions").get<std::vector<int32_t>>();
      const auto out = sq.at("out").get<std::vector<float>>();
      ASSERT_EQ(int64_t(qi.size()), L * Hq * D);
      ASSERT_EQ(int64_t(ki.size()), L * Hkv * D);
      ASSERT_EQ(out.size(), pos.size() * static_cast<size_t>(Hq * D));
      for (int64_t p = 0; p < L; ++p) {
        const int64_t slot = int64_t(pb.table[static_cast<size_t>(int64_t(s) * pb.max_blocks + p / bs)]) * bs + p % bs;
        for (int64_t e = 0; e < Hkv * D; ++e) {
          k8[static_cast<size_t>(slot * Hkv * D + e)] = f32_to_f8e4m3(float(ki[static_cast<size_t>(p * Hkv * D + e)]) / 16.f);
          v8[static_cast<size_t>(slot * Hkv * D + e)] = f32_to_f8e4m3(float(vi[static_cast<size_t>(p * Hkv * D + e)]) / 16.f);
        }
      }
      for (int x : qi) qrows.push_back(float(x) / 16.f);  // exact in bf16
      for (size_t j = 0; j < pos.size(); ++j) {
        dseq.push_back(int32_t(s));
        dpos.push_back(pos[j]);
        for (int64_t e = 0; e < Hq * D; ++e) dq.push_back(float(qi[static_cast<size_t>(pos[j] * Hq * D + e)]) / 16.f);
      }
      dref.insert(dref.end(), out.begin(), out.end());
    }
    std::vector<float> k16(n_cache), v16(n_cache);
    for (size_t i = 0; i < n_cache; ++i) {
      k16[i] = f8e4m3_to_f32(k8[i]);
      v16[i] = f8e4m3_to_f32(v8[i]);
    }
    Tensor gk8 = dev_fp8(k8, cshape), gv8 = dev_fp8(v8, cshape);
    Tensor gk16 = dev(k16, DType::bf16, cshape), gv16 = dev(v16, DType::bf16, cshape);

    // Prefill: all rows of every sequence, the runner's tiling.
    {
      PagedAttnMeta gm = dev_meta(pb, &pb.tiles);
      Tensor gq = dev(qrows, DType::bf16, {pb.T, Hq, D});
      Tensor o8 = poisoned(DType::bf16, {pb.T, Hq, D}), o16 = poisoned(DType::bf16, {pb.T, Hq, D});
      cuda::attention_paged(gpu_ctx(), o8, gq, gk8, gv8, gm);
      cuda::attention_paged(gpu_ctx(), o16, gq, gk16, gv16, gm);
      EXPECT_TRUE(same_bits("fixture prefill, fp8 vs widened bf16 cache " + nm, o8, o16));
      const auto got = fetch(o8);
      std::vector<float> sel;  // the listed positions' rows
      int64_t row0 = 0;
      for (const auto& sq : seqs) {
        for (int32_t p : sq.at("positions").get<std::vector<int32_t>>())
          sel.insert(sel.end(), got.begin() + (row0 + p) * Hq * D, got.begin() + (row0 + p + 1) * Hq * D);
        row0 += sq.at("len").get<int64_t>();
      }
      EXPECT_TRUE(close("fixture prefill tc vs torch " + nm, sel, dref, tol_reduce(DType::bf16)));
    }
    // Decode: the listed positions as single-token rows.
    {
      Batch db = pb;
      db.T = int64_t(dseq.size());
      db.tseq = dseq;
      db.tpos = dpos;
      PagedAttnMeta gm = dev_meta(db, nullptr);
      Tensor gq = dev(dq, DType::bf16, {db.T, Hq, D});
      Tensor o8 = poisoned(DType::bf16, {db.T, Hq, D}), o16 = poisoned(DType::bf16, {db.T, Hq, D});
      cuda::attention_paged(gpu_ctx(), o8, gq, gk8, gv8, gm);
      cuda::attention_paged(gpu_ctx(), o16, gq, gk16, gv16, gm);
      // Bitwise only where both runs take the tensor-core decode kernel (G >= 4); other groups
      // run the CUDA-core kernel, whose FP8 variant need not order its sums as the bf16 one.
      if (Hq / Hkv >= 4) {
        EXPECT_TRUE(same_bits("fixture decode, fp8 vs widened bf16 cache " + nm, o8, o16));
      }
      EXPECT_TRUE(close("fixture decode vs torch " + nm, fetch(o8), dref, tol_reduce(DType::bf16)));
    }
  }
}

#else
TEST(CudaFp8KvTc, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
