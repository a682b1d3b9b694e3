// CUDA vs CPU parity: elementwise ops, RMSNorm, RoPE, embedding, row gather, linear.
// See cuda_test_util.h for the method (rounded inputs, NaN-poisoned outputs, abs+rel).
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/elementwise.h"
#include "kernels/gather.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

using namespace grpo;
using namespace grpo::cudatest;

TEST(CudaElementwise, AddScaleCast) {
  GRPO_SKIP_WITHOUT_CUDA();
  for (DType dt : kDTypes) {
    // scalar path; 16-byte vector path within one tile; several tiles plus a partial one
    for (int64_t n : {int64_t(1003), int64_t(4096), int64_t(8 * 12345)}) {
      auto a = rounded(randn(static_cast<size_t>(n), 1), dt), b = rounded(randn(static_cast<size_t>(n), 2), dt);
      Tensor da = dev(a, dt, {n}), db = dev(b, dt, {n});
      cuda::add_inplace(gpu_ctx(), da, db);
      auto ref = a;
      Tensor ha = host(ref, {n}), hb = host(b, {n});
      cpu::add_inplace(cpu_ctx(), ha, hb);
      EXPECT_TRUE(close(tag("add_inplace", dt) + " n=" + std::to_string(n), fetch(da), rounded(ref, dt), tol_elem(dt)));
      cuda::scale_inplace(gpu_ctx(), da, -0.37f);
      cpu::scale_inplace(cpu_ctx(), ha, -0.37f);
      // the GPU scales its own bf16-rounded sum, so compare against the rounded reference sum
      std::vector<float> ref2 = rounded(a, dt);
      for (size_t i = 0; i < ref2.size(); ++i) ref2[i] = rounded({rounded({a[i] + b[i]}, dt)[0] * -0.37f}, dt)[0];
      EXPECT_TRUE(close(tag("scale_inplace", dt), fetch(da), ref2, tol_elem(dt)));
    }
  }
  // casts between f32, bf16, f16: against the host conversion (round to nearest even);
  // 777 takes the scalar path, 1000 (a multiple of 8) the vector path
  const DType all[] = {DType::f32, DType::bf16, DType::f16};
  for (int64_t n : {int64_t(777), int64_t(1000)}) {
    auto x = randn(static_cast<size_t>(n), 3, 3.f);
    for (DType from : all) {
      for (DType to : all) {
        auto src = rounded(x, from);
        Tensor s = dev(src, from, {n});
        Tensor d = poisoned(to, {n});
        cuda::cast(gpu_ctx(), d, s);
        EXPECT_TRUE(close(std::string("cast ") + dtype_name(from) + "->" + dtype_name(to) + " n=" + std::to_string(n),
                          fetch(d), rounded(src, to), Tol{0, 0}));
      }
    }
  }
}

TEST(CudaElementwise, SwigluForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  // F = 200 and 4864 (multiples of 8): 16-byte vector path; F = 203: scalar path
  const int64_t cases[][2] = {{37, 200}, {37, 203}, {3, 4864}};
  for (const auto& nf : cases) {
    const int64_t N = nf[0], F = nf[1];
    for (DType dt : kDTypes) {
      auto gu = rounded(randn(static_cast<size_t>(N * 2 * F), 4, 2.f), dt), dout = rounded(randn(static_cast<size_t>(N * F), 5), dt);
      std::vector<float> out_ref(static_cast<size_t>(N * F)), dgu_ref(static_cast<size_t>(N * 2 * F));
      Tensor hgu = host(gu, {N, 2 * F}), hout = host(out_ref, {N, F}), hdo = host(dout, {N, F}),
             hdgu = host(dgu_ref, {N, 2 * F});
      cpu::swiglu_forward(cpu_ctx(), hout, hgu);
      cpu::swiglu_backward(cpu_ctx(), hdgu, hdo, hgu);
      Tensor dgu = dev(gu, dt, {N, 2 * F}), ddo = dev(dout, dt, {N, F});
      Tensor out = poisoned(dt, {N, F}), dgrad = poisoned(dt, {N, 2 * F});
      cuda::swiglu_forward(gpu_ctx(), out, dgu);
      cuda::swiglu_backward(gpu_ctx(), dgrad, ddo, dgu);
      const std::string f = " F=" + std::to_string(F);
      EXPECT_TRUE(close(tag("swiglu_forward", dt) + f, fetch(out), out_ref, tol_elem(dt)));
      EXPECT_TRUE(close(tag("swiglu_backward", dt) + f, fetch(dgrad), dgu_ref, tol_elem(dt)));
    }
  }
}

