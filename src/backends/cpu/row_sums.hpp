// Sums along a row in vector lanes, carried in double every row_block values (Note [blocked
// summation] in reduction_common.hpp): what the layer_norm and batch_norm kernels'
// statistics passes share. always_inline: compiled into the calling instruction-set variant.
#pragma once

#include <algorithm>
#include <cstdint>

#include "vector_lanes.hpp"

namespace loom::cpu {

/// Row values summed in C before the sum is carried in double.
inline constexpr std::int64_t row_block = 512;

// Σ x[0, n).
template <class C, int L>
[[gnu::always_inline]] inline double row_sum(const C* x, std::int64_t n) noexcept {
  using V = vec<C, L>;
  double total = 0;
  for (std::int64_t b = 0; b < n; b += row_block) {
    const std::int64_t e = std::min(n, b + row_block);
    std::int64_t i = b;
    V a0{}, a1{}, a2{}, a3{};
    for (; i + 4 * L <= e; i += 4 * L) {
      a0 += vload<C, L>(x + i);
      a1 += vload<C, L>(x + i + L);
      a2 += vload<C, L>(x + i + 2 * L);
      a3 += vload<C, L>(x + i + 3 * L);
    }
    for (; i + L <= e; i += L) a0 += vload<C, L>(x + i);
    C t = hsum<C, L>((a0 + a1) + (a2 + a3));
    for (; i < e; ++i) t += x[i];
    total += static_cast<double>(t);
  }
  return total;
}

// s1 = Σ (x - m), s2 = Σ (x - m)² over x[0, n).
template <class C, int L>
[[gnu::always_inline]] inline void centred_sums(const C* x, std::int64_t n, C m, double& s1,
                                                double& s2) noexcept {
  using V = vec<C, L>;
  s1 = 0;
  s2 = 0;
  for (std::int64_t b = 0; b < n; b += row_block) {
    const std::int64_t e = std::min(n, b + row_block);
    std::int64_t i = b;
    V d[4];
    V q[4];
    for (int k = 0; k < 4; ++k) d[k] = q[k] = V{};
    for (; i + 4 * L <= e; i += 4 * L) {
      for (int k = 0; k < 4; ++k) {
        const V u = vload<C, L>(x + i + k * L) - m;
        d[k] += u;
        q[k] += u * u;
      }
    }
    for (; i + L <= e; i += L) {
      const V u = vload<C, L>(x + i) - m;
      d[0] += u;
      q[0] += u * u;
    }
    C t1 = hsum<C, L>((d[0] + d[1]) + (d[2] + d[3]));
    C t2 = hsum<C, L>((q[0] + q[1]) + (q[2] + q[3]));
    for (; i < e; ++i) {
      const C u = x[i] - m;
      t1 += u;
      t2 += u * u;
    }
    s1 += static_cast<double>(t1);
    s2 += static_cast<double>(t2);
  }
}

}  // namespace loom::cpu
