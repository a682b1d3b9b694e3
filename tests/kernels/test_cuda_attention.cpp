// CUDA vs CPU parity for attention: varlen forward (+lse) and backward, kv_cache_write,
// paged attention in prefill and decode shape. The paged kernel computes every token by
// itself: decode rows equal the prefill rows of the same tokens bit for bit, and rows do
// not depend on max_context or on the other sequences of the launch. The paged and the
// packed forward use different kernels (different rounding): they agree to tolerance.
// Each case also runs with sliding windows (keys p-W+1..p): short ones that skip whole
// key partitions, and ones that start inside a partition or a 16-token cache block.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <algorithm>
#include <numeric>

#include "kernels/attention.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

struct Cfg {
  std::vector<int32_t> lens;
  int64_t Hq, Hkv, D;
};

std::string cfg_name(const Cfg& c, DType dt) {
  std::string s = std::string("[") + dtype_name(dt) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
                  " D=" + std::to_string(c.D) + " lens=";
  for (int32_t l : c.lens) s += std::to_string(l) + ",";
  return s + "]";
}

AttnVarlen make_varlen(const std::vector<int32_t>& lens) {
  AttnVarlen m;
  m.cu_seqlens.push_back(0);
  for (int32_t l : lens) m.cu_seqlens.push_back(m.cu_seqlens.back() + l);
  m.max_seqlen = *std::max_element(lens.begin(), lens.end());
  m.cu_seqlens_dev = dev_int(m.cu_seqlens, DType::i32, {int64_t(m.cu_seqlens.size())});
  return m;
}

const Cfg kCfgs[] = {
    {{5, 300, 530}, 4, 2, 64},   // several key partitions, G = 2
    {{40, 7, 1}, 18, 2, 32},     // G = 9 > 8: two head groups per kv head
    {{129, 3}, 8, 8, 128},       // G = 1, D = 128
    {{17, 64}, 14, 2, 64},       // Qwen2.5-0.5B head layout (G = 7)
    {{20, 3, 40}, 4, 2, 16},     // tiny test models (head_dim 16)
    {{50, 9}, 6, 3, 48},         // llama2.c stories15M (head_dim 48: idle lanes)
};

}  // namespace

namespace {
void varlen_forward_backward(int window) {
  uint32_t seed = 100;
  for (const Cfg& c : kCfgs) {
    SCOPED_TRACE("window " + std::to_string(window));
    AttnVarlen meta = make_varlen(c.lens);
    meta.window = window;
    const int64_t T = meta.cu_seqlens.back(), Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    for (DType dt : kDTypes) {
      const std::string nm = cfg_name(c, dt);
      auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), dt), k = rounded(randn(static_cast<size_t>(T * Hkv * D), seed++), dt);
      auto v = rounded(randn(static_cast<size_t>(T * Hkv * D), seed++), dt), dout = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), dt);
      std::vector<float> out(q.size()), lse(static_cast<size_t>(Hq * T)), dq(q.size()), dk(k.size()), dv(k.size());
      Tensor hq = host(q, {T, Hq, D}), hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D}), ho = host(out, {T, Hq, D}),
             hl = host(lse, {Hq, T}), hdo = host(dout, {T, Hq, D}), hdq = host(dq, {T, Hq, D}),
             hdk = host(dk, {T, Hkv, D}), hdv = host(dv, {T, Hkv, D});
      cpu::attention_forward(cpu_ctx(), ho, &hl, hq, hk, hv, meta);
      cpu::attention_backward(cpu_ctx(), hdq, hdk, hdv, hdo, hq, hk, hv, ho, hl, meta);

      Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
      Tensor go = poisoned(dt, {T, Hq, D}), gl = poisoned(DType::f32, {Hq, T});
      cuda::attention_forward(gpu_ctx(), go, &gl, gq, gk, gv, meta);
      EXPECT_TRUE(close("attention_forward out " + nm, fetch(go), out, tol_reduce(dt)));
      EXPECT_TRUE(close("attention_forward lse " + nm, fetch(gl), lse, Tol{1e-4, 1e-4}));

      Tensor gdo = dev(dout, dt, {T, Hq, D});
      Tensor gdq = poisoned(dt, {T, Hq, D}), gdk = poisoned(dt, {T, Hkv, D}), gdv = poisoned(dt, {T, Hkv, D});
      cuda::attention_backward(gpu_ctx(), gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, meta);
      if (dt == DType::f32) {
        EXPECT_TRUE(close("attention_backward dq " + nm, fetch(gdq), dq, Tol{1e-4, 1e-3}));
        EXPECT_TRUE(close("attention_backward dk " + nm, fetch(gdk), dk, Tol{1e-4, 1e-3}));
        EXPECT_TRUE(close("attention_backward dv " + nm, fetch(gdv), dv, Tol{1e-4, 1e-3}));
      } else {  // bf16 out feeds Δ; compare whole-tensor relative error
        EXPECT_TRUE(close_max_rel("attention_backward dq " + nm, fetch(gdq), dq, 3e-2));
        EXPECT_TRUE(close_max_rel("attention_backward dk " + nm, fetch(gdk), dk, 3e-2));
        EXPECT_TRUE(close_max_rel("attention_backward dv " + nm, fetch(gdv), dv, 3e-2));
      }
    }
  }
}
}  // namespace

