// FP8 E4M3 host conversions (the KV cache with kv_cache_dtype = fp8) against
// PyTorch's conversion table in tests/fixtures/fp8/fp8_reference.json (written by
// tools/ref/make_fp8_fixtures.py): x.clamp(-448, 448).to(torch.float8_e4m3fn) of
// f32 inputs — random at several scales, every finite E4M3 value, the midpoints
// between neighbours (ties), the subnormal range, the saturation edge, ±0, ±inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

using namespace grpo;

namespace {

const char* kScript = "python3 tools/ref/make_fp8_fixtures.py --out tests/fixtures/fp8";

struct ConvertTable {
  std::vector<uint32_t> f32_bits;
  std::vector<uint8_t> e4m3;
};

// Loads the conversion table once; an empty table means the fixture is missing or malformed.
const ConvertTable& convert_table() {
  static const ConvertTable t = [] {
    ConvertTable c;
    std::ifstream f(std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/fp8/fp8_reference.json");
    if (!f) return c;
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("format", "") != "grpo-fp8-fixture" || !j.contains("convert")) return c;
    c.f32_bits = j["convert"]["f32_bits"].get<std::vector<uint32_t>>();
    c.e4m3 = j["convert"]["e4m3"].get<std::vector<uint8_t>>();
    if (c.f32_bits.size() != c.e4m3.size()) c = ConvertTable{};
    return c;
  }();
  return t;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#define REQUIRE_TABLE()                                                                             \
  const ConvertTable& table = convert_table();                                                      \
  ASSERT_FALSE(table.f32_bits.empty()) << "tests/fixtures/fp8/fp8_reference.json is missing or "   \
                                          "malformed: regenerate it with `" << kScript << "`"

}  // namespace

TEST(Fp8, EncodeMatchesPyTorchOnEveryFixtureEntry) {
  REQUIRE_TABLE();
  size_t n_bad = 0;
  for (size_t i = 0; i < table.f32_bits.size(); ++i) {
    const float x = from_bits(table.f32_bits[i]);
    const uint8_t got = f32_to_f8e4m3(x);
    if (got != table.e4m3[i] && ++n_bad <= 10)
      ADD_FAILURE() << "entry " << i << ": f32_to_f8e4m3(" << x << " = 0x" << std::hex << table.f32_bits[i]
                    << ") = 0x" << int(got) << ", PyTorch 0x" << int(table.e4m3[i]) << std::dec;
  }
  EXPECT_EQ(n_bad, 0u) << "of " << table.f32_bits.size() << " entries";
  std::printf("[fp8] %zu conversions checked against PyTorch\n", table.f32_bits.size());
}

TEST(Fp8, DecodeGivesTheNearestE4M3ValueOfEveryFixtureEntry) {
  REQUIRE_TABLE();
  // The finite E4M3 values, to check that each decoded code is a nearest one to the clamped input.
  std::vector<float> finite;
  for (int b = 0; b < 256; ++b)
    if (!std::isnan(f8e4m3_to_f32(uint8_t(b)))) finite.push_back(f8e4m3_to_f32(uint8_t(b)));
  ASSERT_EQ(finite.size(), 254u);  // 0x7f and 0xff are the NaNs
  size_t n_exact = 0;
  for (size_t i = 0; i < table.f32_bits.size(); ++i) {
    const float x = from_bits(table.f32_bits[i]);
    const double c = std::fmin(448.0, std::fmax(-448.0, double(x)));
    const float v = f8e4m3_to_f32(table.e4m3[i]);
    ASSERT_FALSE(std::isnan(v)) << "entry " << i;
    double best = INFINITY;
    for (float f : finite) best = std::fmin(best, std::fabs(double(f) - c));
    EXPECT_EQ(std::fabs(double(v) - c), best) << "entry " << i << ": x = " << x << ", decoded " << v;
    if (double(v) == c) {  // exactly representable: the decode is the input itself, sign of zero included
      ++n_exact;
      EXPECT_EQ(std::signbit(v), std::signbit(x)) << "entry " << i;
    }
  }
  EXPECT_GE(n_exact, 254u);  // the fixture lists every finite value
}

TEST(Fp8, EveryCodeRoundTripsExceptNaN) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const float v = f8e4m3_to_f32(uint8_t(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << "code 0x" << std::hex << b;
      continue;
    }
    ASSERT_TRUE(std::isfinite(v)) << "code 0x" << std::hex << b;
    EXPECT_EQ(int(f32_to_f8e4m3(v)), b) << "code 0x" << std::hex << b << " decodes to " << v;
    ++n;
  }
  EXPECT_EQ(n, 254);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ((f32_to_f8e4m3(NAN) & 0x7f), 0x7f);         // NaN stays NaN
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);                // saturates
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
}
