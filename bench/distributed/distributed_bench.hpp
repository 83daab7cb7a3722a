// `mpirun -np N loom bench distributed`: all_reduce through loom's communicator against the
// same MPI_Allreduce called directly, in the same run, sizes 4 KB to 256 MB (float32, in
// place), as bus bandwidth (NCCL's measure: bytes x 2 (N - 1) / N per second, what each
// rank's links carry in a ring). Every rank runs it; rank 0 reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::bench {

struct distributed_bench_options {
  /// Message sizes in bytes (default 4 KB, 64 KB, 1 MB, 16 MB, 256 MB).
  std::vector<std::int64_t> sizes{4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
  /// Timed rounds per size and peer (alternating loom and MPI); the median round counts.
  int rounds = 7;
  /// Time per round to aim for; each round runs as many all_reduces as fit, at least 1.
  double round_ms = 50;
};

struct distributed_bench_row {
  std::int64_t bytes = 0;
  int calls_per_round = 0;
  double loom_us = 0;  // median time per all_reduce
  double mpi_us = 0;
  double loom_busbw_gbs = 0;
  double mpi_busbw_gbs = 0;
  double ratio = 0;  // mpi_us / loom_us: loom's bandwidth as a fraction of direct MPI's
};

struct distributed_bench_result {
  int ranks = 1;
  std::string mpi_version;
  std::vector<distributed_bench_row> rows;
};

/// Runs on every rank (collective: every rank must call it with the same options).
distributed_bench_result run_distributed_bench(const distributed_bench_options& o);
std::string to_text(const distributed_bench_result& r);
nlohmann::json to_json(const distributed_bench_result& r);

}  // namespace loom::bench
