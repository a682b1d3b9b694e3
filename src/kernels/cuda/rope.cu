// CUDA rotary embedding (rotate_half convention, as cpu/rope.cpp); the backward is the
// rotation by −θ. In place.
// Layout: one thread per (token, head, chunk of E pairs): the thread rotates x[i] with
// x[i + D/2] for the E consecutive i of its chunk. Vector path (E = 8 for bf16, 4 for f32:
// 16 bytes of x per half) when D/2 % E == 0 and x, cos and sin are 16-byte aligned; it then
// reads 2 × 16 bytes of x, E cos and E sin (float4 loads, shared by the heads of a token,
// so mostly L1/L2 hits) and writes 2 × 16 bytes. Otherwise E = 1 (scalar). Flat grid-stride
// loop over T·H·(D/2)/E with 32-bit index arithmetic when that fits, 64-bit otherwise.
// rope_qk_cache_write fuses rope(q), rope(k) and the k/v cache write of one engine layer:
// one flat loop over T·(Hq + 2·Hkv)·(D/2)/E items — q chunks rotated in place, k chunks
// rotated in place and copied to the token's cache slot, v chunks copied — with the same
// arithmetic as rope_kernel (bit-identical results). Vector path only; else the three ops.
// qk_norm_rope_cache_write (Qwen3): one warp per (token, head of q, k or v) of the fused
// qkv rows; a lane holds D/32 consecutive elements, the head's Σx² is a warp butterfly sum,
// y = w·(x·r) is rounded to the storage dtype as the RMSNorm op does, and the rotate_half
// partner of lane l is lane l ^ 16. D = 64 or 128; other head dims take the unfused ops.
// rope_qkv_cache_write does the same reading q/k/v straight from the fused qkv projection
// rows (no qkv_split launch).
// Products are rounded separately (__fmul_rn) so that f32 results match the CPU
// reference, which does not contract a·c − b·s into an FMA. Each element's result depends
// only on its own inputs, so E and the grid do not change any value.
// FP8 caches (kv_cache_dtype = fp8; cache element type CT = e4m3_t, q/k/v bf16 or f32): the
// fused writes compute every k/v element exactly as for a cache of the model dtype, round it
// to that dtype, then store it as E4M3 (RN, satfinite): byte for byte the unfused ops'
// cache row converted by kv_cache_write.
#include <type_traits>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/validate.h"

namespace grpo::cuda {

namespace {

constexpr int kThreads = 256;

// E floats of a cos/sin table row (E = 1, or a multiple of 4 at a 16-byte aligned p).
template <int E> __device__ __forceinline__ void load_table(const float* __restrict__ p, float* f) {
  if constexpr (E == 1) {
    f[0] = __ldg(p);
  } else {
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + q);
      f[4 * q] = v.x; f[4 * q + 1] = v.y; f[4 * q + 2] = v.z; f[4 * q + 3] = v.w;
    }
  }
}

// I: index type (uint32_t when T·H·chunks plus one grid stride fits, else int64_t).
template <class T, int E, class I>
__global__ void __launch_bounds__(kThreads)
rope_kernel(T* __restrict__ x, const int32_t* __restrict__ pos, const float* __restrict__ cos_t,
            const float* __restrict__ sin_t, I total, I H, I nchunk, int64_t half, float sign) {
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < total; idx += I(gridDim.x) * I(blockDim.x)) {
    const I th = idx / nchunk;  // t·H + h
    const int64_t i0 = int64_t(idx - th * nchunk) * E;
    const I t = th / H;
    const int64_t p = __ldg(pos + t);
    T* v = x + int64_t(th) * 2 * half;
    float a[E], b[E], c[E], s[E];
    load_elems<T, E>(v + i0, a);
    load_elems<T, E>(v + half + i0, b);
    load_table<E>(cos_t + p * half + i0, c);
    load_table<E>(sin_t + p * half + i0, s);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float se = sign * s[e];
      const float ya = __fsub_rn(__fmul_rn(a[e], c[e]), __fmul_rn(b[e], se));
      const float yb = __fadd_rn(__fmul_rn(b[e], c[e]), __fmul_rn(a[e], se));
      a[e] = ya;
      b[e] = yb;
    }
    store_elems<T, E>(v + i0, a);
    store_elems<T, E>(v + half + i0, b);
  }
}

