// `loom bench memory`: loom's pools against glibc malloc/free, measured in the same run.
//
// Workloads (each run `repetitions` times after a warm-up; medians reported):
// - mixed: sizes 64 B to 1 MiB, log-uniform; 1,000 live blocks; each step frees a random
//   live block and allocates a new one in its place, writing one byte to it. Per pair.
// - large: sizes 1 to 64 MiB, log-uniform; allocate, write every page, free. Per pair.
// - adaptors: the mixed workload through statistics -> limiting -> pool, against the bare
//   pool: the nanoseconds the two adaptors add per pair.
// - replay: a log of the mixed workload recorded by the logging adaptor, parsed and
//   replayed against a fresh pool: events per second.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct memory_bench_options {
  int repetitions = 7;
  std::size_t mixed_steps = 1'000'000;
  std::size_t live_blocks = 1'000;
  std::size_t large_steps = 60;
  std::size_t replay_events = 2'000'000;
  unsigned seed = 42;
};

/// One measured figure: the median and every repetition, in `unit`.
struct measurement {
  std::string name;
  std::string unit;
  double median = 0;
  std::vector<double> samples;
};

/// A comparison against a target: `value` must satisfy `op` against `target`.
struct target_check {
  std::string name;  // "mixed: pool faster than glibc"
  double value = 0;  // the measured ratio or figure
  std::string op;    // ">=" or "<="
  double target = 0;
  [[nodiscard]] bool met() const { return op == ">=" ? value >= target : value <= target; }
};

struct memory_bench_result {
  std::vector<measurement> measurements;
  std::vector<target_check> targets;
};

/// Runs every workload. Takes a few seconds to a minute depending on the options.
memory_bench_result run_memory_bench(const memory_bench_options& options);

/// A readable table of measurements and targets.
std::string to_text(const memory_bench_result& r);
nlohmann::json to_json(const memory_bench_result& r);

}  // namespace loom::bench
