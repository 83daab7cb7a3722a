// half and bfloat16 against independent references: every 16-bit pattern decoded with
// ldexp from its fields, and float -> 16-bit rounding checked as "the nearest of the two
// neighbouring representable values, ties to the even one" in double arithmetic.
#include "loom/core/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace {

using loom::bfloat16;
using loom::half;

// IEEE binary16 decoded from its fields.
double half_value(std::uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    v = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  }
  return sign ? -v : v;
}

// bfloat16: the top half of a float.
double bfloat16_value(std::uint16_t bits) {
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16));
}

TEST(Half, EveryBitPatternDecodesToItsValue) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double want = half_value(bits);
    const auto got = static_cast<float>(half::from_bits(bits));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << b;
      // And every value encodes back to its own pattern (both zeros keep their sign).
      ASSERT_EQ(half(got).bits, bits) << std::hex << b;
    }
  }
}

TEST(Bfloat16, EveryBitPatternDecodesToItsValueAndBack) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double want = bfloat16_value(bits);
    const auto got = static_cast<float>(bfloat16::from_bits(bits));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
      EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(got)))) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << b;
      ASSERT_EQ(bfloat16(got).bits, bits) << std::hex << b;
    }
  }
}

// Checks that `got` (a 16-bit pattern) is the correctly rounded encoding of x, given the
// decoder `value` and the largest finite pattern `max_bits`.
template <class Value>
void expect_rounded(float x, std::uint16_t got, Value value, std::uint16_t max_bits) {
  const double xd = static_cast<double>(x);
  const double g = value(got);
  // The neighbours of the result, one step each way in magnitude.
  const std::uint16_t mag = got & 0x7fff;
  const std::uint16_t sign = got & 0x8000;
  const double mag_x = std::fabs(xd);
  if ((mag & 0x7fff) > max_bits) {
    // Rounded to infinity: x must be at least halfway past the largest finite value.
    const double largest = value(max_bits);
    const double next = largest + (largest - value(static_cast<std::uint16_t>(max_bits - 1)));
    ASSERT_GE(mag_x, (largest + next) / 2) << x;
    return;
  }
  ASSERT_EQ(std::signbit(g), std::signbit(xd)) << x;
  const double err = std::fabs(std::fabs(g) - mag_x);
  if (mag > 0) {
    const double below = std::fabs(value(static_cast<std::uint16_t>(sign | (mag - 1))));
    ASSERT_LE(err, mag_x - below) << x;
    if (err == mag_x - below) {
      ASSERT_EQ(mag & 1, 0) << "tie not to even: " << x;
    }
  }
  if (mag < max_bits) {
    const double above = std::fabs(value(static_cast<std::uint16_t>(sign | (mag + 1))));
    ASSERT_LE(err, above - mag_x) << x;
    if (err == above - mag_x) {
      ASSERT_EQ(mag & 1, 0) << "tie not to even: " << x;
    }
  }
}

TEST(Half, FloatsRoundToTheNearestEvenHalf) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    // Floats around half's range: exponents from subnormal-half to overflow.
    const float x =
        std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                   std::uniform_int_distribution<int>(-27, 17)(rng)) * (any(rng) % 2 ? 1.f : -1.f);
    expect_rounded(x, half(x).bits, half_value, 0x7bff);
  }
  // Exact ties: halfway between two halves, both parities.
  for (std::uint16_t b : {0x3c00, 0x3c01, 0x0001, 0x0400, 0x7bfe}) {
    const float mid = static_cast<float>((half_value(b) + half_value(b + 1)) / 2);
    expect_rounded(mid, half(mid).bits, half_value, 0x7bff);
    expect_rounded(-mid, half(-mid).bits, half_value, 0x7bff);
  }
  EXPECT_EQ(half(65520.0f).bits, 0x7c00);  // halfway to 2^16 rounds to infinity
  EXPECT_EQ(half(65519.0f).bits, 0x7bff);
  EXPECT_TRUE(std::isnan(static_cast<float>(half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bfloat16, FloatsRoundToTheNearestEvenBfloat16) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(any(rng));
    if (!std::isfinite(x)) continue;
    expect_rounded(x, bfloat16(x).bits, bfloat16_value, 0x7f7f);
  }
  const float tie = std::bit_cast<float>(0x3f808000u);  // halfway between 0x3f80 and 0x3f81
  EXPECT_EQ(bfloat16(tie).bits, 0x3f80);
  const float tie_odd = std::bit_cast<float>(0x3f818000u);
  EXPECT_EQ(bfloat16(tie_odd).bits, 0x3f82);
}

}  // namespace
