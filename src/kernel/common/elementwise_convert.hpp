// Conversions of a double to an element type, shared by every backend's kernels: cast's
// float-to-integer saturation, and the values of fill / zeros / ones / range (from_double) and
// of one_hot / pad (wrap_from_double), made once on the host. saturate_cast and from_double
// are also device code under nvcc (the CUDA cast and range kernels', through
// kernels/elementwise_device.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define LOOM_CONVERT_FN __host__ __device__ __forceinline__
#else
#define LOOM_CONVERT_FN inline
#endif

namespace loom::ew {

/// x converted to integer type I: truncated toward zero, saturated at I's range, NaN -> 0.
/// (C++ leaves out-of-range conversions undefined; NumPy's results there are platform
/// accidents. Saturation is what Rust's `as` and most accelerators do.)
template <class I, class F>
LOOM_CONVERT_FN I saturate_cast(F x) noexcept {
  const double v = static_cast<double>(x);
  // 2^(digits) is exact in double for every I here (at most 2^63).
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max()) + 1.0;
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  if (!(v == v)) return I{0};
  if (v >= hi) return std::numeric_limits<I>::max();
  if (v <= lo) return std::numeric_limits<I>::min();
  return static_cast<I>(v);
}

/// A double as element type T, as cast converts it: to bool is v != 0; to an integer,
/// saturate_cast; to float16 / bfloat16, rounded to nearest even through float. Device code
/// too for the other types (the CUDA kernels convert to their 16-bit types themselves).
template <class T>
LOOM_CONVERT_FN T from_double(double v) noexcept {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_integral_v<T>) {
    return saturate_cast<T>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    return T(static_cast<float>(v));
  }
}

/// A double as element type T the way a C cast from int64 would for integers: truncated
/// and wrapped (NaN as 0, never UB), where from_double saturates; bool as != 0; float16 /
/// bfloat16 rounded through float. The on/off values of one_hot and pad's constant.
template <class T>
inline T wrap_from_double(double v) noexcept {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (std::isnan(v)) return T{0};
    return static_cast<T>(static_cast<std::int64_t>(std::clamp(v, -9.2e18, 9.2e18)));
  } else {
    return from_double<T>(v);
  }
}

}  // namespace loom::ew

#undef LOOM_CONVERT_FN
