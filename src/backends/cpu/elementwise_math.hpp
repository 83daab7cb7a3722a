// Scalar math for the CPU element-wise kernels: float32 exp / tanh written so that loops over
// them vectorise (libm's are calls the compiler cannot vectorise), and integer arithmetic
// that wraps instead of overflowing (NumPy's behaviour, and no undefined behaviour). The
// integer arithmetic and the conversions from double every backend shares are in
// src/kernel/common/elementwise_binary_ops.hpp and elementwise_convert.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernel/common/elementwise_binary_ops.hpp"
#include "kernel/common/elementwise_convert.hpp"

namespace loom::cpu::ew {

// ---- float32 exp and tanh ----------------------------------------------------------------------

/// c ? a : b through an integer mask. A plain `c ? a : b` whose arms feed float arithmetic is
/// turned back into branches by GCC, which then will not vectorise the loop: it may not
/// execute float operations (which could trap) on the path not taken.
inline float select(bool c, float a, float b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) |
                              (std::bit_cast<std::uint32_t>(b) & ~m));
}

/// e^x for float, within 2 ulp over the whole range (inf above ~88.72, gradual underflow to
/// 0 below ~-87.3, NaN stays NaN). Branch-free, so loops over it vectorise.
inline float fast_exp(float x) noexcept {
  // Clamp; NaN compares false and passes through, and NaN arithmetic keeps it NaN below.
  float xc = select(x < -104.0f, -104.0f, x);
  xc = select(xc > 89.0f, 89.0f, xc);
  // x = n ln2 + r, |r| <= ln2 / 2, n rounded to nearest by adding 1.5 * 2^23: the sum's
  // low mantissa bits are then n itself (no float-to-int conversion, which NaN would make
  // undefined).
  constexpr float log2e = 1.44269504088896341f;
  constexpr float round_magic = 12582912.0f;
  const float t = xc * log2e + round_magic;
  const float nf = t - round_magic;
  const std::int32_t n = std::bit_cast<std::int32_t>(t) - 0x4b400000;
  // Cody-Waite: ln2 split into a part exact in float and the rest.
  const float r = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f;
  // Cephes expf polynomial on [-ln2/2, ln2/2].
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // y * 2^n in two steps, each exponent within [-75, 65], so neither step leaves the normal
  // range by itself: the product overflows to inf or underflows gradually as it should.
  const std::int32_t n1 = n >> 1;
  const std::int32_t n2 = n - n1;
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(n2 + 127) << 23);
  return y * s1 * s2;
}

/// tanh for float, within a few ulp: an odd polynomial near 0 (Cephes tanhf), else
/// 1 - 2 / (e^2|x| + 1) with x's sign. Branch-free.
inline float fast_tanh(float x) noexcept {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f);
  return select(ax < 0.625f, small, std::copysign(big, x));
}

/// 1 / (1 + e^-x) for float: 0 and 1 at the ends, accurate relative to the result.
inline float fast_sigmoid(float x) noexcept {
  return 1.0f / (1.0f + fast_exp(-x));
}

// ---- integers that wrap (src/kernel/common/elementwise_binary_ops.hpp) ----------------------

using loom::ew::is_signed_int;
using loom::ew::wrap_add;
using loom::ew::wrap_mul;
using loom::ew::wrap_neg;
using loom::ew::wrap_sub;

// ---- double -> element conversion ---------------------------------------------------------------

// saturate_cast, from_double and wrap_from_double: src/kernel/common/elementwise_convert.hpp.
using loom::ew::from_double;
using loom::ew::saturate_cast;
using loom::ew::wrap_from_double;

}  // namespace loom::cpu::ew