TEST(CudaElementwise, QkvSplitMergeExact) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t T = 19, Hq = 6, Hkv = 2, D = 32, W = (Hq + 2 * Hkv) * D;
  for (DType dt : kDTypes) {
    auto qkv = rounded(randn(static_cast<size_t>(T * W), 6), dt);
    std::vector<float> q(static_cast<size_t>(T * Hq * D)), k(static_cast<size_t>(T * Hkv * D)), v(static_cast<size_t>(T * Hkv * D));
    Tensor hqkv = host(qkv, {T, W}), hq = host(q, {T, Hq, D}), hk = host(k, {T, Hkv, D}), hv = host(v, {T, Hkv, D});
    cpu::qkv_split(cpu_ctx(), hq, hk, hv, hqkv);
    Tensor dqkv = dev(qkv, dt, {T, W});
    Tensor gq = poisoned(dt, {T, Hq, D}), gk = poisoned(dt, {T, Hkv, D}), gv = poisoned(dt, {T, Hkv, D});
    cuda::qkv_split(gpu_ctx(), gq, gk, gv, dqkv);
    EXPECT_TRUE(close(tag("qkv_split q", dt), fetch(gq), q, Tol{0, 0}));
    EXPECT_TRUE(close(tag("qkv_split k", dt), fetch(gk), k, Tol{0, 0}));
    EXPECT_TRUE(close(tag("qkv_split v", dt), fetch(gv), v, Tol{0, 0}));
    Tensor back = poisoned(dt, {T, W});
    cuda::qkv_merge(gpu_ctx(), back, gq, gk, gv);
    EXPECT_TRUE(close(tag("qkv_merge", dt), fetch(back), qkv, Tol{0, 0}));
  }
}

