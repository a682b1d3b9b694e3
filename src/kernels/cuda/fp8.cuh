// FP8 E4M3 ("e4m3fn") storage helpers for the KV cache (kv_cache_dtype = fp8).
// Conversions to fp8 round to nearest even with saturation (cvt.rn.satfinite: beyond
// ±448, infinities included → ±448; NaN stays NaN), the same as grpo::f32_to_f8e4m3 on
// the host. Every E4M3 value is exact in f16, f32 and bf16, so widening is exact.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"

namespace grpo::cuda {

using e4m3_t = __nv_fp8_e4m3;  // one byte; the device element type of a DType::f8e4m3 tensor

__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
// Two floats → two E4M3 bytes (lo in the low byte).
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi) {
  return uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}
// Four E4M3 bytes of w (byte i = element i) → four floats. The halves of w are split in PTX
// (mov.b32 {lo, hi}), so ptxas hands the high half to the conversion as an operand half
// (F2FP.F16.E4M3.UNPACK_B R, R.H1) instead of shifting it down first: 2 F2FP + 4 HADD2.F32
// per four elements (the FP8 paged attention kernel is issue-bound).
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float* f) {
  uint32_t lo, hi;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}
// Two E4M3 bytes (low byte first) → a bf16x2 word (exact).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16x2(a.x, a.y);
}

// Loads 16 bytes at p (16-byte aligned) as 16 floats.
__device__ __forceinline__ void load_vec(const e4m3_t* p, float* f) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  e4m3x4_to_f32(v.x, f);
  e4m3x4_to_f32(v.y, f + 4);
  e4m3x4_to_f32(v.z, f + 8);
  e4m3x4_to_f32(v.w, f + 12);
}
// Stores 16 floats as 16 E4M3 bytes at p (16-byte aligned).
__device__ __forceinline__ void store_vec(e4m3_t* p, const float* f) {
  uint4 v;
  v.x = uint32_t(f32x2_to_e4m3x2(f[0], f[1])) | (uint32_t(f32x2_to_e4m3x2(f[2], f[3])) << 16);
  v.y = uint32_t(f32x2_to_e4m3x2(f[4], f[5])) | (uint32_t(f32x2_to_e4m3x2(f[6], f[7])) << 16);
  v.z = uint32_t(f32x2_to_e4m3x2(f[8], f[9])) | (uint32_t(f32x2_to_e4m3x2(f[10], f[11])) << 16);
  v.w = uint32_t(f32x2_to_e4m3x2(f[12], f[13])) | (uint32_t(f32x2_to_e4m3x2(f[14], f[15])) << 16);
  *reinterpret_cast<uint4*>(p) = v;
}

}  // namespace grpo::cuda
