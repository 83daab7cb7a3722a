// half and bfloat16: 16-bit floating-point storage types.
//
// Both are storage types: arithmetic converts to float, computes, and rounds back
// (round-to-nearest-even, as IEEE 754 and every framework do). NaN stays NaN, infinities and
// subnormals convert exactly.
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

/// IEEE 754 binary16.
struct half {
  std::uint16_t bits = 0;

  constexpr half() = default;
  explicit half(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }

  static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
  static std::uint16_t from_float(float f) noexcept;
  static float to_float(std::uint16_t h) noexcept;
};

/// bfloat16: the top 16 bits of an IEEE binary32.
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }

  static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  static std::uint16_t from_float(float f) noexcept {
    auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<std::uint16_t>(u >> 16);
  }
};

inline std::uint16_t half::from_float(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: scale by adding 0.5 so the FPU rounds for us.
    const float magic = std::bit_cast<float>(0x3f000000u);  // 0.5
    const float r = std::bit_cast<float>(abs) + magic;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(r) - 0x3f000000u));
  }
  const std::uint32_t mant_odd = (abs >> 13) & 1u;
  std::uint32_t v = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

inline float half::to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    const float m = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -m : m;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace loom
