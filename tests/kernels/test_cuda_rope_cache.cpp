// rope_qk_cache_write (the engine's fused rope(q) + rope(k) + k/v cache write) on CUDA
// against the CPU composition of the three ops: q, k and both caches, with a padding
// token (slot −1) whose cache rows must stay untouched. Also the unaligned fallback.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include "kernels/rope.h"

using namespace grpo;
using namespace grpo::cudatest;

namespace {

void run(DType dt, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed) {
  const int64_t T = 37, P = 300, half = D / 2, n_blocks = 8, bs = 16;
  auto q = rounded(randn(size_t(T * Hq * D), seed), dt), k = rounded(randn(size_t(T * Hkv * D), seed + 1), dt);
  auto v = rounded(randn(size_t(T * Hkv * D), seed + 2), dt);
  auto cache0 = rounded(randn(size_t(n_blocks * bs * Hkv * D), seed + 3), dt);
  auto cs = randn(size_t(P * half), seed + 4), sn = randn(size_t(P * half), seed + 5);
  std::vector<int32_t> pos, slots;
  for (int64_t t = 0; t < T; ++t) {
    pos.push_back(int32_t((t * 7) % P));
    slots.push_back(t == 5 ? -1 : int32_t((t * 3) % (n_blocks * bs)));  // distinct slots, one padding token
  }
  PagedAttnMeta hm;
  hm.block_size = int(bs);
  hm.slot_mapping = host_i32(slots, {T});
  std::vector<float> hq = q, hk = k, hkc = cache0, hvc = cache0;
  Tensor tq = host(hq, {T, Hq, D}), tk = host(hk, {T, Hkv, D}), tv = host(v, {T, Hkv, D});
  Tensor tkc = host(hkc, {n_blocks, bs, Hkv, D}), tvc = host(hvc, {n_blocks, bs, Hkv, D});
  Tensor tp = host_i32(pos, {T}), tc = host(cs, {P, half}), ts = host(sn, {P, half});
  cpu::rope_qk_cache_write(cpu_ctx(), tq, tk, tv, tp, tc, ts, tkc, tvc, hm);

  PagedAttnMeta gm = hm;
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gq = dev(q, dt, {T, Hq, D}), gk = dev(k, dt, {T, Hkv, D}), gv = dev(v, dt, {T, Hkv, D});
  Tensor gkc = dev(cache0, dt, {n_blocks, bs, Hkv, D}), gvc = dev(cache0, dt, {n_blocks, bs, Hkv, D});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  cuda::rope_qk_cache_write(gpu_ctx(), gq, gk, gv, gp, gc, gs, gkc, gvc, gm);
  const std::string nm = std::string("[") + dtype_name(dt) + " Hq=" + std::to_string(Hq) + " Hkv=" +
                         std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
  EXPECT_TRUE(close("rope_qk_cache_write q " + nm, fetch(gq), hq, tol_elem(dt)));
  EXPECT_TRUE(close("rope_qk_cache_write k " + nm, fetch(gk), hk, tol_elem(dt)));
  EXPECT_TRUE(close("rope_qk_cache_write k cache " + nm, fetch(gkc), hkc, tol_elem(dt)));
  EXPECT_TRUE(close("rope_qk_cache_write v cache " + nm, fetch(gvc), hvc, Tol{0, 0}));
}

// rope_qkv_cache_write: q/k/v read from fused projection rows [q | k | v].
void run_qkv(DType dt, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed) {
  const int64_t T = 29, P = 200, half = D / 2, n_blocks = 4, bs = 16, W = (Hq + 2 * Hkv) * D;
  auto qkv = rounded(randn(size_t(T * W), seed), dt);
  auto cache0 = rounded(randn(size_t(n_blocks * bs * Hkv * D), seed + 1), dt);
  auto cs = randn(size_t(P * half), seed + 2), sn = randn(size_t(P * half), seed + 3);
  std::vector<int32_t> pos, slots;
  for (int64_t t = 0; t < T; ++t) {
    pos.push_back(int32_t((t * 11) % P));
    slots.push_back(t == 3 ? -1 : int32_t((t * 5) % (n_blocks * bs)));
  }
  PagedAttnMeta hm;
  hm.block_size = int(bs);
  hm.slot_mapping = host_i32(slots, {T});
  std::vector<float> hq(size_t(T * Hq * D)), hkc = cache0, hvc = cache0;
  Tensor tq = host(hq, {T, Hq, D}), tqkv = host(qkv, {T, W});
  Tensor tkc = host(hkc, {n_blocks, bs, Hkv, D}), tvc = host(hvc, {n_blocks, bs, Hkv, D});
  Tensor tp = host_i32(pos, {T}), tc = host(cs, {P, half}), ts = host(sn, {P, half});
  cpu::rope_qkv_cache_write(cpu_ctx(), tq, tqkv, tp, tc, ts, tkc, tvc, hm);

  PagedAttnMeta gm = hm;
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gq = poisoned(dt, {T, Hq, D}), gqkv = dev(qkv, dt, {T, W});
  Tensor gkc = dev(cache0, dt, {n_blocks, bs, Hkv, D}), gvc = dev(cache0, dt, {n_blocks, bs, Hkv, D});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  cuda::rope_qkv_cache_write(gpu_ctx(), gq, gqkv, gp, gc, gs, gkc, gvc, gm);
  const std::string nm = std::string("[qkv ") + dtype_name(dt) + " Hq=" + std::to_string(Hq) + " Hkv=" +
                         std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
  EXPECT_TRUE(close("rope_qkv_cache_write q " + nm, fetch(gq), hq, tol_elem(dt)));
  EXPECT_TRUE(close("rope_qkv_cache_write k cache " + nm, fetch(gkc), hkc, tol_elem(dt)));
  EXPECT_TRUE(close("rope_qkv_cache_write v cache " + nm, fetch(gvc), hvc, Tol{0, 0}));
}

// qk_norm_rope_cache_write (Qwen3 layers): per-head RMSNorm of q and k, rope, cache write.
void run_qk_norm(DType dt, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed) {
  const int64_t T = 23, P = 100, half = D / 2, n_blocks = 4, bs = 16, W = (Hq + 2 * Hkv) * D;
  auto qkv = rounded(randn(size_t(T * W), seed, 2.f), dt);
  auto wq = rounded(randn(size_t(D), seed + 1), dt), wk = rounded(randn(size_t(D), seed + 2), dt);
  auto cache0 = rounded(randn(size_t(n_blocks * bs * Hkv * D), seed + 3), dt);
  auto cs = randn(size_t(P * half), seed + 4), sn = randn(size_t(P * half), seed + 5);
  std::vector<int32_t> pos, slots;
  for (int64_t t = 0; t < T; ++t) {
    pos.push_back(int32_t((t * 13) % P));
    slots.push_back(t == 7 ? -1 : int32_t((t * 3) % (n_blocks * bs)));
  }
  PagedAttnMeta hm;
  hm.block_size = int(bs);
  hm.slot_mapping = host_i32(slots, {T});
  std::vector<float> hq(size_t(T * Hq * D)), hkc = cache0, hvc = cache0;
  Tensor tq = host(hq, {T, Hq, D}), tqkv = host(qkv, {T, W}), twq = host(wq, {D}), twk = host(wk, {D});
  Tensor tkc = host(hkc, {n_blocks, bs, Hkv, D}), tvc = host(hvc, {n_blocks, bs, Hkv, D});
  Tensor tp = host_i32(pos, {T}), tc = host(cs, {P, half}), ts = host(sn, {P, half});
  cpu::qk_norm_rope_cache_write(cpu_ctx(), tq, tqkv, twq, twk, 1e-6f, tp, tc, ts, tkc, tvc, hm);

  PagedAttnMeta gm = hm;
  gm.slot_mapping = dev_int(slots, DType::i32, {T});
  Tensor gq = poisoned(dt, {T, Hq, D}), gqkv = dev(qkv, dt, {T, W}), gwq = dev(wq, dt, {D}), gwk = dev(wk, dt, {D});
  Tensor gkc = dev(cache0, dt, {n_blocks, bs, Hkv, D}), gvc = dev(cache0, dt, {n_blocks, bs, Hkv, D});
  Tensor gp = dev_int(pos, DType::i32, {T}), gc = dev(cs, DType::f32, {P, half}), gs = dev(sn, DType::f32, {P, half});
  cuda::qk_norm_rope_cache_write(gpu_ctx(), gq, gqkv, gwq, gwk, 1e-6f, gp, gc, gs, gkc, gvc, gm);
  const std::string nm = std::string("[qk-norm ") + dtype_name(dt) + " Hq=" + std::to_string(Hq) + " Hkv=" +
                         std::to_string(Hkv) + " D=" + std::to_string(D) + "]";
  // bf16: the normalised value is rounded before rope on both sides, but Σx² is summed in
  // another order, so an element may land one bf16 step away.
  const Tol tol = dt == DType::f32 ? Tol{1e-5, 1e-5} : Tol{2e-2, 2e-2};
  EXPECT_TRUE(close("qk_norm_rope_cache_write q " + nm, fetch(gq), hq, tol));
  EXPECT_TRUE(close("qk_norm_rope_cache_write k cache " + nm, fetch(gkc), hkc, tol));
  EXPECT_TRUE(close("qk_norm_rope_cache_write v cache " + nm, fetch(gvc), hvc, Tol{0, 0}));
}

}  // namespace