TEST(CudaAttention, VarlenForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  varlen_forward_backward(0);
}

TEST(CudaAttention, VarlenForwardBackwardSlidingWindow) {
  GRPO_SKIP_WITHOUT_CUDA();
  for (int window : {1, 24, 37, 300}) varlen_forward_backward(window);
}

// D = 96 has no forward kernel and no tiled backward: the simple warp-per-row backward
// runs. Out and lse come from the CPU forward.
TEST(CudaAttention, BackwardSimplePathD96) {
  GRPO_SKIP_WITHOUT_CUDA();
  const Cfg c{{33, 70}, 6, 2, 96};
  AttnVarlen meta = make_varlen(c.lens);
  const int64_t T = meta.cu_seqlens.back(), Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  auto q = randn(static_cast<size_t>(T * Hq * D), 900), k = randn(static_cast<size_t>(T * Hkv * D), 901);
  auto v = randn(static_cast<size_t>(T * Hkv * D), 902), dout = randn(static_cast<size_t>(T * Hq * D), 903);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(Hq * T)), dq(q.size()), dk(k.size()), dv(k.size());
  Tensor hq = host(q, {T, Hq, D}), hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D}), ho = host(out, {T, Hq, D}),
         hl = host(lse, {Hq, T}), hdo = host(dout, {T, Hq, D}), hdq = host(dq, {T, Hq, D}), hdk = host(dk, {T, Hkv, D}),
         hdv = host(dv, {T, Hkv, D});
  cpu::attention_forward(cpu_ctx(), ho, &hl, hq, hk, hv, meta);
  cpu::attention_backward(cpu_ctx(), hdq, hdk, hdv, hdo, hq, hk, hv, ho, hl, meta);
  const DType dt = DType::f32;
  Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
  Tensor go = dev(out, dt, {T, Hq, D}), gl = dev(lse, DType::f32, {Hq, T}), gdo = dev(dout, dt, {T, Hq, D});
  Tensor gdq = poisoned(dt, {T, Hq, D}), gdk = poisoned(dt, {T, Hkv, D}), gdv = poisoned(dt, {T, Hkv, D});
  cuda::attention_backward(gpu_ctx(), gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, meta);
  EXPECT_TRUE(close("attention_backward (simple, D=96) dq", fetch(gdq), dq, Tol{1e-4, 1e-3}));
  EXPECT_TRUE(close("attention_backward (simple, D=96) dk", fetch(gdk), dk, Tol{1e-4, 1e-3}));
  EXPECT_TRUE(close("attention_backward (simple, D=96) dv", fetch(gdv), dv, Tol{1e-4, 1e-3}));
}