TEST(CudaNorm, RmsnormForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  // Paths (see cuda/norm.cu), bf16 / f32: C=96, 100(f32), 384, 896, 2048(bf16): one warp per
  // row with 1, 2, 4 or 8 vectors per lane; 2048(f32), 4096: block per row, 16-byte vectors;
  // 100(bf16), 2050: block per row, scalar. 2100 rows: more rows than backward warps
  // (several rows per warp and per block, the block count capped); 300, 64, 1: fewer.
  // The smaller launches use the first rows of the 2100-row data and must reproduce the
  // 2100-row results for those rows bit for bit (batch-composition invariance).
  const int64_t kRows[] = {2100, 300, 64, 1};
  const int64_t Nmax = kRows[0];
  for (int64_t C : {int64_t(96), int64_t(100), int64_t(384), int64_t(896), int64_t(2048), int64_t(2050), int64_t(4096)}) {
    for (DType dt : kDTypes) {
      const auto xall = rounded(randn(static_cast<size_t>(Nmax * C), 7, 1.5f), dt);
      const auto w = rounded(randn(static_cast<size_t>(C), 8), dt);
      const auto doall = rounded(randn(static_cast<size_t>(Nmax * C), 9), dt);
      const auto dw0 = randn(static_cast<size_t>(C), 10);
      std::vector<float> y_full, r_full, dx_full;
      for (int64_t N : kRows) {
        const size_t nc = static_cast<size_t>(N * C);
        auto x = std::vector<float>(xall.begin(), xall.begin() + static_cast<std::ptrdiff_t>(nc));
        auto dout = std::vector<float>(doall.begin(), doall.begin() + static_cast<std::ptrdiff_t>(nc));
        auto wv = w;
        std::vector<float> y(nc), rstd(static_cast<size_t>(N)), dx(nc), dw = dw0;
        Tensor hx = host(x, {N, C}), hw = host(wv, {C}), hy = host(y, {N, C}), hr = host(rstd, {N}),
               hdo = host(dout, {N, C}), hdx = host(dx, {N, C}), hdw = host(dw, {C});
        cpu::rmsnorm_forward(cpu_ctx(), hy, &hr, hx, hw, 1e-6f);
        cpu::rmsnorm_backward(cpu_ctx(), hdx, &hdw, hdo, hx, hw, hr);
        Tensor gx = dev(x, dt, {N, C}), gw = dev(w, dt, {C}), gdo = dev(dout, dt, {N, C});
        Tensor gy = poisoned(dt, {N, C}), gr = poisoned(DType::f32, {N}), gdx = poisoned(dt, {N, C});
        Tensor gdw = dev(dw0, DType::f32, {C});
        cuda::rmsnorm_forward(gpu_ctx(), gy, &gr, gx, gw, 1e-6f);
        cuda::rmsnorm_backward(gpu_ctx(), gdx, &gdw, gdo, gx, gw, gr);
        const std::string c = " C=" + std::to_string(C) + " N=" + std::to_string(N);
        const auto gy_h = fetch(gy), gr_h = fetch(gr), gdx_h = fetch(gdx);
        EXPECT_TRUE(close(tag("rmsnorm_forward y", dt) + c, gy_h, y, tol_reduce(dt)));
        EXPECT_TRUE(close(tag("rmsnorm_forward rstd", dt) + c, gr_h, rstd, Tol{1e-6, 1e-5}));
        EXPECT_TRUE(close(tag("rmsnorm_backward dx", dt) + c, gdx_h, dx, tol_reduce(dt)));
        EXPECT_TRUE(close(tag("rmsnorm_backward dw", dt) + c, fetch(gdw), dw,
                          dt == DType::f32 ? Tol{1e-3, 1e-4} : Tol{5e-2, 1e-2}));
        if (N == Nmax) {
          y_full = gy_h;
          r_full = gr_h;
          dx_full = gdx_h;
        } else {
          auto prefix = [](const std::vector<float>& v, size_t n) {
            return std::vector<float>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
          };
          EXPECT_TRUE(close(tag("rmsnorm_forward y rows invariant", dt) + c, gy_h, prefix(y_full, nc), Tol{0, 0}));
          EXPECT_TRUE(close(tag("rmsnorm_forward rstd rows invariant", dt) + c, gr_h,
                            prefix(r_full, static_cast<size_t>(N)), Tol{0, 0}));
          EXPECT_TRUE(close(tag("rmsnorm_backward dx rows invariant", dt) + c, gdx_h, prefix(dx_full, nc), Tol{0, 0}));
        }
        // in place (out aliases x), as the CPU allows
        cuda::rmsnorm_forward(gpu_ctx(), gx, nullptr, gx, gw, 1e-6f);
        EXPECT_TRUE(close(tag("rmsnorm_forward in place", dt) + c, fetch(gx), y, tol_reduce(dt)));
      }
      // x and out not 16-byte aligned (one element into a buffer): the scalar block path
      {
        const int64_t N = 64;
        const size_t nc = static_cast<size_t>(N * C);
        auto x = std::vector<float>(xall.begin(), xall.begin() + static_cast<std::ptrdiff_t>(nc));
        auto wv = w;
        std::vector<float> y(nc);
        Tensor hx = host(x, {N, C}), hw = host(wv, {C}), hy = host(y, {N, C});
        cpu::rmsnorm_forward(cpu_ctx(), hy, nullptr, hx, hw, 1e-6f);
        std::vector<float> xpad(nc + 1, 0.f);
        std::copy(x.begin(), x.end(), xpad.begin() + 1);
        Tensor bx = dev(xpad, dt, {int64_t(nc) + 1}), by = poisoned(dt, {int64_t(nc) + 1});
        Tensor gw = dev(w, dt, {C});
        const size_t es = dtype_size(dt);
        Tensor gx = tensor_borrow(static_cast<char*>(bx.data) + es, dt, Device::cuda, {N, C});
        Tensor gy = tensor_borrow(static_cast<char*>(by.data) + es, dt, Device::cuda, {N, C});
        cuda::rmsnorm_forward(gpu_ctx(), gy, nullptr, gx, gw, 1e-6f);
        auto got = fetch(by);
        got.erase(got.begin());
        EXPECT_TRUE(close(tag("rmsnorm_forward unaligned", dt) + " C=" + std::to_string(C), got, y, tol_reduce(dt)));
      }
    }
  }
}

