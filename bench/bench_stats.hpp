// What every `loom bench` suite measures with: the median of repeated timings, and the
// wall time of one call.
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace loom::bench {

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seconds that f() takes, by the steady clock.
template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  std::forward<F>(f)();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace loom::bench