namespace {
void paged_matches_cpu_and_packed(int window) {
  uint32_t seed = 500;
  for (const Cfg& c : kCfgs) {
    SCOPED_TRACE("window " + std::to_string(window));
    AttnVarlen vl = make_varlen(c.lens);
    vl.window = window;
    const int64_t S = int64_t(c.lens.size()), T = vl.cu_seqlens.back(), Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    const int32_t bs = 16;
    // Block tables with shuffled physical blocks; one spare block stays unused.
    int64_t max_blocks = 0, n_blocks = 1;
    for (int32_t l : c.lens) {
      max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
      n_blocks += (l + bs - 1) / bs;
    }
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), -1), tseq(static_cast<size_t>(T)), tpos(static_cast<size_t>(T)), slots(static_cast<size_t>(T) + 1);
    int64_t next = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < (c.lens[static_cast<size_t>(s)] + bs - 1) / bs; ++b) table[static_cast<size_t>(s * max_blocks + b)] = perm[static_cast<size_t>(next++)];
    for (int64_t s = 0; s < S; ++s)
      for (int32_t p = 0; p < c.lens[static_cast<size_t>(s)]; ++p) {
        const int64_t t = vl.cu_seqlens[static_cast<size_t>(s)] + p;
        tseq[static_cast<size_t>(t)] = int32_t(s);
        tpos[static_cast<size_t>(t)] = p;
        slots[static_cast<size_t>(t)] = table[static_cast<size_t>(s * max_blocks + p / bs)] * bs + p % bs;
      }
    slots[static_cast<size_t>(T)] = -1;  // an extra padding token: must not be written
    for (DType dt : kDTypes) {
      const std::string nm = cfg_name(c, dt);
      auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), dt);
      auto k = rounded(randn(static_cast<size_t>((T + 1) * Hkv * D), seed++), dt), v = rounded(randn(static_cast<size_t>((T + 1) * Hkv * D), seed++), dt);
      auto cache0 = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), dt);
      std::vector<float> kc = cache0, vc = cache0;
      PagedAttnMeta hm;
      hm.block_size = bs;
      hm.window = window;
      hm.max_context = *std::max_element(c.lens.begin(), c.lens.end());
      hm.token_seq = host_i32(tseq, {T});
      hm.token_pos = host_i32(tpos, {T});
      hm.block_table = host_i32(table, {S, max_blocks});
      hm.slot_mapping = host_i32(slots, {T + 1});
      Tensor hk = host(k, {T + 1, Hkv, D}), hv = host(v, {T + 1, Hkv, D});
      Tensor hkc = host(kc, {n_blocks, bs, Hkv, D}), hvc = host(vc, {n_blocks, bs, Hkv, D});
      cpu::kv_cache_write(cpu_ctx(), hkc, hvc, hk, hv, hm);
      std::vector<float> out(q.size());
      Tensor hq = host(q, {T, Hq, D}), ho = host(out, {T, Hq, D});
      cpu::attention_paged(cpu_ctx(), ho, hq, hkc, hvc, hm);

      PagedAttnMeta gm = hm;
      gm.token_seq = dev_int(tseq, DType::i32, {T});
      gm.token_pos = dev_int(tpos, DType::i32, {T});
      gm.block_table = dev_int(table, DType::i32, {S, max_blocks});
      gm.slot_mapping = dev_int(slots, DType::i32, {T + 1});
      Tensor gk = dev(k, dt, {T + 1, Hkv, D}), gv = dev(v, dt, {T + 1, Hkv, D});
      Tensor gkc = dev(cache0, dt, {n_blocks, bs, Hkv, D}), gvc = dev(cache0, dt, {n_blocks, bs, Hkv, D});
      cuda::kv_cache_write(gpu_ctx(), gkc, gvc, gk, gv, gm);
      EXPECT_TRUE(close("kv_cache_write k " + nm, fetch(gkc), kc, Tol{0, 0}));
      EXPECT_TRUE(close("kv_cache_write v " + nm, fetch(gvc), vc, Tol{0, 0}));

      Tensor gq = dev(q, dt, {T, Hq, D}), go = poisoned(dt, {T, Hq, D});
      cuda::attention_paged(gpu_ctx(), go, gq, gkc, gvc, gm);
      auto paged = fetch(go);
      EXPECT_TRUE(close("attention_paged (prefill shape) " + nm, paged, out, tol_reduce(dt)));

      // Packed forward over the same k/v rows: another kernel, equal to tolerance.
      Tensor gk_packed = dev(std::vector<float>(k.begin(), k.end() - Hkv * D), dt, {T, Hkv, D});
      Tensor gv_packed = dev(std::vector<float>(v.begin(), v.end() - Hkv * D), dt, {T, Hkv, D});
      Tensor go2 = poisoned(dt, {T, Hq, D});
      cuda::attention_forward(gpu_ctx(), go2, nullptr, gq, gk_packed, gv_packed, vl);
      EXPECT_TRUE(close("paged vs packed forward " + nm, fetch(go2), paged, tol_reduce(dt)));

      // Decode shape: the last token of each sequence only.
      std::vector<int32_t> dseq, dpos;
      std::vector<float> dq, dref;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t t = vl.cu_seqlens[static_cast<size_t>(s) + 1] - 1;
        dseq.push_back(int32_t(s));
        dpos.push_back(tpos[static_cast<size_t>(t)]);
        dq.insert(dq.end(), q.begin() + t * Hq * D, q.begin() + (t + 1) * Hq * D);
        dref.insert(dref.end(), paged.begin() + t * Hq * D, paged.begin() + (t + 1) * Hq * D);
      }
      PagedAttnMeta dm = gm;
      dm.token_seq = dev_int(dseq, DType::i32, {S});
      dm.token_pos = dev_int(dpos, DType::i32, {S});
      Tensor gdq = dev(dq, dt, {S, Hq, D}), gdo = poisoned(dt, {S, Hq, D});
      cuda::attention_paged(gpu_ctx(), gdo, gdq, gkc, gvc, dm);
      EXPECT_TRUE(close("attention_paged decode == prefill rows, bitwise " + nm, fetch(gdo), dref, Tol{0, 0}));
      // An underestimated max_context must stay correct (the last partition takes the rest).
      dm.max_context = 1;
      Tensor gdo2 = poisoned(dt, {S, Hq, D});
      cuda::attention_paged(gpu_ctx(), gdo2, gdq, gkc, gvc, dm);
      EXPECT_TRUE(close("attention_paged max_context=1 " + nm, fetch(gdo2), dref, tol_reduce(dt)));
    }
  }
}
}  // namespace

