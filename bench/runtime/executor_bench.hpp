// Executor overhead: a dependent chain of tiny element-wise nodes run through a session,
// against the same kernels called directly in a loop (the floor any executor pays).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

namespace loom::bench {

struct executor_bench_result {
  std::int64_t nodes = 0;
  int repetitions = 0;
  double session_ns_per_node = 0;  // median over repetitions: session.run / nodes
  double direct_ns_per_node = 0;   // median: the same kernels' compute() called in a loop
  double overhead_ns_per_node = 0; // session − direct
  double target_ns_per_node = 250;
  std::int64_t plans = 0;          // plans the session made (1: the cache works)
};

executor_bench_result run_executor_bench(std::int64_t nodes, int repetitions);
nlohmann::json to_json(const executor_bench_result& r);

}  // namespace loom::bench
