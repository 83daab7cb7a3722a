// `mpirun -np N loom bench distributed`: all_reduce through loom's communicator against the
// same MPI_Allreduce called directly, in the same run, sizes 4 KB to 256 MB (float32, in
// place), as bus bandwidth (NCCL's measure: bytes x 2 (N - 1) / N per second, what each
// rank's links carry in a ring). Every rank runs it; rank 0 reports.
#pragma once

#include <cstddef>
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
  /// Data-parallel training of the MLP (784-512-512-10, Adam): the step with and without
  /// overlap, and samples/s on every rank against one rank alone. 0 steps: skipped.
  std::int64_t train_steps = 60;
  /// Examples a rank trains on per step (the global batch is ranks times this).
  std::int64_t rank_batch = 64;
  /// Gradient buckets (1 MiB: the MLP's 2.7 MB of gradients in 3 buckets, so that there is
  /// something to overlap; DDP's 25 MiB would make one).
  std::size_t bucket_bytes = std::size_t{1} << 20;
  /// Rounds of each training configuration (alternating; the median counts).
  int train_rounds = 3;
  /// Data-parallel training of the CNN with batch norms (--batch-norm), plain (each rank's
  /// statistics) against synchronized (sync_batch_norm): what the synchronization costs a
  /// step. 0 steps: skipped.
  std::int64_t batch_norm_steps = 30;
  /// Examples a rank trains on per step in the batch norm comparison.
  std::int64_t batch_norm_rank_batch = 32;
};

/// One data-parallel training configuration's median round.
struct training_row {
  std::string what;             // "2 ranks, overlap", "2 ranks, no overlap", "1 rank"
  int ranks = 1;
  double step_ms = 0;           // per step, median over the rounds
  double samples_per_second = 0;
  double communication_ms = 0;  // per step, from traced steps
  double overlapped_ms = 0;     // per step: communication that compute ran beside
  std::size_t buckets = 0;
};

struct distributed_bench_row {
  std::int64_t bytes = 0;
  int calls_per_round = 0;
  double loom_us = 0;       // median time per all_reduce
  double unchecked_us = 0;  // the same with the communicator unchecked (set_checked(false))
  double mpi_us = 0;
  // MPI_Allreduce after the checked communicator's agreement exchange, both made directly: the
  // floor of a checked all_reduce (Note [agreeing ranks]).
  double agreed_mpi_us = 0;
  double loom_busbw_gbs = 0;
  double mpi_busbw_gbs = 0;
  double ratio = 0;  // mpi_us / loom_us: loom's bandwidth as a fraction of direct MPI's
  double unchecked_ratio = 0;  // mpi_us / unchecked_us
  double agreed_ratio = 0;     // agreed_mpi_us / loom_us
};

struct distributed_bench_result {
  int ranks = 1;
  std::string mpi_version;
  std::vector<distributed_bench_row> rows;
  /// With train_steps: overlap, no overlap (every rank), one rank alone (rank 0).
  std::vector<training_row> training;
  std::int64_t rank_batch = 0;
  std::size_t bucket_bytes = 0;
  /// With batch_norm_steps: the CNN with plain and with synchronized batch norms.
  std::vector<training_row> batch_norm;
  std::int64_t batch_norm_rank_batch = 0;
};

/// Runs on every rank (collective: every rank must call it with the same options).
distributed_bench_result run_distributed_bench(const distributed_bench_options& o);
std::string to_text(const distributed_bench_result& r);
nlohmann::json to_json(const distributed_bench_result& r);

}  // namespace loom::bench