TEST(CudaRope, ForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  // D = 64, 128: 16-byte vector path (D/2 a multiple of 8); D = 20: scalar path
  const int64_t P = 100, H = 5;
  for (int64_t D : {int64_t(64), int64_t(20), int64_t(128)}) {
    const int64_t half = D / 2;
    std::vector<float> cosv(static_cast<size_t>(P * half)), sinv(static_cast<size_t>(P * half));
    for (int64_t p = 0; p < P; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = double(p) * std::pow(10000.0, -2.0 * double(i) / double(D));
        cosv[static_cast<size_t>(p * half + i)] = float(std::cos(ang));
        sinv[static_cast<size_t>(p * half + i)] = float(std::sin(ang));
      }
    Tensor hc = host(cosv, {P, half}), hs = host(sinv, {P, half});
    Tensor gc = dev(cosv, DType::f32, {P, half}), gs = dev(sinv, DType::f32, {P, half});
    for (int64_t T : {int64_t(23), int64_t(1)}) {
      auto pos = randint(static_cast<size_t>(T), 0, int32_t(P), 11);
      Tensor hpos = host_i32(pos, {T}), gpos = dev_int(pos, DType::i32, {T});
      for (DType dt : kDTypes) {
        auto x = rounded(randn(static_cast<size_t>(T * H * D), 12), dt);
        auto ref = x, refb = x;
        Tensor hx = host(ref, {T, H, D}), hxb = host(refb, {T, H, D});
        cpu::rope_forward(cpu_ctx(), hx, hpos, hc, hs);
        cpu::rope_backward(cpu_ctx(), hxb, hpos, hc, hs);
        Tensor gx = dev(x, dt, {T, H, D}), gxb = dev(x, dt, {T, H, D});
        cuda::rope_forward(gpu_ctx(), gx, gpos, gc, gs);
        cuda::rope_backward(gpu_ctx(), gxb, gpos, gc, gs);
        const std::string d = " D=" + std::to_string(D) + " T=" + std::to_string(T);
        EXPECT_TRUE(close(tag("rope_forward", dt) + d, fetch(gx), ref, tol_elem(dt)));
        EXPECT_TRUE(close(tag("rope_backward", dt) + d, fetch(gxb), refb, tol_elem(dt)));
      }
    }
  }
}

