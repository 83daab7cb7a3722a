// STREAM's triad, the memory-bandwidth floor that memory-bound benchmarks report against.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "bench_stats.hpp"
#include "loom/device/thread_pool.hpp"

namespace loom::bench {

/// STREAM's triad, a[i] = b[i] + s*c[i], on a pool of `threads` (the CPU device's count),
/// over three f32 arrays of `elements` (take them far larger than the caches): the median
/// bandwidth of `repetitions` runs after one that touches the pages, in GB/s. Bytes as
/// STREAM counts them: two reads and one write per element (12 bytes), no write-allocate.
inline double triad_gb_per_s(int threads, std::int64_t elements, int repetitions) {
  std::vector<float> a(static_cast<std::size_t>(elements), 0.0f);
  std::vector<float> b(static_cast<std::size_t>(elements), 1.0f);
  std::vector<float> c(static_cast<std::size_t>(elements), 2.0f);
  thread_pool pool(threads, "triad");
  const float s = 3.0f;
  auto triad = [&] {
    pool.parallel_for(elements, 1.0, [&](std::int64_t begin, std::int64_t end) {
      float* __restrict pa = a.data();
      const float* __restrict pb = b.data();
      const float* __restrict pc = c.data();
      for (std::int64_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
    });
  };
  triad();  // first touch
  std::vector<double> t;
  for (int r = 0; r < repetitions; ++r) t.push_back(seconds_of(triad));
  const double bytes = 3.0 * 4.0 * static_cast<double>(elements);
  return bytes / median(std::move(t)) / 1e9;
}

}  // namespace loom::bench