template <class T, int E>
void rope_launch_e(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, int64_t T_,
                   int64_t H, int64_t half, float sign) {
  const int64_t nchunk = half / E, total = T_ * H * nchunk;
  const unsigned grid = flat_grid(total, kThreads);
  const int64_t stride = int64_t(grid) * kThreads;
  if (total + stride <= int64_t(0xffffffffu))
    rope_kernel<T, E, uint32_t><<<grid, kThreads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), positions.ptr<int32_t>(), cos.ptr<float>(), sin.ptr<float>(), uint32_t(total), uint32_t(H),
        uint32_t(nchunk), half, sign);
  else
    rope_kernel<T, E, int64_t><<<grid, kThreads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), positions.ptr<int32_t>(), cos.ptr<float>(), sin.ptr<float>(), total, H, nchunk, half, sign);
}

void rope_launch(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, float sign) {
  GRPO_CHECK_MSG(x.ndim == 3, "rope: x must be (T,H,D)");
  const int64_t T_ = x.shape[0], H = x.shape[1], D = x.shape[2];
  GRPO_CHECK_MSG(D % 2 == 0, "rope: D must be even");
  const int64_t half = D / 2;
  GRPO_CHECK_MSG(positions.numel() == T_ && positions.dtype == DType::i32, "rope: positions must be (T) i32");
  GRPO_CHECK_MSG(cos.ndim == 2 && cos.shape[1] == half && cos.dtype == DType::f32, "rope: cos must be (P, D/2) f32");
  GRPO_CHECK_MSG(sin.ndim == 2 && sin.shape[1] == half && sin.dtype == DType::f32, "rope: sin must be (P, D/2) f32");
  if (T_ * H * half == 0) return;
  GRPO_DISPATCH_FLOAT(x.dtype, T, {
    constexpr int V = Vec16<T>::n;
    if (half % V == 0 && aligned16(x.data) && aligned16(cos.data) && aligned16(sin.data))
      rope_launch_e<T, V>(ctx, x, positions, cos, sin, T_, H, half, sign);
    else
      rope_launch_e<T, 1>(ctx, x, positions, cos, sin, T_, H, half, sign);
  });
  CUDA_CHECK_LAUNCH();
}

// E consecutive cache elements (E = 2, 4 or 8; p E-byte aligned) of an FP8 cache from f32
// results of T's arithmetic: each rounded to T (as a cache of T would store it), then to
// E4M3 (RN, satfinite); one E-byte store.
template <class T, int E>
__device__ __forceinline__ void store_e4m3(e4m3_t* p, const float* f) {
  static_assert(E == 2 || E == 4 || E == 8, "2, 4 or 8 elements");
  float r[E];
#pragma unroll
  for (int e = 0; e < E; ++e) r[e] = to_f32(from_f32<T>(f[e]));
  if constexpr (E == 2) {
    *reinterpret_cast<uint16_t*>(p) = f32x2_to_e4m3x2(r[0], r[1]);
  } else {
    uint32_t w[E / 4];
#pragma unroll
    for (int j = 0; j < E / 4; ++j)
      w[j] = uint32_t(f32x2_to_e4m3x2(r[4 * j], r[4 * j + 1])) | (uint32_t(f32x2_to_e4m3x2(r[4 * j + 2], r[4 * j + 3])) << 16);
    if constexpr (E == 4) *reinterpret_cast<uint32_t*>(p) = w[0];
    else *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
}

// E cache elements at p from f32 results: store_elems for a cache of T, store_e4m3 for FP8.
template <class T, class CT, int E>
__device__ __forceinline__ void store_cache(CT* p, const float* f) {
  if constexpr (std::is_same_v<CT, T>) store_elems<T, E>(p, f);
  else store_e4m3<T, E>(p, f);
}

template <class T, int E>
__device__ __forceinline__ void rotate_chunk(float* a, float* b, const float* c, const float* s) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float ya = __fsub_rn(__fmul_rn(a[e], c[e]), __fmul_rn(b[e], s[e]));
    const float yb = __fadd_rn(__fmul_rn(b[e], c[e]), __fmul_rn(a[e], s[e]));
    a[e] = ya;
    b[e] = yb;
  }
}