TEST(CudaAttention, PagedMatchesCpuAndPacked) {
  GRPO_SKIP_WITHOUT_CUDA();
  paged_matches_cpu_and_packed(0);
}

TEST(CudaAttention, PagedMatchesCpuAndPackedSlidingWindow) {
  GRPO_SKIP_WITHOUT_CUDA();
  for (int window : {1, 24, 37, 300}) paged_matches_cpu_and_packed(window);
}

// Decode batches of the engine's shape: 64 sequences with contexts 100..700 (partition
// edges included), one query token each, against the CPU reference. The rows must not
// depend on the launch's max_context (graph replays pass a larger one) nor on which
// other sequences share the launch; an underestimated max_context stays correct.
TEST(CudaAttention, PagedDecodeBatch) {
  GRPO_SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t Hq, Hkv, D;
  };
  const Shape shapes[] = {{14, 2, 64}, {16, 8, 128}, {18, 2, 32}};  // Qwen2.5-0.5B, Qwen3-0.6B, G = 9
  uint32_t seed = 800;
  for (const Shape& sh : shapes) {
    const int64_t S = 64, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D;
    const int32_t bs = 16, max_ctx = 700;
    std::mt19937 rng(seed++);
    std::vector<int32_t> ctxs(static_cast<size_t>(S));
    for (int32_t& c : ctxs) c = 100 + int32_t(rng() % 601);
    const int32_t edges[] = {100, 700, 64, 65, 128, 129, 256, 257, 640, 1};
    for (size_t i = 0; i < std::size(edges); ++i) ctxs[i] = edges[i];
    const int64_t max_blocks = (max_ctx + bs - 1) / bs;
    int64_t n_blocks = 1;
    for (int32_t c : ctxs) n_blocks += (c + bs - 1) / bs;
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), -1), tseq(static_cast<size_t>(S)),
        tpos(static_cast<size_t>(S));
    int64_t next = 0;
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t b = 0; b < (ctxs[static_cast<size_t>(s)] + bs - 1) / bs; ++b)
        table[static_cast<size_t>(s * max_blocks + b)] = perm[static_cast<size_t>(next++)];
      tseq[static_cast<size_t>(s)] = int32_t(s);
      tpos[static_cast<size_t>(s)] = ctxs[static_cast<size_t>(s)] - 1;
    }
    for (DType dt : kDTypes) {
      const std::string nm = std::string("[") + dtype_name(dt) + " Hq=" + std::to_string(Hq) +
                             " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
      auto q = rounded(randn(static_cast<size_t>(S * Hq * D), seed++), dt);
      auto kc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), dt);
      auto vc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), dt);
      PagedAttnMeta hm;
      hm.block_size = bs;
      hm.max_context = max_ctx;
      hm.token_seq = host_i32(tseq, {S});
      hm.token_pos = host_i32(tpos, {S});
      hm.block_table = host_i32(table, {S, max_blocks});
      std::vector<float> ref(q.size());
      Tensor hq = host(q, {S, Hq, D}), ho = host(ref, {S, Hq, D});
      Tensor hkc = host(kc, {n_blocks, bs, Hkv, D}), hvc = host(vc, {n_blocks, bs, Hkv, D});
      cpu::attention_paged(cpu_ctx(), ho, hq, hkc, hvc, hm);

      PagedAttnMeta gm = hm;
      gm.token_seq = dev_int(tseq, DType::i32, {S});
      gm.token_pos = dev_int(tpos, DType::i32, {S});
      gm.block_table = dev_int(table, DType::i32, {S, max_blocks});
      Tensor gq = dev(q, dt, {S, Hq, D});
      Tensor gkc = dev(kc, dt, {n_blocks, bs, Hkv, D}), gvc = dev(vc, dt, {n_blocks, bs, Hkv, D});
      Tensor go = poisoned(dt, {S, Hq, D});
      cuda::attention_paged(gpu_ctx(), go, gq, gkc, gvc, gm);
      const auto got = fetch(go);
      EXPECT_TRUE(close("attention_paged decode batch " + nm, got, ref, tol_reduce(dt)));

      PagedAttnMeta wide = gm;  // as in a CUDA-graph replay
      wide.max_context = 2048;
      Tensor go2 = poisoned(dt, {S, Hq, D});
      cuda::attention_paged(gpu_ctx(), go2, gq, gkc, gvc, wide);
      EXPECT_TRUE(close("attention_paged decode, max_context 2048, bitwise " + nm, fetch(go2), got, Tol{0, 0}));

      // Every third sequence alone, in reverse order: the same rows bit for bit.
      std::vector<int32_t> sseq, spos;
      std::vector<float> sq, sref;
      for (int64_t s = S - 1; s >= 0; s -= 3) {
        sseq.push_back(int32_t(s));
        spos.push_back(tpos[static_cast<size_t>(s)]);
        sq.insert(sq.end(), q.begin() + s * Hq * D, q.begin() + (s + 1) * Hq * D);
        sref.insert(sref.end(), got.begin() + s * Hq * D, got.begin() + (s + 1) * Hq * D);
      }
      const int64_t n = int64_t(sseq.size());
      PagedAttnMeta sub = gm;
      sub.token_seq = dev_int(sseq, DType::i32, {n});
      sub.token_pos = dev_int(spos, DType::i32, {n});
      sub.max_context = *std::max_element(spos.begin(), spos.end()) + 1;
      Tensor gsq = dev(sq, dt, {n, Hq, D}), gso = poisoned(dt, {n, Hq, D});
      cuda::attention_paged(gpu_ctx(), gso, gsq, gkc, gvc, sub);
      EXPECT_TRUE(close("attention_paged decode, other batch, bitwise " + nm, fetch(gso), sref, Tol{0, 0}));

      PagedAttnMeta low = gm;  // underestimated: the last partition takes the rest
      low.max_context = 200;
      Tensor go3 = poisoned(dt, {S, Hq, D});
      cuda::attention_paged(gpu_ctx(), go3, gq, gkc, gvc, low);
      EXPECT_TRUE(close("attention_paged decode, max_context 200 " + nm, fetch(go3), ref, tol_reduce(dt)));
    }
  }
}