TEST(CudaEmbedding, ForwardBackwardDeterministic) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t V = 50, C = 37, T = 200;  // many repeated ids
  auto ids = randint(static_cast<size_t>(T), 0, int32_t(V), 13);
  Tensor hids = host_i32(ids, {T}), gids = dev_int(ids, DType::i32, {T});
  for (DType dt : kDTypes) {
    for (int64_t c : {C, int64_t(64)}) {  // odd C: scalar path; 64: 16-byte vector path
      auto table = rounded(randn(static_cast<size_t>(V * c), 14), dt), dout = rounded(randn(static_cast<size_t>(T * c), 15), dt);
      auto dt0 = randn(static_cast<size_t>(V * c), 16);
      std::vector<float> out(static_cast<size_t>(T * c)), dtab = dt0;
      Tensor ht = host(table, {V, c}), ho = host(out, {T, c}), hdo = host(dout, {T, c}), hdt = host(dtab, {V, c});
      cpu::gather_rows_forward(cpu_ctx(), ho, ht, hids);
      cpu::gather_rows_backward(cpu_ctx(), hdt, hdo, hids, true);
      Tensor gt = dev(table, dt, {V, c}), go = poisoned(dt, {T, c}), gdo = dev(dout, dt, {T, c});
      Tensor gdt = dev(dt0, DType::f32, {V, c});
      cuda::gather_rows_forward(gpu_ctx(), go, gt, gids);
      cuda::gather_rows_backward(gpu_ctx(), gdt, gdo, gids, true);
      const std::string s = " C=" + std::to_string(c);
      EXPECT_TRUE(close(tag("embedding_forward", dt) + s, fetch(go), out, Tol{0, 0}));
      // same summation order as the CPU (tokens in order per row): equal bit for bit
      EXPECT_TRUE(close(tag("embedding_backward", dt) + s, fetch(gdt), dtab, Tol{0, 0}));
    }
  }
}

TEST(CudaGather, ForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t T = 30, C = 48, R = 45;
  auto rows = randint(static_cast<size_t>(R), 0, int32_t(T), 17);
  Tensor hrows = host_i32(rows, {R}), grows = dev_int(rows, DType::i32, {R});
  for (DType dt : kDTypes) {
    auto x = rounded(randn(static_cast<size_t>(T * C), 18), dt), dout = rounded(randn(static_cast<size_t>(R * C), 19), dt);
    std::vector<float> out(static_cast<size_t>(R * C)), dx(static_cast<size_t>(T * C));
    Tensor hx = host(x, {T, C}), ho = host(out, {R, C}), hdo = host(dout, {R, C}), hdx = host(dx, {T, C});
    cpu::gather_rows_forward(cpu_ctx(), ho, hx, hrows);
    cpu::gather_rows_backward(cpu_ctx(), hdx, hdo, hrows, false);
    Tensor gx = dev(x, dt, {T, C}), go = poisoned(dt, {R, C}), gdo = dev(dout, dt, {R, C}), gdx = poisoned(dt, {T, C});
    cuda::gather_rows_forward(gpu_ctx(), go, gx, grows);
    cuda::gather_rows_backward(gpu_ctx(), gdx, gdo, grows, false);
    EXPECT_TRUE(close(tag("gather_rows_forward", dt), fetch(go), out, Tol{0, 0}));
    EXPECT_TRUE(close(tag("gather_rows_backward", dt), fetch(gdx), dt == DType::f32 ? dx : rounded(dx, dt), Tol{0, 0}));
  }
}

TEST(CudaGather, IdsMatchTheCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t N = 1000, R = 77;
  auto table = randint(size_t(N), 0, 151936, 21), idx = randint(size_t(R), 0, int32_t(N), 22);
  std::vector<int32_t> out(static_cast<size_t>(R));
  Tensor ho = host_i32(out, {R});
  cpu::gather_ids(cpu_ctx(), ho, host_i32(table, {N}), host_i32(idx, {R}));
  Tensor go = dev_int(std::vector<int32_t>(size_t(R), -1), DType::i32, {R});
  cuda::gather_ids(gpu_ctx(), go, dev_int(table, DType::i32, {N}), dev_int(idx, DType::i32, {R}));
  EXPECT_EQ(fetch_i32(go), out);
  for (int64_t r = 0; r < R; ++r) EXPECT_EQ(out[size_t(r)], table[size_t(idx[size_t(r)])]);
}