// Sources with a token stride (rows of a fused qkv, or separate q/k/v tensors); q lands in
// q_dst (T,Hq,D); rotated k in k_dst (T,Hkv,D) when given, and in its cache slot.
struct RopeCacheArgs {
  const void *q_src, *k_src, *v_src;
  int64_t sq, sk, sv;  // token strides of the sources, in elements
  void *q_dst, *k_dst;  // k_dst may be null
  void *kc, *vc;
  const int32_t *pos, *slots;
  const float *cos_t, *sin_t;
};

// CT: the cache element type (T, or e4m3_t for an FP8 cache).
template <class T, class CT, int E>
__global__ void __launch_bounds__(kThreads)
rope_qk_cache_kernel(RopeCacheArgs a, uint32_t total, uint32_t Hq, uint32_t Hkv, uint32_t nchunk, int64_t half) {
  pdl_trigger();  // launched with launch_pdl (cuda_check.cuh)
  pdl_wait();
  const uint32_t Hall = Hq + 2 * Hkv;
  const int64_t D = 2 * half;
  const T* qs = static_cast<const T*>(a.q_src);
  const T* ks = static_cast<const T*>(a.k_src);
  const T* vs = static_cast<const T*>(a.v_src);
  CT* kc = static_cast<CT*>(a.kc);
  CT* vc = static_cast<CT*>(a.vc);
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    const uint32_t th = idx / nchunk;
    const int64_t i0 = int64_t(idx - th * nchunk) * E;
    const uint32_t t = th / Hall, h = th - t * Hall;
    const int64_t slot = __ldg(a.slots + t);
    float x0[E], x1[E];
    if (h >= Hq + Hkv) {  // v: copy to the cache slot
      if (slot < 0) continue;
      const uint32_t j = h - Hq - Hkv;
      const T* src = vs + int64_t(t) * a.sv + int64_t(j) * D;
      CT* dst = vc + (slot * Hkv + j) * D;
      load_elems<T, E>(src + i0, x0);
      load_elems<T, E>(src + half + i0, x1);
      store_cache<T, CT, E>(dst + i0, x0);
      store_cache<T, CT, E>(dst + half + i0, x1);
      continue;
    }
    const int64_t p = __ldg(a.pos + t);
    float c[E], sn[E];
    load_table<E>(a.cos_t + p * half + i0, c);
    load_table<E>(a.sin_t + p * half + i0, sn);
    const bool is_q = h < Hq;
    const uint32_t j = is_q ? h : h - Hq;
    const T* src = is_q ? qs + int64_t(t) * a.sq + int64_t(j) * D : ks + int64_t(t) * a.sk + int64_t(j) * D;
    load_elems<T, E>(src + i0, x0);
    load_elems<T, E>(src + half + i0, x1);
    rotate_chunk<T, E>(x0, x1, c, sn);
    T* dst = is_q ? static_cast<T*>(a.q_dst) + (int64_t(t) * Hq + j) * D
                  : (a.k_dst ? static_cast<T*>(a.k_dst) + (int64_t(t) * Hkv + j) * D : nullptr);
    if (dst) {
      store_elems<T, E>(dst + i0, x0);
      store_elems<T, E>(dst + half + i0, x1);
    }
    if (!is_q && slot >= 0) {
      CT* cd = kc + (slot * Hkv + j) * D;
      store_cache<T, CT, E>(cd + i0, x0);
      store_cache<T, CT, E>(cd + half + i0, x1);
    }
  }
}

