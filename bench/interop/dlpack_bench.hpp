// `loom bench interop --only dlpack`: a DLPack export plus import round trip in C++
// (to_dlpack, from_dlpack, and dropping the imported tensor, which runs the deleter), for
// a 0-d tensor, 1 KB and 1 GB, through both ABIs. Zero copy, so the time does not depend
// on the size; the target is under 1 µs per round trip.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct dlpack_bench_row {
  std::string tensor;  // "0-d f32", "1 KB", "1 GB"
  std::string abi;     // "dltensor" or "dltensor_versioned"
  std::int64_t bytes = 0;
  double ns_per_round_trip = 0;  // median over repetitions
};

struct dlpack_bench_result {
  int repetitions = 0;
  int round_trips_per_repetition = 0;
  double target_ns = 1000;
  std::vector<dlpack_bench_row> rows;
};

/// `quick` skips the 1 GB tensor and times fewer round trips.
dlpack_bench_result run_dlpack_bench(int repetitions, bool quick);
nlohmann::json to_json(const dlpack_bench_result& r);
std::string to_text(const dlpack_bench_result& r);

}  // namespace loom::bench
