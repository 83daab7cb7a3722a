// float16 / bfloat16 <-> float conversions for the element-wise loops, bit-identical to
// loom::half's and loom::bfloat16's (round to nearest even, NaN stays NaN, subnormals
// exact) but branch-free, so that loops converting on every load and store vectorise.
// (After F. Giesen's float_to_half_fast3_rtne / half_to_float_fast5.) half_to_float scales
// a float subnormal, so a thread running with denormals-are-zero would read float16
// subnormals as 0; loom's threads keep the default floating-point environment.
// Always inlined: GCC inlines nothing into a function compiled with other optimisation
// attributes (the AVX-512 and AVX2 variants of the epilogue and the fused kernel, Note
// [fused instruction sets]) unless told to, and a call per element kept those loops scalar.
#pragma once

#include <bit>
#include <cstdint>

#include "loom/core/half.hpp"

namespace loom::cpu::ew {

/// c ? a : b on bit patterns, through a mask (no branch for the compiler to keep).
[[gnu::always_inline]] inline std::uint32_t select_bits(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

[[gnu::always_inline]] inline float half_to_float(half h) noexcept {
  const std::uint32_t bits = h.bits;
  // Exponent and mantissa moved into place, then rescaled by 2^(127 - 15): exact for
  // normals, and it normalises subnormals.
  const float magic = std::bit_cast<float>(std::uint32_t{(254 - 15) << 23});
  const float scaled = std::bit_cast<float>((bits & 0x7fffu) << 13) * magic;
  std::uint32_t o = std::bit_cast<std::uint32_t>(scaled);
  // Inf and NaN: all exponent bits set.
  o = select_bits((bits & 0x7c00u) == 0x7c00u, o | 0x7f800000u, o);
  return std::bit_cast<float>(o | ((bits & 0x8000u) << 16));
}

[[gnu::always_inline]] inline half float_to_half(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  // Subnormal or zero result: adding 0.5 lets the FPU round the mantissa into place.
  const std::uint32_t denorm_magic = ((127 - 15) + (23 - 10) + 1) << 23;
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + std::bit_cast<float>(denorm_magic)) -
      denorm_magic;
  // Normal result: rebias the exponent and round to nearest even.
  const std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // Overflow to inf, NaN to a quiet NaN.
  const std::uint32_t special = select_bits(a > 0x7f800000u, 0x7e00u, 0x7c00u);
  std::uint32_t o = select_bits(a < 0x38800000u, sub, normal);
  o = select_bits(a >= 0x477ff000u, special, o);
  return half::from_bits(static_cast<std::uint16_t>(o | sign));
}

[[gnu::always_inline]] inline float bfloat16_to_float(bfloat16 h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16);
}

[[gnu::always_inline]] inline bfloat16 float_to_bfloat16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bfloat16::from_bits(
      static_cast<std::uint16_t>(select_bits((u & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded)));
}

/// half_to_float(float_to_half(f)) without leaving float, for every float f bit for bit
/// (NaN included: the quiet NaN of f's sign), in about half the operations: what a fused
/// kernel does after every op to keep each value as the unfused op stores it. Adding and
/// subtracting m = 2^13 x (f's exponent, at least float16's smallest normal exponent)
/// rounds f to the float16 quantum at its exponent (2^-24 below the normals), to nearest
/// even, by the float addition itself.
[[gnu::always_inline]] inline float round_to_half(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = u & 0x80000000u;
  const std::uint32_t e = u & 0x7f800000u;
  const std::uint32_t m_bits = (e < 0x38800000u ? 0x38800000u : e) + (13u << 23);
  const float m = std::bit_cast<float>(m_bits | sign);
  // x - x is +0: the sign goes back on (a value that rounds to zero keeps f's sign).
  const std::uint32_t y = std::bit_cast<std::uint32_t>((f + m) - m) | sign;
  const std::uint32_t a = u & 0x7fffffffu;
  // 65520 and above round to inf (65504 is the largest float16); NaN becomes the quiet NaN.
  std::uint32_t o = select_bits(a >= 0x477ff000u, sign | 0x7f800000u, y);
  o = select_bits(a > 0x7f800000u, sign | 0x7fc00000u, o);
  return std::bit_cast<float>(o);
}

/// bfloat16_to_float(float_to_bfloat16(f)) without the 16-bit round trip, bit for bit.
[[gnu::always_inline]] inline float round_to_bfloat16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet_nan = (u & 0xffff0000u) | 0x00400000u;
  return std::bit_cast<float>(select_bits((u & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded));
}

}  // namespace loom::cpu::ew
