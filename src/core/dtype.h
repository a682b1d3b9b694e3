// Element types and host-side conversions. bf16/f16 are stored as uint16_t;
// conversions round to nearest even, matching PyTorch's .to(bfloat16).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace grpo {

// f8e4m3: OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, 0x7f/0xff NaN, max ±448),
// used only as a storage type (the KV cache with kv_cache_dtype = fp8).
enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, f8e4m3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);           // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);  // "F32", "BF16", "F16", "I32", "I64", "U8"
bool dtype_from_safetensors(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
// FP8 E4M3: round to nearest even with saturation (|x| beyond 448, infinities included,
// become ±448; NaN stays NaN) — what CUDA's cvt.rn.satfinite.e4m3x2.f32 does.
uint8_t f32_to_f8e4m3(float f);
float f8e4m3_to_f32(uint8_t b);
uint16_t f32_to_f16(float f);

// Converts n elements between float types on the host (f32/bf16/f16).
void convert_host(void* dst, DType dst_t, const void* src, DType src_t, size_t n);

}  // namespace grpo
