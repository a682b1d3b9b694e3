// The tensor-core attention kernels (attention_train_fwd_tc.cu, attention_train_bwd_tc.cu,
// attention_prefill_tc.cu: bf16, head dim 64/128) against the CPU reference.
// Training: packed batches whose 64-token tiles straddle sequences, one-token sequences,
// lengths on and off tile multiples, GQA groups of 1, 2 and 7.
// Engine prefill over the paged cache (attention_paged with a tile list): shuffled
// physical blocks, several sequences per batch, cached prefixes (pos0 > 0), runs on and
// off the 64-row tile, a decode-like row mixed in.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <algorithm>
#include <array>
#include <numeric>

#include "kernels/attention.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

struct TcCase {
  std::vector<int32_t> lens;
  int64_t Hq, Hkv, D;
};

}  // namespace

TEST(CudaAttentionTc, PackedForwardBackwardMatchCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const TcCase cases[] = {
      {{640, 640, 3, 200}, 14, 2, 64},   // Qwen2.5-0.5B heads, training lengths
      {{1, 64, 65, 127, 1, 300}, 4, 4, 64},  // G = 1, tile edges
      {{640, 129, 65}, 16, 8, 128},      // Qwen3-0.6B heads
      {{7, 1, 250}, 6, 3, 128},
  };
  uint32_t seed = 7000;
  for (const TcCase& c : cases) {
    AttnVarlen meta;
    meta.cu_seqlens.push_back(0);
    for (int32_t l : c.lens) meta.cu_seqlens.push_back(meta.cu_seqlens.back() + l);
    meta.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
    meta.cu_seqlens_dev = dev_int(meta.cu_seqlens, DType::i32, {int64_t(meta.cu_seqlens.size())});
    const int64_t T = meta.cu_seqlens.back(), Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    const DType dt = DType::bf16;
    std::string nm = "[Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                     " T=" + std::to_string(T) + "]";
    auto q = rounded(randn(size_t(T * Hq * D), seed++), dt), k = rounded(randn(size_t(T * Hkv * D), seed++), dt);
    auto v = rounded(randn(size_t(T * Hkv * D), seed++), dt), dout = rounded(randn(size_t(T * Hq * D), seed++), dt);
    std::vector<float> out(q.size()), lse(size_t(Hq * T)), dq(q.size()), dk(k.size()), dv(k.size());
    Tensor hq = host(q, {T, Hq, D}), hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D}), ho = host(out, {T, Hq, D}),
           hl = host(lse, {Hq, T}), hdo = host(dout, {T, Hq, D}), hdq = host(dq, {T, Hq, D}),
           hdk = host(dk, {T, Hkv, D}), hdv = host(dv, {T, Hkv, D});
    cpu::attention_forward(cpu_ctx(), ho, &hl, hq, hk, hv, meta);

    Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
    Tensor go = poisoned(dt, {T, Hq, D}), gl = poisoned(DType::f32, {Hq, T});
    cuda::attention_forward(gpu_ctx(), go, &gl, gq, gk, gv, meta);
    auto got_out = fetch(go);
    EXPECT_TRUE(close("tc forward out " + nm, got_out, out, tol_reduce(dt)));
    EXPECT_TRUE(close("tc forward lse " + nm, fetch(gl), lse, Tol{1e-4, 1e-4}));

    // Backward against the CPU backward run on the GPU's (bf16) forward output, so both
    // sides see the same Δ = dout·out.
    std::vector<float> out_b = got_out;
    Tensor hob = host(out_b, {T, Hq, D});
    cpu::attention_backward(cpu_ctx(), hdq, hdk, hdv, hdo, hq, hk, hv, hob, hl, meta);
    Tensor gdo = dev(dout, dt, {T, Hq, D});
    Tensor gdq = poisoned(dt, {T, Hq, D}), gdk = poisoned(dt, {T, Hkv, D}), gdv = poisoned(dt, {T, Hkv, D});
    cuda::attention_backward(gpu_ctx(), gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, meta);
    EXPECT_TRUE(close_max_rel("tc backward dq " + nm, fetch(gdq), dq, 2e-2));
    EXPECT_TRUE(close_max_rel("tc backward dk " + nm, fetch(gdk), dk, 2e-2));
    EXPECT_TRUE(close_max_rel("tc backward dv " + nm, fetch(gdv), dv, 2e-2));
  }
}

