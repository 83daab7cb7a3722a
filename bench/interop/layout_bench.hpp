// `loom bench interop` (layout part): AoS <-> SoA copies against the memory-bandwidth floor
// measured in the same run.
//   - STREAM triad (a = b + s*c, f32, 3 arrays of 64 MiB) on the same number of threads:
//     the bandwidth the floor is computed from (bytes as STREAM counts them);
//   - memcpy of the same bytes, split over the same threads: the copy a layout change can
//     at best match;
//   - deinterleave and interleave of an [N, k] f32 tensor for k in {2, 4, 8} with
//     N * k = 16M elements (64 MiB each way);
//   - records_to_columns of N = 4M packed 16-byte records (f64, f32, i32).
// Each case reports the median time, GB/s (bytes read + written) and its ratio to the floor
// (bytes / triad bandwidth) and to memcpy. --quick runs 1/8 of the sizes, 3 repetitions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct layout_bench_options {
  int repetitions = 15;
  int threads = 2;
  bool quick = false;
};

struct layout_case_result {
  std::string op;     // "deinterleave", "interleave", "records_to_columns"
  std::string label;  // "f32 [4M, 4]", ...
  std::int64_t rows = 0;
  std::int64_t columns = 0;  // k, or the number of fields
  double bytes = 0;          // read + written
  double ms = 0;             // median
  double gb_per_s = 0;       // bytes / ms
  double floor_ms = 0;       // bytes / triad bandwidth
  double over_floor = 0;     // ms / floor_ms
  double memcpy_ms = 0;      // median: memcpy of bytes / 2, on the same threads
  double over_memcpy = 0;    // ms / memcpy_ms
};

struct layout_bench_result {
  int repetitions = 0;
  int threads = 0;
  bool quick = false;
  double triad_gb_per_s = 0;  // median
  double triad_mib_per_array = 0;
  std::vector<layout_case_result> cases;
};

/// Runs the cases above. Throws what loom's allocation throws when memory runs out.
layout_bench_result run_layout_bench(const layout_bench_options& options);
nlohmann::json to_json(const layout_bench_result& r);
std::string to_text(const layout_bench_result& r);

}  // namespace loom::bench
