// CUDA vs CPU parity for the training ops: fused LM-head token logprobs (forward with
// lse/entropy, backward with dh and accumulated dw), AdamW, sum of squares.
#include "cuda_test_util.h"

#ifdef GRPO_HAVE_CUDA
#include "kernels/logprob.h"
#include "kernels/optim.h"

using namespace grpo;
using namespace grpo::cudatest;

TEST(CudaLogprob, ForwardBackward) {
  GRPO_SKIP_WITHOUT_CUDA();
  // V = 9000: two full 4096-entry chunks and a partial one; N = 37 rows.
  const int64_t N = 37, C = 64, V = 9000;
  for (float temp : {1.0f, 0.7f}) {
    for (DType dt : kDTypes) {
      const std::string nm = tag("token_logprobs", dt) + " T=" + std::to_string(temp);
      auto h = rounded(randn(static_cast<size_t>(N * C), 30), dt), w = rounded(randn(static_cast<size_t>(V * C), 31, 0.3f), dt);
      // distinct targets (a shared target column would let bf16 rounding of da show
      // up unscaled where contributions cancel in dw)
      std::vector<int32_t> tg(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) tg[static_cast<size_t>(i)] = int32_t((i * 241 + 7) % V);
      tg[0] = 0;
      tg[1] = int32_t(V - 1);
      tg[2] = 4096;  // first entry of the second chunk
      auto dlogp = randn(static_cast<size_t>(N), 33);
      auto dw0 = randn(static_cast<size_t>(V * C), 34, 0.01f);
      std::vector<float> lp(static_cast<size_t>(N)), lse(static_cast<size_t>(N)), ent(static_cast<size_t>(N)), dh(static_cast<size_t>(N * C)), dw = dw0;
      Tensor hh = host(h, {N, C}), hw = host(w, {V, C}), htg = host_i32(tg, {N}), hlp = host(lp, {N}),
             hlse = host(lse, {N}), hent = host(ent, {N}), hdl = host(dlogp, {N}), hdh = host(dh, {N, C}),
             hdw = host(dw, {V, C});
      cpu::token_logprobs_forward(cpu_ctx(), hlp, hlse, &hent, hh, hw, htg, temp);
      cpu::token_logprobs_backward(cpu_ctx(), hdh, &hdw, hdl, hh, hw, htg, hlse, temp);

      Tensor gh = dev(h, dt, {N, C}), gw = dev(w, dt, {V, C}), gtg = dev_int(tg, DType::i32, {N});
      Tensor glp = poisoned(DType::f32, {N}), glse = poisoned(DType::f32, {N}), gent = poisoned(DType::f32, {N});
      cuda::token_logprobs_forward(gpu_ctx(), glp, glse, &gent, gh, gw, gtg, temp);
      // Same rounded operands, f32 accumulation on both sides: f32-level agreement.
      EXPECT_TRUE(close(nm + " logp", fetch(glp), lp, Tol{1e-4, 1e-5}));
      EXPECT_TRUE(close(nm + " lse", fetch(glse), lse, Tol{1e-4, 1e-5}));
      EXPECT_TRUE(close(nm + " entropy", fetch(gent), ent, Tol{1e-4, 1e-4}));

      Tensor gdl = dev(dlogp, DType::f32, {N}), gdh = poisoned(dt, {N, C}), gdw = dev(dw0, DType::f32, {V, C});
      cuda::token_logprobs_backward(gpu_ctx(), gdh, &gdw, gdl, gh, gw, gtg, glse, temp);
      // bf16: the GEMM operand da is rounded to bf16 (a documented precision choice).
      const Tol tg_tol = dt == DType::f32 ? Tol{1e-5, 1e-4} : Tol{2e-3, 2e-2};
      EXPECT_TRUE(close(nm + " dh", fetch(gdh), dh, tg_tol));
      EXPECT_TRUE(close(nm + " dw", fetch(gdw), dw, tg_tol));
      // dh in f32 from bf16 operands (accumulated straight into dh)
      if (dt == DType::bf16) {
        Tensor gdh32 = poisoned(DType::f32, {N, C});
        cuda::token_logprobs_backward(gpu_ctx(), gdh32, nullptr, gdl, gh, gw, gtg, glse, temp);
        EXPECT_TRUE(close(nm + " dh (f32 out)", fetch(gdh32), dh, tg_tol));
      }
    }
  }
}