// Launches the fused kernel when the vector path applies; false otherwise. dt: q/k/v;
// cache_dt: the caches (dt or f8e4m3).
bool rope_cache_fused(Context& ctx, const RopeCacheArgs& a, DType dt, DType cache_dt, int64_t T_, int64_t Hq,
                      int64_t Hkv, int64_t D, bool aligned) {
  const int64_t half = D / 2;
  bool done = false;
  GRPO_DISPATCH_FLOAT(dt, T, {
    constexpr int V = Vec16<T>::n;
    const int64_t nchunk = half / V, total = T_ * (Hq + 2 * Hkv) * nchunk;
    if (aligned && half % V == 0 && total < int64_t(1) << 30) {
      const dim3 grid(flat_grid(total, kThreads));
      if (cache_dt == DType::f8e4m3)
        launch_pdl(ctx, rope_qk_cache_kernel<T, e4m3_t, V>, grid, dim3(kThreads), 0, a, uint32_t(total),
                   uint32_t(Hq), uint32_t(Hkv), uint32_t(nchunk), half);
      else
        launch_pdl(ctx, rope_qk_cache_kernel<T, T, V>, grid, dim3(kThreads), 0, a, uint32_t(total), uint32_t(Hq),
                   uint32_t(Hkv), uint32_t(nchunk), half);
      CUDA_CHECK_LAUNCH();
      done = true;
    }
  });
  return done;
}

// The caches of a fused write: one dtype, q's or f8e4m3 (msg: the failure message).
void check_cache_dtype(const char* msg, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache) {
  GRPO_CHECK_MSG(detail::kv_cache_dtype_ok(k_cache, v_cache, q.dtype), msg);
}

template <class T, int EPL>
__device__ __forceinline__ void load_lane(const T* p, float* f) {
#pragma unroll
  for (int e = 0; e < EPL; ++e) f[e] = to_f32(p[e]);
}

// CT: the cache element type (T, or e4m3_t for an FP8 cache).
template <class T, class CT, int EPL>
__global__ void __launch_bounds__(256)
qk_norm_rope_cache_kernel(RopeCacheArgs a, const T* __restrict__ wq, const T* __restrict__ wk, float eps,
                          int64_t n_warps, int Hq, int Hkv) {
  pdl_trigger();  // launched with launch_pdl (cuda_check.cuh)
  pdl_wait();
  constexpr int D = 32 * EPL, half = D / 2;
  const int64_t gw = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (gw >= n_warps) return;
  const int lane = threadIdx.x & 31;
  const int Hall = Hq + 2 * Hkv;
  const int64_t t = gw / Hall;
  const int h = int(gw - t * Hall);
  const int64_t slot = __ldg(a.slots + t);
  const T* row = static_cast<const T*>(a.q_src) + t * a.sq;  // fused rows: q, k, v sources share the row
  float x[EPL];
  if (h >= Hq + Hkv) {  // v
    if (slot < 0) return;
    const int j = h - Hq - Hkv;
    const T* src = row + int64_t(Hq + Hkv + j) * D + lane * EPL;
    CT* dst = static_cast<CT*>(a.vc) + (slot * Hkv + j) * D + lane * EPL;
    if constexpr (std::is_same_v<CT, T>) {
#pragma unroll
      for (int e = 0; e < EPL; ++e) dst[e] = src[e];
    } else {
      load_lane<T, EPL>(src, x);
      store_e4m3<T, EPL>(dst, x);
    }
    return;
  }
  const bool is_q = h < Hq;
  const T* w = is_q ? wq : wk;
  load_lane<T, EPL>(row + int64_t(h) * D + lane * EPL, x);
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < EPL; ++e) ss += x[e] * x[e];
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int e = 0; e < EPL; ++e) x[e] = to_f32(from_f32<T>(to_f32(w[lane * EPL + e]) * (x[e] * r)));
  const int64_t p = __ldg(a.pos + t);
  const int i0 = (lane & 15) * EPL;  // index within the half
  float y[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const float other = __shfl_xor_sync(0xffffffffu, x[e], 16);
    const float c = __ldg(a.cos_t + p * half + i0 + e), sn = __ldg(a.sin_t + p * half + i0 + e);
    y[e] = lane < 16 ? __fsub_rn(__fmul_rn(x[e], c), __fmul_rn(other, sn))
                     : __fadd_rn(__fmul_rn(x[e], c), __fmul_rn(other, sn));
  }
  if (is_q) {
    T* dst = static_cast<T*>(a.q_dst) + (t * Hq + h) * D + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; ++e) dst[e] = from_f32<T>(y[e]);
  } else if (slot >= 0) {
    CT* dst = static_cast<CT*>(a.kc) + (slot * Hkv + (h - Hq)) * D + lane * EPL;
    if constexpr (std::is_same_v<CT, T>) {
#pragma unroll
      for (int e = 0; e < EPL; ++e) dst[e] = from_f32<T>(y[e]);
    } else {
      store_e4m3<T, EPL>(dst, y);
    }
  }
}

}  // namespace

