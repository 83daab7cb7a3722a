// Random numbers of the train room from raw std::mt19937_64 bits: the same values on every
// standard library (the std::*_distribution algorithms and std::shuffle are not specified),
// so datasets, initial weights and batch orders are reproducible anywhere.
#pragma once

#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace loom::train {

/// A uniform double in [0, 1) from the generator's top 53 bits.
inline double unit_uniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

/// 0, 1, ..., n - 1 in a Fisher-Yates order drawn from `rng`.
inline std::vector<std::int64_t> shuffled_indices(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = n; i > 1; --i) {
    std::swap(order[i - 1], order[static_cast<std::size_t>(rng() % i)]);
  }
  return order;
}

}  // namespace loom::train
