// The epilogue shared by the decode GEMM kernels (linear_small_m.cu, linear_wgmma.cu), identical in
// semantics and rounding to linear_forward's cuBLASLt path:
//   v = Σ x·w [+ out_old] [+ bf16 bias] in f32, one rounding to bf16; an f32 bias is added after
//   that rounding and rounded again (the cuBLASLt path adds an f32 bias with a separate kernel).
#pragma once
#include <climits>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"

namespace grpo::cuda {

enum GemmBiasKind : int { kNoBias = 0, kBiasBf16 = 1, kBiasF32 = 2 };

// The operand checks shared by the decode GEMMs' host entry points: bf16 2-D x (M,K), w (N,K),
// out (M,N) of out_dtype with 1 <= M <= max_m (64 for decode; the wgmma rows variants take
// more), K % 8 == 0 and K >= min_k, N <= INT_MAX - n_slack and K <= INT_MAX - 64 (int
// indices), 16-byte aligned pointers, and a bf16 or f32 bias of N elements (its kind in
// *bias_kind). False: the kernel does not apply.
inline bool decode_gemm_applies(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, int64_t min_k,
                                int64_t n_slack, int* bias_kind, int64_t max_m = 64,
                                DType out_dtype = DType::bf16) {
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || out.dtype != out_dtype) return false;
  if (x.ndim != 2 || w.ndim != 2 || out.ndim != 2) return false;
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  if (w.shape[1] != K || out.shape[0] != M || out.shape[1] != N) return false;
  if (M < 1 || M > max_m || N < 1 || K < min_k || K % 8 != 0) return false;
  if (N > INT_MAX - n_slack || K > INT_MAX - 64) return false;
  if (!aligned16(x.data) || !aligned16(w.data) || !aligned16(out.data)) return false;
  *bias_kind = kNoBias;
  if (bias) {
    if (bias->numel() != N || !aligned16(bias->data)) return false;
    if (bias->dtype == DType::bf16) *bias_kind = kBiasBf16;
    else if (bias->dtype == DType::f32) *bias_kind = kBiasF32;
    else return false;
  }
  return true;
}

// Adds the optional old output and bias to E (2 or 4) consecutive outputs (m, n..n+E-1),
// rounds and stores them (fewer at the end of a row when N % E != 0). A: the kernel's argument
// struct with out (bf16, row stride N), N, accumulate, bias and bias_kind.
template <int E, class A>
__device__ __forceinline__ void epilogue_store(const A& a, float (&v)[E], int m, int n) {
  static_assert(E == 2 || E == 4, "2 or 4 outputs");
  __nv_bfloat16* o = a.out + int64_t(m) * a.N + n;
  const bool vec = (a.N % E) == 0;  // then n + E - 1 < N and o is 2·E-byte aligned
  const int cnt = vec ? E : min(E, a.N - n);
  if (a.accumulate) {
    if (vec) {
      if constexpr (E == 4) {
        const uint2 r = *reinterpret_cast<const uint2*>(o);
        v[0] += __uint_as_float(r.x << 16);
        v[1] += __uint_as_float(r.x & 0xffff0000u);
        v[2] += __uint_as_float(r.y << 16);
        v[3] += __uint_as_float(r.y & 0xffff0000u);
      } else {
        const uint32_t r = *reinterpret_cast<const uint32_t*>(o);
        v[0] += __uint_as_float(r << 16);
        v[1] += __uint_as_float(r & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int j = 0; j < E; ++j)
        if (j < cnt) v[j] += __bfloat162float(o[j]);
    }
  }
  if (a.bias_kind == kBiasBf16) {
    const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(a.bias) + n;
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (j < cnt) v[j] += __bfloat162float(b[j]);
  } else if (a.bias_kind == kBiasF32) {
    const float* b = static_cast<const float*>(a.bias) + n;
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (j < cnt) v[j] = __bfloat162float(__float2bfloat16_rn(v[j])) + b[j];
  }
  if (vec) {
    if constexpr (E == 4)
      *reinterpret_cast<uint2*>(o) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
    else
      *reinterpret_cast<uint32_t*>(o) = pack_bf16x2(v[0], v[1]);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (j < cnt) o[j] = __float2bfloat16_rn(v[j]);
  }
}

// The gated (SwiGLU) epilogue of linear_wgmma_swiglu: E (2 or 4) consecutive outputs
// act (m, n..n+E-1) from the f32 sums of their gate (g) and up (u) columns. g and u are first
// rounded to bf16 exactly as epilogue_store rounds a plain GEMM output (no old output, no bias:
// one round-to-nearest-even), then combined with swiglu_fwd_vec_kernel's arithmetic
// (elementwise.cu): silu(g)·u = __fmul_rn(g / (1 + expf(-g)), u) in f32, rounded to bf16 once.
// So act is bit for bit what the plain GEMM followed by swiglu_forward stores. A: the kernel's
// argument struct with out (bf16, row stride N = F); N % E == 0 and n % E == 0 (the gated
// kernel needs F % 32 == 0), so the stores are whole, aligned vectors.
template <int E, class A>
__device__ __forceinline__ void swiglu_epilogue_store(const A& a, const float (&g)[E], const float (&u)[E], int m,
                                                      int n) {
  static_assert(E == 2 || E == 4, "2 or 4 outputs");
  float o[E];
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const float gr = __bfloat162float(__float2bfloat16_rn(g[j]));
    const float ur = __bfloat162float(__float2bfloat16_rn(u[j]));
    o[j] = __fmul_rn(gr / (1.f + expf(-gr)), ur);
  }
  __nv_bfloat16* p = a.out + int64_t(m) * a.N + n;
  if constexpr (E == 4)
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
  else
    *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(o[0], o[1]);
}

// Split-K reduction through distributed shared memory: v = the float4 at `off` of the partial
// tiles of ranks 0, 1, .., split-1, summed in that order (part[q]: rank q's tile, S >= split).
template <int S>
__device__ __forceinline__ void sum_ranks(const float* (&part)[S], int split, int off, float (&v)[4]) {
  float4 s = *reinterpret_cast<const float4*>(part[0] + off);
#pragma unroll
  for (int q = 1; q < S; ++q) {
    if (q < split) {
      const float4 t = *reinterpret_cast<const float4*>(part[q] + off);
      s.x += t.x;
      s.y += t.y;
      s.z += t.z;
      s.w += t.w;
    }
  }
  v[0] = s.x;
  v[1] = s.y;
  v[2] = s.z;
  v[3] = s.w;
}

}  // namespace grpo::cuda
