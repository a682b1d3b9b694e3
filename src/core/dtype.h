// Element types and host-side conversions. bf16/f16 are stored as uint16_t;
// conversions round to nearest even, matching PyTorch's .to(bfloat16).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace grpo {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

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
uint16_t f32_to_f16(float f);

// Converts n elements between float types on the host (f32/bf16/f16).
void convert_host(void* dst, DType dst_t, const void* src, DType src_t, size_t n);

}  // namespace grpo