void qk_norm_rope_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                              float eps, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                              Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  const int64_t T_ = q.shape[0], Hq = q.shape[1], D = q.shape[2], Hkv = k_cache.shape[2];
  check_cache_dtype("qk_norm_rope_cache_write (cuda): the caches must share q's dtype or be f8e4m3", q, k_cache,
                    v_cache);
  if (T_ == 0) return;
  if (D == 64 || D == 128) {
    RopeCacheArgs a{qkv.data, nullptr, nullptr, qkv.shape[1], 0, 0, q.data, nullptr, k_cache.data, v_cache.data,
                    positions.ptr<int32_t>(), meta.slot_mapping.ptr<int32_t>(), cos.ptr<float>(), sin.ptr<float>()};
    const int64_t n_warps = T_ * (Hq + 2 * Hkv);
    const unsigned grid = unsigned(ceil_div(n_warps * 32, 256));
    const bool fp8 = k_cache.dtype == DType::f8e4m3;
    GRPO_DISPATCH_FLOAT(q.dtype, T, {
      if (D == 64 && fp8)
        launch_pdl(ctx, qk_norm_rope_cache_kernel<T, e4m3_t, 2>, dim3(grid), dim3(256), 0, a, q_norm.ptr<T>(),
                   k_norm.ptr<T>(), eps, n_warps, int(Hq), int(Hkv));
      else if (D == 64)
        launch_pdl(ctx, qk_norm_rope_cache_kernel<T, T, 2>, dim3(grid), dim3(256), 0, a, q_norm.ptr<T>(),
                   k_norm.ptr<T>(), eps, n_warps, int(Hq), int(Hkv));
      else if (fp8)
        launch_pdl(ctx, qk_norm_rope_cache_kernel<T, e4m3_t, 4>, dim3(grid), dim3(256), 0, a, q_norm.ptr<T>(),
                   k_norm.ptr<T>(), eps, n_warps, int(Hq), int(Hkv));
      else
        launch_pdl(ctx, qk_norm_rope_cache_kernel<T, T, 4>, dim3(grid), dim3(256), 0, a, q_norm.ptr<T>(),
                   k_norm.ptr<T>(), eps, n_warps, int(Hq), int(Hkv));
    });
    CUDA_CHECK_LAUNCH();
    return;
  }
  // Other head dims: split, the two norms, then the fused rope + cache write.
  const int64_t es = int64_t(dtype_size(q.dtype));
  ScratchAlloc sa(ctx);
  auto buf = [&](int64_t H, const char* what) {
    return tensor_borrow(sa.alloc<unsigned char>(T_ * H * D * es, what), q.dtype, Device::cuda, {T_, H, D});
  };
  Tensor qr = buf(Hq, "qk_norm q"), k = buf(Hkv, "qk_norm k"), v = buf(Hkv, "qk_norm v"), kn = buf(Hkv, "qk_norm kn");
  cuda::qkv_split(ctx, qr, k, v, qkv);
  Tensor q2 = q.view({T_ * Hq, D}), k2 = kn.view({T_ * Hkv, D});
  cuda::rmsnorm_forward(ctx, q2, nullptr, qr.view({T_ * Hq, D}), q_norm, eps);
  cuda::rmsnorm_forward(ctx, k2, nullptr, k.view({T_ * Hkv, D}), k_norm, eps);
  cuda::rope_qk_cache_write(ctx, q, kn, v, positions, cos, sin, k_cache, v_cache, meta);
}