TEST(CudaRopeCache, QkNormFromFusedQkvMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 4500;
  for (DType dt : kDTypes) {
    run_qk_norm(dt, 16, 8, 128, seed += 10);  // Qwen3-0.6B heads
    run_qk_norm(dt, 4, 2, 64, seed += 10);
    run_qk_norm(dt, 6, 3, 32, seed += 10);    // D = 32: unfused fallback
  }
}

TEST(CudaRopeCache, FromFusedQkvMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 4300;
  for (DType dt : kDTypes) {
    run_qkv(dt, 14, 2, 64, seed += 10);  // vector path
    run_qkv(dt, 6, 3, 20, seed += 10);   // fallback (split + three ops)
  }
}

TEST(CudaRopeCache, FusedMatchesCpuComposition) {
  GRPO_SKIP_WITHOUT_CUDA();
  uint32_t seed = 4100;
  for (DType dt : kDTypes) {
    run(dt, 14, 2, 64, seed += 10);   // Qwen2.5-0.5B heads (vector path)
    run(dt, 16, 8, 128, seed += 10);  // Qwen3-0.6B heads
    run(dt, 6, 3, 20, seed += 10);    // D/2 = 10: not a vector multiple, three-op fallback
  }
}

#else
TEST(CudaRopeCache, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