TEST(CudaLinear, ForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t M = 67, K = 136, N = 90;
  for (DType dt : kDTypes) {
    auto x = rounded(randn(static_cast<size_t>(M * K), 20), dt), w = rounded(randn(static_cast<size_t>(N * K), 21, 0.1f), dt);
    auto b = rounded(randn(static_cast<size_t>(N), 22), dt), dout = rounded(randn(static_cast<size_t>(M * N), 23), dt);
    auto out0 = rounded(randn(static_cast<size_t>(M * N), 24), dt), dx0 = rounded(randn(static_cast<size_t>(M * K), 25), dt);
    auto dw0 = randn(static_cast<size_t>(N * K), 26), db0 = randn(static_cast<size_t>(N), 27);
    const Tol tol = dt == DType::f32 ? Tol{1e-4, 1e-4} : Tol{2e-2, 1e-2};
    for (int mode = 0; mode < 3; ++mode) {  // 0: plain, 1: bias, 2: bias + accumulate
      std::vector<float> out = mode == 2 ? out0 : std::vector<float>(static_cast<size_t>(M * N));
      Tensor hx = host(x, {M, K}), hw = host(w, {N, K}), hb = host(b, {N}), ho = host(out, {M, N});
      cpu::linear_forward(cpu_ctx(), ho, hx, hw, mode ? &hb : nullptr, mode == 2);
      Tensor gx = dev(x, dt, {M, K}), gw = dev(w, dt, {N, K}), gb = dev(b, dt, {N});
      Tensor go = mode == 2 ? dev(out0, dt, {M, N}) : poisoned(dt, {M, N});
      cuda::linear_forward(gpu_ctx(), go, gx, gw, mode ? &gb : nullptr, mode == 2);
      EXPECT_TRUE(close(tag("linear_forward", dt) + " mode " + std::to_string(mode), fetch(go), out, tol));
      // f32 output from bf16 operands, with an f32 bias (separate bias kernel)
      if (dt == DType::bf16 && mode == 1) {
        Tensor go32 = poisoned(DType::f32, {M, N}), gb32 = dev(b, DType::f32, {N});
        cuda::linear_forward(gpu_ctx(), go32, gx, gw, &gb32, false);
        EXPECT_TRUE(close("linear_forward [bf16 -> f32 out]", fetch(go32), out, Tol{1e-3, 1e-3}));
      }
    }
    for (int acc = 0; acc < 2; ++acc) {
      std::vector<float> dx = acc ? dx0 : std::vector<float>(static_cast<size_t>(M * K)), dw = dw0, db = db0;
      Tensor hx = host(x, {M, K}), hw = host(w, {N, K}), hdo = host(dout, {M, N}), hdx = host(dx, {M, K}),
             hdw = host(dw, {N, K}), hdb = host(db, {N});
      cpu::linear_backward(cpu_ctx(), &hdx, &hdw, &hdb, hdo, hx, hw, acc == 1);
      Tensor gx = dev(x, dt, {M, K}), gw = dev(w, dt, {N, K}), gdo = dev(dout, dt, {M, N});
      Tensor gdx = acc ? dev(dx0, dt, {M, K}) : poisoned(dt, {M, K});
      Tensor gdw = dev(dw0, DType::f32, {N, K}), gdb = dev(db0, DType::f32, {N});
      cuda::linear_backward(gpu_ctx(), &gdx, &gdw, &gdb, gdo, gx, gw, acc == 1);
      const std::string s = acc ? " accumulate" : "";
      EXPECT_TRUE(close(tag("linear_backward dx", dt) + s, fetch(gdx), dx, tol));
      EXPECT_TRUE(close(tag("linear_backward dw", dt) + s, fetch(gdw), dw, Tol{1e-3, 1e-4}));
      EXPECT_TRUE(close(tag("linear_backward db", dt) + s, fetch(gdb), db, Tol{1e-3, 1e-4}));
    }
  }
}

#else
TEST(Cuda, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
