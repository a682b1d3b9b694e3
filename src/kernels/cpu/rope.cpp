// CPU rotary embedding, rotate_half convention: for i < D/2 the pair is
// (x[i], x[i+D/2]) rotated by θ = angle(pos, i):
//   x[i]' = x[i]·cos − x[i+D/2]·sin,  x[i+D/2]' = x[i+D/2]·cos + x[i]·sin.
// The backward is the transpose of that rotation, i.e. the rotation by −θ.
// The fused cache writes are rope_forward followed by kv_cache_write, so an
// f8e4m3 cache receives the rotated f32 rows converted exactly as kv_cache_write
// converts them.
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace grpo::cpu {

namespace {
void rope_rotate(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, float sign) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2], half = D / 2;
  const int32_t* P = positions.ptr<int32_t>();
  const float* CO = cos.ptr<float>();
  const float* SI = sin.ptr<float>();
  float* X = x.ptr<float>();
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = CO + int64_t(P[t]) * half;
      const float* s = SI + int64_t(P[t]) * half;
      for (int64_t h = 0; h < H; ++h) {
        float* v = X + (t * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half], si = sign * s[i];
          v[i] = a * c[i] - b * si;
          v[i + half] = b * c[i] + a * si;
        }
      }
    }
  }, 8);
}
}  // namespace

void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_rotate(ctx, x, positions, cos, sin, 1.f);
}

void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_rotate(ctx, dx, positions, cos, sin, -1.f);
}

void rope_qk_cache_write(Context& ctx, Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& cos, const Tensor& sin, Tensor& k_cache, Tensor& v_cache,
                         const PagedAttnMeta& meta) {
  cpu::rope_forward(ctx, q, positions, cos, sin);
  cpu::rope_forward(ctx, k, positions, cos, sin);
  cpu::kv_cache_write(ctx, k_cache, v_cache, k, v, meta);
}

void rope_qkv_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                          const Tensor& sin, Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  const int64_t T_ = q.shape[0], Hkv = k_cache.shape[2], D = q.shape[2];
  Tensor k = tensor_empty(Device::cpu, q.dtype, {T_, Hkv, D}), v = tensor_empty(Device::cpu, q.dtype, {T_, Hkv, D});
  cpu::qkv_split(ctx, q, k, v, qkv);
  cpu::rope_qk_cache_write(ctx, q, k, v, positions, cos, sin, k_cache, v_cache, meta);
}

void qk_norm_rope_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                              float eps, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                              Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  const int64_t T_ = q.shape[0], Hq = q.shape[1], Hkv = k_cache.shape[2], D = q.shape[2];
  Tensor qr = tensor_empty(Device::cpu, q.dtype, {T_, Hq, D});
  Tensor k = tensor_empty(Device::cpu, q.dtype, {T_, Hkv, D}), v = tensor_empty(Device::cpu, q.dtype, {T_, Hkv, D});
  Tensor kn = tensor_empty(Device::cpu, q.dtype, {T_, Hkv, D});
  cpu::qkv_split(ctx, qr, k, v, qkv);
  Tensor q2 = q.view({T_ * Hq, D}), k2 = kn.view({T_ * Hkv, D});
  cpu::rmsnorm_forward(ctx, q2, nullptr, qr.view({T_ * Hq, D}), q_norm, eps);
  cpu::rmsnorm_forward(ctx, k2, nullptr, k.view({T_ * Hkv, D}), k_norm, eps);
  cpu::rope_qk_cache_write(ctx, q, kn, v, positions, cos, sin, k_cache, v_cache, meta);
}

}  // namespace grpo::cpu
