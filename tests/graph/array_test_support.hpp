// What the graph-level tests of the array ops (array_dynamic_grad_test, array_einsum_test)
// share: reproducible random values to feed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace loom::array_test {

/// n values drawn uniformly from [-1, 1), reproducibly from `seed`.
inline std::vector<double> random_values(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace loom::array_test
