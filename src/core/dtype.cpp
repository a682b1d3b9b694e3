#include "core/dtype.h"

#include <cmath>

#include "core/check.h"

namespace grpo {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::f8e4m3: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::f8e4m3: return "f8_e4m3";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::f8e4m3: return "F8_E4M3";
  }
  return "?";
}

bool dtype_from_safetensors(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::f32;
  else if (s == "BF16") *out = DType::bf16;
  else if (s == "F16") *out = DType::f16;
  else if (s == "I32") *out = DType::i32;
  else if (s == "I64") *out = DType::i64;
  else if (s == "U8") *out = DType::u8;
  else if (s == "F8_E4M3") *out = DType::f8e4m3;
  else return false;
  return true;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a < 0x1p-6f) {  // subnormal range: m·2^-9, m = 0..8 (8 is the smallest normal, bits 0x08)
    return uint8_t(sign | uint8_t(std::nearbyint(a * 0x1p9f)));
  }
  if (a >= 448.f) return uint8_t(sign | 0x7e);
  int e = 0;
  const float fr = std::frexp(a, &e);                // a = fr·2^e, fr in [0.5, 1)
  int q = int(std::nearbyint((fr * 2.f - 1.f) * 8.f));  // mantissa of a / 2^(e-1) in [1, 2), 3 bits
  int ef = e - 1 + 7;
  if (q == 8) {
    q = 0;
    ++ef;
  }
  if (ef > 15 || (ef == 15 && q == 7)) return uint8_t(sign | 0x7e);  // rounds past 448: saturate
  return uint8_t(sign | (ef << 3) | q);
}

float f8e4m3_to_f32(uint8_t b) {
  const float s = (b & 0x80) ? -1.f : 1.f;
  const int ef = (b >> 3) & 0xf, m = b & 7;
  if (ef == 15 && m == 7) return std::nanf("");
  if (ef == 0) return s * std::ldexp(float(m), -9);
  return s * std::ldexp(1.f + float(m) / 8.f, ef - 7);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow -> inf (rounds past 65504)
  if (a < 0x38800000u) {                                 // subnormal or zero in f16
    float af;
    std::memcpy(&af, &a, 4);
    float scaled = af * 16777216.0f;  // 2^24
    uint32_t m = uint32_t(std::nearbyint(scaled));  // round-half-even in default mode
    return uint16_t(sign | m);
  }
  uint32_t exp = (a >> 23) - 112;
  uint32_t man = a & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return uint16_t(sign | h);
}

void convert_host(void* dst, DType dst_t, const void* src, DType src_t, size_t n) {
  if (dst_t == src_t) {
    std::memcpy(dst, src, n * dtype_size(dst_t));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (src_t) {
      case DType::f32: return static_cast<const float*>(src)[i];
      case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::f8e4m3: return f8e4m3_to_f32(static_cast<const uint8_t*>(src)[i]);
      default: GRPO_CHECK_MSG(false, "convert_host: source must be a float type");
    }
    return 0.f;
  };
  for (size_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (dst_t) {
      case DType::f32: static_cast<float*>(dst)[i] = v; break;
      case DType::bf16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      case DType::f16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
      case DType::f8e4m3: static_cast<uint8_t*>(dst)[i] = f32_to_f8e4m3(v); break;
      default: GRPO_CHECK_MSG(false, "convert_host: destination must be a float type");
    }
  }
}

}  // namespace grpo
