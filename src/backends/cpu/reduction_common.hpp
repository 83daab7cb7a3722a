// Helpers shared by the CPU kernels of the reduction family (reduction_*.cpp) and of the
// normalization family (normalization_kernels.cpp): compute types, loads and stores for
// 16-bit floats, blocked summation, and max / min loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu_kernels.hpp"
#include "vector_lanes.hpp"
#include "kernel/common/reduction_helpers.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/ops/reduction_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::cpu {

void register_reduce_kernels(kernel_registry& registry);   // reduce_*, argmax
void register_softmax_kernels(kernel_registry& registry);  // softmax, log_softmax, xent

namespace reduction {

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// True for the floating-point types (the dtypes of softmax and layer_norm).
template <class T>
inline constexpr bool float_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || is_16bit_float_v<T>;

/// The type a kernel computes T in: float for half and bfloat16, T otherwise.
template <class T>
using compute_t = std::conditional_t<is_16bit_float_v<T>, float, T>;

template <class T>
inline compute_t<T> load(T v) noexcept {
  if constexpr (is_16bit_float_v<T>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

/// Rounds a computed value (any arithmetic type) to T.
template <class T, class V>
inline T store(V v) noexcept {
  if constexpr (is_16bit_float_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Note [blocked summation]
// Sums of floating-point values add blocks of 128 terms in 8 independent lanes of the
// compute type (float for f32/f16/bf16, so the loop vectorises), and carry the block sums in
// double. The error is that of a 128-term float sum per block plus a double sum across
// blocks: a 1e6-term f32 sum matches a float64 reference to ~1e-7 relative, at the speed
// of a plain float loop. Reductions across rows (reduce over outer axes) accumulate in
// double directly (reduction_reduce.cpp).

/// The eight lanes of Note [blocked summation] combined in its one order: ((l0 + l1) + (l2 +
/// l3)) + ((l4 + l5) + (l6 + l7)). V: the compute type, or a vector of it (several sums' lane
/// l in each element). Every blocked sum combines its lanes here.
template <class V>
[[gnu::always_inline]] inline V combine_lanes(const V (&r)[8]) noexcept {
  return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
}

/// Σ f(i) for i in [0, n), where f returns C (float or double); see Note [blocked summation].
template <class C, class F>
inline double blocked_sum(std::int64_t n, F&& f) {
  constexpr std::int64_t block = 128;
  double total = 0.0;
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    C r[8] = {};
    for (std::int64_t k = 0; k < block; k += 8) {
      for (int l = 0; l < 8; ++l) r[l] += f(i + k + l);
    }
    total += static_cast<double>(combine_lanes(r));
  }
  C r[8] = {};
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) r[l] += f(i + l);
  }
  C t = combine_lanes(r);
  for (; i < n; ++i) t += f(i);
  return total + static_cast<double>(t);
}

/// blocked_sum of a dense row e[0, n): the same terms in the same order, so the same bits, with
/// the eight lanes written as one vector. In a function compiled for AVX-512, GCC's code for
/// blocked_sum's lane loop moves values between lanes (valignd, vextractf32x4): a softmax
/// row of 128 floats summed 1024 times took 37 us, against 8 here; compiled for the baseline
/// both take about 7.
template <class C>
[[gnu::always_inline]] inline double blocked_sum_dense(const C* e, std::int64_t n) noexcept {
  using V = vec<C, 8>;
  constexpr std::int64_t block = 128;
  const auto tree = [](const V& r) {
    C a[8];
    std::memcpy(a, &r, sizeof r);
    return combine_lanes(a);
  };
  double total = 0.0;
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    V r{};
    for (std::int64_t k = 0; k < block; k += 8) r += vload<C, 8>(e + i + k);
    total += static_cast<double>(tree(r));
  }
  V r{};
  for (; i + 8 <= n; i += 8) r += vload<C, 8>(e + i);
  C t = tree(r);
  for (; i < n; ++i) t += e[i];
  return total + static_cast<double>(t);
}

// Note [extreme with SSE2]
// GCC does not vectorise a max or min loop without -ffast-math (NaN and signed zeros make
// the reduction order-dependent), and turns `b > a ? b : a` on floats back into branches.
// extreme() therefore uses SSE2's maxps/minps (baseline on x86-64) with four independent
// accumulators, and tracks NaN separately with cmpunordps; elsewhere it is a plain loop.

namespace detail {
template <bool Max, class C>
inline C better(C b, C a) noexcept {
  return (Max ? b > a : b < a) ? b : a;
}
}  // namespace detail

/// The maximum (Max) or minimum of p[0, n) (float or double), ignoring NaN: -inf / +inf
/// when n is 0 or every element is NaN. Sets `saw_nan` to whether any element is NaN.
template <bool Max, class C>
C extreme(const C* p, std::int64_t n, bool& saw_nan) noexcept {
  constexpr C init = Max ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
  C t = init;
  bool any_nan = false;
  std::int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<C, float>) {
    __m128 r[4];
    for (auto& v : r) v = _mm_set1_ps(init);
    __m128 nan = _mm_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      __m128 b[4];
      for (int k = 0; k < 4; ++k) {
        b[k] = _mm_loadu_ps(p + i + 4 * k);
        r[k] = Max ? _mm_max_ps(b[k], r[k]) : _mm_min_ps(b[k], r[k]);  // NaN b: keeps r
      }
      nan = _mm_or_ps(nan, _mm_or_ps(_mm_cmpunord_ps(b[0], b[1]), _mm_cmpunord_ps(b[2], b[3])));
    }
    alignas(16) float lanes[16];
    for (int k = 0; k < 4; ++k) _mm_store_ps(lanes + 4 * k, r[k]);
    for (const float v : lanes) t = detail::better<Max>(v, t);
    any_nan = _mm_movemask_ps(nan) != 0;
  } else {
    __m128d r[4];
    for (auto& v : r) v = _mm_set1_pd(init);
    __m128d nan = _mm_setzero_pd();
    for (; i + 8 <= n; i += 8) {
      __m128d b[4];
      for (int k = 0; k < 4; ++k) {
        b[k] = _mm_loadu_pd(p + i + 2 * k);
        r[k] = Max ? _mm_max_pd(b[k], r[k]) : _mm_min_pd(b[k], r[k]);
      }
      nan = _mm_or_pd(nan, _mm_or_pd(_mm_cmpunord_pd(b[0], b[1]), _mm_cmpunord_pd(b[2], b[3])));
    }
    alignas(16) double lanes[8];
    for (int k = 0; k < 4; ++k) _mm_store_pd(lanes + 2 * k, r[k]);
    for (const double v : lanes) t = detail::better<Max>(v, t);
    any_nan = _mm_movemask_pd(nan) != 0;
  }
#endif
  for (; i < n; ++i) {
    t = detail::better<Max>(p[i], t);
    any_nan = any_nan || p[i] != p[i];
  }
  saw_nan = any_nan;
  return t;
}

// Shared with every backend: dense inputs and rule checks (kernel/common/reduction_helpers.hpp),
// the split of a shape around an axis (loom/graph/ops/reduction_rules.hpp).
using common::dense_input;
using reduction_rules::axis_split;
using reduction_rules::split_at;

}  // namespace reduction
}  // namespace loom::cpu
