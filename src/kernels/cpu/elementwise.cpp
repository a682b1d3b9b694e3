// CPU elementwise ops, f32 (cast also handles bf16/f16).
//   swiglu: out = silu(g)·u, silu(g) = g·σ(g);  d/dg silu = σ(g)·(1 + g·(1 − σ(g))).
#include "kernels/elementwise.h"

#include <cmath>
#include <cstring>

namespace grpo::cpu {

void add_inplace(Context& ctx, Tensor& a, const Tensor& b) {
  float* A = a.ptr<float>();
  const float* B = b.ptr<float>();
  ctx.parallel_for(a.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) A[i] += B[i];
  }, 1 << 14);
}

void scale_inplace(Context& ctx, Tensor& x, float s) {
  float* X = x.ptr<float>();
  ctx.parallel_for(x.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) X[i] *= s;
  }, 1 << 14);
}

void cast(Context& ctx, Tensor& dst, const Tensor& src) {
  const size_t ds = dtype_size(dst.dtype), ss = dtype_size(src.dtype);
  ctx.parallel_for(src.numel(), [&](int64_t i0, int64_t i1) {
    convert_host(static_cast<char*>(dst.data) + size_t(i0) * ds, dst.dtype,
                 static_cast<const char*>(src.data) + size_t(i0) * ss, src.dtype, size_t(i1 - i0));
  }, 1 << 14);
}

void swiglu_forward(Context& ctx, Tensor& out, const Tensor& gate_up) {
  const int64_t N = out.shape[0], F = out.shape[1];
  const float* GU = gate_up.ptr<float>();
  float* O = out.ptr<float>();
  ctx.parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = GU + r * 2 * F;
      const float* u = g + F;
      for (int64_t j = 0; j < F; ++j) O[r * F + j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
    }
  }, 4);
}

void swiglu_backward(Context& ctx, Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t N = dout.shape[0], F = dout.shape[1];
  const float* GU = gate_up.ptr<float>();
  const float* DO = dout.ptr<float>();
  float* DGU = dgate_up.ptr<float>();
  ctx.parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = GU + r * 2 * F;
      const float* u = g + F;
      float* dg = DGU + r * 2 * F;
      float* du = dg + F;
      for (int64_t j = 0; j < F; ++j) {
        const float sig = 1.f / (1.f + std::exp(-g[j]));
        const float d = DO[r * F + j];
        dg[j] = d * u[j] * sig * (1.f + g[j] * (1.f - sig));
        du[j] = d * g[j] * sig;
      }
    }
  }, 4);
}

void qkv_split(Context& ctx, Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  const int64_t T = qkv.shape[0], nq = q.numel() / (T ? T : 1), nk = k.numel() / (T ? T : 1);
  const int64_t W = nq + 2 * nk;
  const float* S = qkv.ptr<float>();
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(q.ptr<float>() + t * nq, S + t * W, size_t(nq) * 4);
      std::memcpy(k.ptr<float>() + t * nk, S + t * W + nq, size_t(nk) * 4);
      std::memcpy(v.ptr<float>() + t * nk, S + t * W + nq + nk, size_t(nk) * 4);
    }
  }, 16);
}

void qkv_merge(Context& ctx, Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t T = dqkv.shape[0], nq = dq.numel() / (T ? T : 1), nk = dk.numel() / (T ? T : 1);
  const int64_t W = nq + 2 * nk;
  float* S = dqkv.ptr<float>();
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(S + t * W, dq.ptr<float>() + t * nq, size_t(nq) * 4);
      std::memcpy(S + t * W + nq, dk.ptr<float>() + t * nk, size_t(nk) * 4);
      std::memcpy(S + t * W + nq + nk, dv.ptr<float>() + t * nk, size_t(nk) * 4);
    }
  }, 16);
}

}  // namespace grpo::cpu