void rope_qk_cache_write(Context& ctx, Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& cos, const Tensor& sin, Tensor& k_cache, Tensor& v_cache,
                         const PagedAttnMeta& meta) {
  const int64_t T_ = q.shape[0], Hq = q.shape[1], Hkv = k.shape[1], D = q.shape[2];
  check_cache_dtype("rope_qk_cache_write (cuda): the caches must share q's dtype or be f8e4m3", q, k_cache, v_cache);
  if (T_ == 0) return;
  RopeCacheArgs a{q.data, k.data, v.data, Hq * D, Hkv * D, Hkv * D, q.data, k.data, k_cache.data, v_cache.data,
                  positions.ptr<int32_t>(), meta.slot_mapping.ptr<int32_t>(), cos.ptr<float>(), sin.ptr<float>()};
  const bool aligned = aligned16(q.data) && aligned16(k.data) && aligned16(v.data) && aligned16(cos.data) &&
                       aligned16(sin.data) && aligned16(k_cache.data) && aligned16(v_cache.data);
  if (rope_cache_fused(ctx, a, q.dtype, k_cache.dtype, T_, Hq, Hkv, D, aligned)) return;
  cuda::rope_forward(ctx, q, positions, cos, sin);
  cuda::rope_forward(ctx, k, positions, cos, sin);
  cuda::kv_cache_write(ctx, k_cache, v_cache, k, v, meta);
}

void rope_qkv_cache_write(Context& ctx, Tensor& q, const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                          const Tensor& sin, Tensor& k_cache, Tensor& v_cache, const PagedAttnMeta& meta) {
  const int64_t T_ = q.shape[0], Hq = q.shape[1], D = q.shape[2], Hkv = k_cache.shape[2];
  check_cache_dtype("rope_qkv_cache_write (cuda): the caches must share q's dtype or be f8e4m3", q, k_cache, v_cache);
  if (T_ == 0) return;
  const int64_t es = int64_t(dtype_size(q.dtype)), row = qkv.shape[1];
  const char* base = static_cast<const char*>(qkv.data);
  RopeCacheArgs a{base, base + Hq * D * es, base + (Hq + Hkv) * D * es, row, row, row, q.data, nullptr,
                  k_cache.data, v_cache.data, positions.ptr<int32_t>(), meta.slot_mapping.ptr<int32_t>(),
                  cos.ptr<float>(), sin.ptr<float>()};
  const bool aligned = aligned16(qkv.data) && (row * es) % 16 == 0 && (Hq * D * es) % 16 == 0 &&
                       (Hkv * D * es) % 16 == 0 && aligned16(q.data) && aligned16(cos.data) && aligned16(sin.data) &&
                       aligned16(k_cache.data) && aligned16(v_cache.data);
  if (rope_cache_fused(ctx, a, q.dtype, k_cache.dtype, T_, Hq, Hkv, D, aligned)) return;
  // Fallback: split into scratch k/v, then the three ops.
  ScratchAlloc sa(ctx);
  Tensor k = tensor_borrow(sa.alloc<unsigned char>(T_ * Hkv * D * es, "rope_qkv_cache_write k"), q.dtype,
                           Device::cuda, {T_, Hkv, D});
  Tensor v = tensor_borrow(sa.alloc<unsigned char>(T_ * Hkv * D * es, "rope_qkv_cache_write v"), q.dtype,
                           Device::cuda, {T_, Hkv, D});
  cuda::qkv_split(ctx, q, k, v, qkv);
  cuda::rope_forward(ctx, q, positions, cos, sin);
  cuda::rope_forward(ctx, k, positions, cos, sin);
  cuda::kv_cache_write(ctx, k_cache, v_cache, k, v, meta);
}

void rope_forward(Context& ctx, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_launch(ctx, x, positions, cos, sin, 1.f);
}

void rope_backward(Context& ctx, Tensor& dx, const Tensor& positions, const Tensor& cos, const Tensor& sin) {
  rope_launch(ctx, dx, positions, cos, sin, -1.f);
}

}  // namespace grpo::cuda