// Prefill steps of the engine's shape: each run is one sequence's rows of the step, at
// positions pos0 .. pos0 + n - 1, its cache holding positions 0 .. pos0 + n - 1 (the
// cached prefix and this step's rows, already written). Cache slots past a sequence's
// end (the rest of its last block, a spare block) hold random values that the mask must
// hide, and block-table entries past its blocks are -1 (never read). The tile path is
// checked against the CPU reference and against the CUDA path without tiles (another
// kernel: equal to tolerance). A row's output must not depend on which tile holds it
// (the key tiles always start at position 0 and masked columns add exact zeros), so a
// second tiling with other cuts and another tile order must match bit for bit.
namespace {
// window > 0: the tile list is passed but the tensor-core kernel has no window, so
// attention_paged must take the per-token kernel and still match the CPU.
void paged_prefill_matches_cpu(int window) {
  SCOPED_TRACE("window " + std::to_string(window));
  struct Shape {
    int64_t Hq, Hkv, D;
  };
  const Shape shapes[] = {{14, 2, 64}, {16, 8, 128}, {4, 4, 64}};  // Qwen2.5-0.5B, Qwen3-0.6B, G = 1
  struct Run {
    int32_t pos0, n;
  };
  const Run runs[] = {
      {0, 150},   // a whole prompt: query tiles of 64, 64, 22 rows
      {0, 63},    // tile edges
      {0, 64},
      {0, 65},
      {37, 65},   // chunked prefill after 37 cached tokens: query and key tiles straddle
      {128, 64},  // a cached prefix that ends on a key-tile boundary
      {300, 1},   // a decode-like row in a prefill step
      {0, 1},     // a one-token prompt
      {70, 150},  // a continuation off the tile grid
  };
  const int32_t bs = 16;
  const int64_t S = int64_t(std::size(runs));
  const DType dt = DType::bf16;

  // Block tables over shuffled physical blocks (two spare blocks stay unused).
  int64_t max_blocks = 0, n_blocks = 2, T = 0;
  for (const Run& r : runs) {
    max_blocks = std::max<int64_t>(max_blocks, (r.pos0 + r.n + bs - 1) / bs);
    n_blocks += (r.pos0 + r.n + bs - 1) / bs;
    T += r.n;
  }
  max_blocks += 2;  // trailing -1 entries
  std::mt19937 rng(9100);
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), -1), tseq, tpos;
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    const Run& r = runs[static_cast<size_t>(s)];
    for (int64_t b = 0; b < (r.pos0 + r.n + bs - 1) / bs; ++b)
      table[static_cast<size_t>(s * max_blocks + b)] = perm[static_cast<size_t>(next++)];
    for (int32_t i = 0; i < r.n; ++i) {
      tseq.push_back(int32_t(s));
      tpos.push_back(r.pos0 + i);
    }
  }
  auto make_tiles = [&](auto cut) { return shuffled_prefill_tiles(runs, S, cut, rng); };
  const std::vector<int32_t> tiles = make_tiles([](int) { return 64; });  // the runner's tiling
  const int32_t alt_cuts[] = {17, 64, 1, 40, 33, 64};
  const std::vector<int32_t> alt_tiles = make_tiles([&](int k) { return alt_cuts[k % 6]; });

  uint32_t seed = 9000;
  for (const Shape& sh : shapes) {
    const int64_t Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D;
    const std::string nm = "[Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                           " T=" + std::to_string(T) + "]";
    auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), dt);
    auto kc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), dt);
    auto vc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), dt);
    PagedAttnMeta hm;
    hm.block_size = bs;
    hm.window = window;
    hm.max_context = *std::max_element(tpos.begin(), tpos.end()) + 1;
    hm.token_seq = host_i32(tseq, {T});
    hm.token_pos = host_i32(tpos, {T});
    hm.block_table = host_i32(table, {S, max_blocks});
    std::vector<float> ref(q.size());
    Tensor hq = host(q, {T, Hq, D}), ho = host(ref, {T, Hq, D});
    Tensor hkc = host(kc, {n_blocks, bs, Hkv, D}), hvc = host(vc, {n_blocks, bs, Hkv, D});
    cpu::attention_paged(cpu_ctx(), ho, hq, hkc, hvc, hm);

    PagedAttnMeta gm = hm;
    gm.token_seq = dev_int(tseq, DType::i32, {T});
    gm.token_pos = dev_int(tpos, DType::i32, {T});
    gm.block_table = dev_int(table, DType::i32, {S, max_blocks});
    Tensor gq = dev(q, dt, {T, Hq, D});
    Tensor gkc = dev(kc, dt, {n_blocks, bs, Hkv, D}), gvc = dev(vc, dt, {n_blocks, bs, Hkv, D});

    Tensor go_plain = poisoned(dt, {T, Hq, D});
    cuda::attention_paged(gpu_ctx(), go_plain, gq, gkc, gvc, gm);  // no tiles: the per-token path
    const auto plain = fetch(go_plain);

    PagedAttnMeta tm = gm;
    tm.n_prefill_tiles = int(tiles.size() / 4);
    tm.prefill_tiles = dev_int(tiles, DType::i32, {int64_t(tm.n_prefill_tiles), 4});
    Tensor go = poisoned(dt, {T, Hq, D});
    cuda::attention_paged(gpu_ctx(), go, gq, gkc, gvc, tm);
    const auto got = fetch(go);
    EXPECT_TRUE(close("paged prefill tc vs cpu " + nm, got, ref, tol_reduce(dt)));
    EXPECT_TRUE(close("paged prefill tc vs per-token cuda " + nm, got, plain, tol_reduce(dt)));

    PagedAttnMeta am = gm;
    am.n_prefill_tiles = int(alt_tiles.size() / 4);
    am.prefill_tiles = dev_int(alt_tiles, DType::i32, {int64_t(am.n_prefill_tiles), 4});
    Tensor go_alt = poisoned(dt, {T, Hq, D});
    cuda::attention_paged(gpu_ctx(), go_alt, gq, gkc, gvc, am);
    EXPECT_TRUE(close("paged prefill tc, other tiling, bitwise " + nm, fetch(go_alt), got, Tol{0, 0}));
  }
}
}  // namespace

