// The tensor-core training attention (attention_tc.cu: bf16, head dim 64/128) against the
// CPU reference: packed batches whose 64-token tiles straddle sequences, one-token
// sequences, lengths on and off tile multiples, GQA groups of 1, 2 and 7.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <algorithm>

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

#else
TEST(CudaAttentionTc, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