// Batch-invariant contexts (the bitwise mode) run runs of rows of one sequence through the
// several-rows-per-block kernel (attention_decode.cu): every row equals, bit for bit, the same
// token computed alone by the one-token kernel, for GQA groups 1 to 16 (16 / G tokens share
// the mma rows), head dims 64 and 128, sequences whose rows cross the 256-key partitions and
// blocks whose range holds the end of one sequence and the start of the next. And it agrees
// with the CPU reference.
TEST(CudaAttention, PagedRowsBitwiseEqualOneTokenKernel) {
  GRPO_SKIP_WITHOUT_CUDA();
  ContextOptions o;
  o.device = Device::cuda;
  o.deterministic = true;
  o.batch_invariant = true;
  Context bctx(o);
  struct Shape {
    int64_t Hq, Hkv, D;
  };
  const Shape shapes[] = {{14, 2, 64}, {16, 8, 128}, {32, 8, 64}, {16, 16, 64}, {16, 1, 128}, {12, 4, 128}};
  uint32_t seed = 900;
  for (const Shape& sh : shapes) {
    const int64_t Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D;
    const int32_t bs = 16;
    // Rows of each sequence: positions [start, len) (a prefix-cache hit starts later).
    // Contexts cross the 256-key partitions and (the last) the 1024-key ones of G <= 4.
    const std::vector<std::pair<int32_t, int32_t>> seqs = {{0, 300}, {0, 7},   {250, 530}, {0, 1},
                                                           {5, 67},  {511, 514}, {1015, 1031}};
    const int64_t S = int64_t(seqs.size());
    int32_t max_ctx = 0;
    for (auto [a, b] : seqs) max_ctx = std::max(max_ctx, b);
    const int64_t max_blocks = (max_ctx + bs - 1) / bs;
    int64_t n_blocks = 0;
    for (auto [a, b] : seqs) n_blocks += (b + bs - 1) / bs;
    std::mt19937 rng(seed++);
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), 0), tseq, tpos;
    int64_t next = 0;
    for (int64_t s = 0; s < S; ++s) {
      const auto [a, b] = seqs[static_cast<size_t>(s)];
      for (int64_t k = 0; k < (b + bs - 1) / bs; ++k) table[static_cast<size_t>(s * max_blocks + k)] = perm[static_cast<size_t>(next++)];
      for (int32_t p = a; p < b; ++p) {
        tseq.push_back(int32_t(s));
        tpos.push_back(p);
      }
    }
    const int64_t T = int64_t(tseq.size());
    const std::string nm = "[Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
    auto q = rounded(randn(static_cast<size_t>(T * Hq * D), seed++), DType::bf16);
    auto kc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), DType::bf16);
    auto vc = rounded(randn(static_cast<size_t>(n_blocks * bs * Hkv * D), seed++), DType::bf16);
    PagedAttnMeta gm;
    gm.block_size = bs;
    gm.max_context = max_ctx;
    gm.token_seq = dev_int(tseq, DType::i32, {T});
    gm.token_pos = dev_int(tpos, DType::i32, {T});
    gm.block_table = dev_int(table, DType::i32, {S, max_blocks});
    Tensor gq = dev(q, DType::bf16, {T, Hq, D});
    Tensor gkc = dev(kc, DType::bf16, {n_blocks, bs, Hkv, D}), gvc = dev(vc, DType::bf16, {n_blocks, bs, Hkv, D});
    Tensor go = poisoned(DType::bf16, {T, Hq, D});
    cuda::attention_paged(bctx, go, gq, gkc, gvc, gm);  // T >= 4 S: the rows kernel
    bctx.synchronize();
    const auto got = fetch(go);
    // With the log-sum-exp requested (the bitwise trainer's call): the same outputs.
    Tensor go_l = poisoned(DType::bf16, {T, Hq, D}), glse = poisoned(DType::f32, {Hq, T});
    cuda::attention_paged(bctx, go_l, gq, gkc, gvc, gm, &glse);
    bctx.synchronize();
    EXPECT_TRUE(close("attention_paged rows kernel with lse, outputs " + nm, fetch(go_l), got, Tol{0, 0}));
    const auto got_lse = fetch(glse);

    // Each row alone (one row, six sequences in the table: the one-token kernel), same max_context.
    std::vector<float> alone, alone_lse(static_cast<size_t>(Hq * T));
    for (int64_t t = 0; t < T; ++t) {
      PagedAttnMeta one = gm;
      one.token_seq = dev_int(std::vector<int32_t>{tseq[static_cast<size_t>(t)]}, DType::i32, {1});
      one.token_pos = dev_int(std::vector<int32_t>{tpos[static_cast<size_t>(t)]}, DType::i32, {1});
      std::vector<float> qt(q.begin() + t * Hq * D, q.begin() + (t + 1) * Hq * D);
      Tensor gqt = dev(qt, DType::bf16, {1, Hq, D}), got1 = poisoned(DType::bf16, {1, Hq, D});
      Tensor l1 = poisoned(DType::f32, {Hq, 1});
      cuda::attention_paged(bctx, got1, gqt, gkc, gvc, one, &l1);
      bctx.synchronize();
      const auto r = fetch(got1);
      alone.insert(alone.end(), r.begin(), r.end());
      const auto rl = fetch(l1);
      for (int64_t h = 0; h < Hq; ++h) alone_lse[static_cast<size_t>(h * T + t)] = rl[static_cast<size_t>(h)];
    }
    EXPECT_TRUE(close("attention_paged rows kernel against the one-token kernel, bitwise " + nm, got, alone, Tol{0, 0}));
    EXPECT_TRUE(close("attention_paged lse, rows kernel against the one-token kernel, bitwise " + nm, got_lse, alone_lse,
                      Tol{0, 0}));

    PagedAttnMeta hm;
    hm.block_size = bs;
    hm.max_context = max_ctx;
    hm.token_seq = host_i32(tseq, {T});
    hm.token_pos = host_i32(tpos, {T});
    hm.block_table = host_i32(table, {S, max_blocks});
    std::vector<float> ref(q.size());
    Tensor hq = host(q, {T, Hq, D}), ho = host(ref, {T, Hq, D});
    Tensor hkc = host(kc, {n_blocks, bs, Hkv, D}), hvc = host(vc, {n_blocks, bs, Hkv, D});
    std::vector<float> ref_lse(static_cast<size_t>(Hq * T));
    Tensor hl = host(ref_lse, {Hq, T});
    cpu::attention_paged(cpu_ctx(), ho, hq, hkc, hvc, hm, &hl);
    EXPECT_TRUE(close("attention_paged rows kernel against the CPU " + nm, got, ref, tol_reduce(DType::bf16)));
    // lse against the CPU's (f32 sums of the bf16 scores: a few f32 ulps of a value ~log(context)).
    EXPECT_TRUE(close("attention_paged lse against the CPU " + nm, got_lse, ref_lse, Tol{1e-5, 1e-5}));
    // The default context's kernels (the tensor-core decode kernel for G >= 4, else the
    // CUDA-core paged kernel), one partition or several: the same lse within f32 rounding.
    Tensor gd = poisoned(DType::bf16, {T, Hq, D}), gdl = poisoned(DType::f32, {Hq, T});
    cuda::attention_paged(gpu_ctx(), gd, gq, gkc, gvc, gm, &gdl);
    EXPECT_TRUE(close("attention_paged lse (default context) against the CPU " + nm, fetch(gdl), ref_lse,
                      Tol{1e-5, 1e-5}));
  }
}

#else
TEST(CudaAttention, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