TEST(CudaOptim, AdamWMatchesCpu) {
  GRPO_SKIP_WITHOUT_CUDA();
  const int64_t n = 100003;
  AdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;
  for (DType pdt : {DType::f32, DType::bf16}) {
    auto master = randn(static_cast<size_t>(n), 40), grad = randn(static_cast<size_t>(n), 41), m = randn(static_cast<size_t>(n), 42, 0.1f);
    auto v = randn(static_cast<size_t>(n), 43, 0.1f);
    for (float& x : v) x = x * x;
    std::vector<float> hm_ = master, hmm = m, hv = v, hparam(static_cast<size_t>(n));
    Tensor tm = host(hm_, {n}), tg = host(grad, {n}), tmm = host(hmm, {n}), tv = host(hv, {n});
    Tensor gm = dev(master, DType::f32, {n}), gg = dev(grad, DType::f32, {n}), gmm = dev(m, DType::f32, {n}),
           gv = dev(v, DType::f32, {n});
    Tensor gparam = poisoned(pdt, {n});
    for (int64_t step = 1; step <= 3; ++step) {
      p.step = step;
      cpu::adamw_step(cpu_ctx(), tm, tm, tg, tmm, tv, p);
      if (pdt == DType::f32) cuda::adamw_step(gpu_ctx(), gm, gm, gg, gmm, gv, p);  // param aliases master
      else cuda::adamw_step(gpu_ctx(), gm, gparam, gg, gmm, gv, p);
    }
    const std::string nm = std::string("adamw_step [param ") + dtype_name(pdt) + "]";
    // Operation-by-operation the same f32 arithmetic as the CPU: expected equal (tiny slack
    // in case the host compiler contracted an FMA).
    EXPECT_TRUE(close(nm + " master", fetch(gm), hm_, Tol{1e-7, 1e-6}));
    EXPECT_TRUE(close(nm + " m", fetch(gmm), hmm, Tol{1e-7, 1e-6}));
    EXPECT_TRUE(close(nm + " v", fetch(gv), hv, Tol{1e-7, 1e-6}));
    if (pdt == DType::bf16) EXPECT_TRUE(close(nm + " param", fetch(gparam), rounded(hm_, pdt), Tol{1e-7, 8e-3}));
  }
}

TEST(CudaOptim, SumSquaresDeterministic) {
  GRPO_SKIP_WITHOUT_CUDA();
  for (int64_t n : {int64_t(1), int64_t(65536), int64_t(1000003)}) {
    auto g = randn(static_cast<size_t>(n), 50);
    Tensor hg = host(g, {n});
    const double ref = cpu::sum_squares(cpu_ctx(), hg);
    Tensor gg = dev(g, DType::f32, {n});
    const double a = cuda::sum_squares(gpu_ctx(), gg), b = cuda::sum_squares(gpu_ctx(), gg);
    EXPECT_NEAR(a, ref, 1e-9 * std::fabs(ref)) << "sum_squares n=" << n;
    EXPECT_EQ(a, b) << "sum_squares must repeat exactly, n=" << n;
    Tensor gb = dev(rounded(g, DType::bf16), DType::bf16, {n});
    auto gr = rounded(g, DType::bf16);
    Tensor hgr = host(gr, {n});
    EXPECT_NEAR(cuda::sum_squares(gpu_ctx(), gb), cpu::sum_squares(cpu_ctx(), hgr), 1e-9 * std::fabs(ref)) << "bf16 n=" << n;
  }
}

#else
TEST(CudaTrain, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }
#endif