TEST(CudaAttentionTc, PagedPrefillMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  paged_prefill_matches_cpu(0);
}

TEST(CudaAttentionTc, PagedPrefillSlidingWindowMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  for (int window : {24, 70}) paged_prefill_matches_cpu(window);
}

// Packed training forward/backward with a window: the tensor-core kernels step aside
// for the CUDA-core ones, which must match the CPU for bf16 head dims 64/128 too.
TEST(CudaAttentionTc, PackedSlidingWindowMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const TcCase c{{200, 65, 1}, 14, 2, 64};
  const DType dt = DType::bf16;
  for (int window : {24, 100}) {
    AttnVarlen meta;
    meta.cu_seqlens.push_back(0);
    for (int32_t l : c.lens) meta.cu_seqlens.push_back(meta.cu_seqlens.back() + l);
    meta.max_seqlen = 200;
    meta.window = window;
    meta.cu_seqlens_dev = dev_int(meta.cu_seqlens, DType::i32, {int64_t(meta.cu_seqlens.size())});
    const int64_t T = meta.cu_seqlens.back(), Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    auto q = rounded(randn(size_t(T * Hq * D), 40 + window), dt), k = rounded(randn(size_t(T * Hkv * D), 41 + window), dt);
    auto v = rounded(randn(size_t(T * Hkv * D), 42 + window), dt), dout = rounded(randn(size_t(T * Hq * D), 43 + window), dt);
    std::vector<float> out(q.size()), lse(size_t(Hq * T)), dq(q.size()), dk(k.size()), dv(k.size());
    Tensor hq = host(q, {T, Hq, D}), hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D}), ho = host(out, {T, Hq, D}),
           hl = host(lse, {Hq, T}), hdo = host(dout, {T, Hq, D}), hdq = host(dq, {T, Hq, D}),
           hdk = host(dk, {T, Hkv, D}), hdv = host(dv, {T, Hkv, D});
    cpu::attention_forward(cpu_ctx(), ho, &hl, hq, hk, hv, meta);
    cpu::attention_backward(cpu_ctx(), hdq, hdk, hdv, hdo, hq, hk, hv, ho, hl, meta);
    Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
    Tensor go = poisoned(dt, {T, Hq, D}), gl = poisoned(DType::f32, {Hq, T});
    cuda::attention_forward(gpu_ctx(), go, &gl, gq, gk, gv, meta);
    EXPECT_TRUE(close("windowed forward out", fetch(go), out, tol_reduce(dt)));
    EXPECT_TRUE(close("windowed forward lse", fetch(gl), lse, Tol{1e-4, 1e-4}));
    Tensor gdo = dev(dout, dt, {T, Hq, D});
    Tensor gdq = poisoned(dt, {T, Hq, D}), gdk = poisoned(dt, {T, Hkv, D}), gdv = poisoned(dt, {T, Hkv, D});
    cuda::attention_backward(gpu_ctx(), gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, meta);
    EXPECT_TRUE(close_max_rel("windowed backward dq", fetch(gdq), dq, 3e-2));
    EXPECT_TRUE(close_max_rel("windowed backward dk", fetch(gdk), dk, 3e-2));
    EXPECT_TRUE(close_max_rel("windowed backward dv", fetch(gdv), dv, 3e-2));
  }
}

#else
TEST(CudaAttentionTc, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
