#include "distributed/distributed_bench.hpp"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "bench_stats.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// One round: `calls` all_reduces of `t` (in place), every rank starting together. The
// round's time is the slowest rank's, so that no rank's early finish flatters it.
template <class F>
double round_seconds(int calls, F&& one) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  for (int i = 0; i < calls; ++i) one();
  double s = seconds_since(t0);
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

distributed_bench_result run_distributed_bench(const distributed_bench_options& o) {
  const auto comm = distributed::world();  // initialises MPI
  distributed_bench_result r;
  r.ranks = comm->size();
  {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    r.mpi_version = std::string(v, static_cast<std::size_t>(len));
    if (const auto nl = r.mpi_version.find_first_of(",\n"); nl != std::string::npos) r.mpi_version.resize(nl);
  }
  const double bus_factor = r.ranks > 1 ? 2.0 * (r.ranks - 1) / r.ranks : 1.0;
  for (const std::int64_t bytes : o.sizes) {
    const std::int64_t n = std::max<std::int64_t>(1, bytes / 4);
    const tensor t = memory::host_tensor(dtype::f32, shape{n});
    std::fill_n(t.data<float>(), n, 1.0F / static_cast<float>(r.ranks));
    const auto via_loom = [&] { comm->all_reduce(t, t, distributed::reduce_op::sum)->wait(); };
    const auto direct = [&] {
      MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    // Calibrate on rank 0's estimate, shared: every rank must make the same number of calls.
    via_loom();
    direct();
    double once = round_seconds(1, direct);
    MPI_Bcast(&once, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int calls = static_cast<int>(std::clamp(o.round_ms / 1e3 / std::max(once, 1e-7), 1.0, 10000.0));
    MPI_Bcast(&calls, 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<double> loom_s;
    std::vector<double> mpi_s;
    for (int k = 0; k < o.rounds; ++k) {  // alternate, so that drift hits both
      loom_s.push_back(round_seconds(calls, via_loom) / calls);
      mpi_s.push_back(round_seconds(calls, direct) / calls);
    }
    distributed_bench_row row;
    row.bytes = n * 4;
    row.calls_per_round = calls;
    row.loom_us = median(loom_s) * 1e6;
    row.mpi_us = median(mpi_s) * 1e6;
    row.loom_busbw_gbs = static_cast<double>(row.bytes) * bus_factor / (row.loom_us * 1e3);
    row.mpi_busbw_gbs = static_cast<double>(row.bytes) * bus_factor / (row.mpi_us * 1e3);
    row.ratio = row.mpi_us / row.loom_us;
    r.rows.push_back(row);
  }
  return r;
}

std::string to_text(const distributed_bench_result& r) {
  std::string out = fmt::format("all_reduce (float32 sum, in place) on {} ranks, {}\n", r.ranks, r.mpi_version);
  out += fmt::format("{:>10} {:>7} | {:>12} {:>12} | {:>12} {:>12} | {:>10}\n", "bytes", "calls", "loom us",
                     "MPI us", "loom GB/s", "MPI GB/s", "loom/MPI");
  for (const auto& row : r.rows) {
    out += fmt::format("{:>10} {:>7} | {:>12.1f} {:>12.1f} | {:>12.2f} {:>12.2f} | {:>9.3f}x\n", row.bytes,
                       row.calls_per_round, row.loom_us, row.mpi_us, row.loom_busbw_gbs, row.mpi_busbw_gbs,
                       row.ratio);
  }
  out += r.ranks > 1 ? "GB/s: bus bandwidth, bytes x 2(N-1)/N per second (the slowest rank's time); "
                       "loom/MPI: MPI's median time over loom's\n"
                     : "one rank: bytes per second of a copy-free in-place all_reduce (run under mpirun -np N)\n";
  return out;
}

nlohmann::json to_json(const distributed_bench_result& r) {
  nlohmann::json j{{"ranks", r.ranks}, {"mpi_version", r.mpi_version}, {"rows", nlohmann::json::array()}};
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"bytes", row.bytes},
                         {"calls_per_round", row.calls_per_round},
                         {"loom_us", row.loom_us},
                         {"mpi_us", row.mpi_us},
                         {"loom_busbw_gbs", row.loom_busbw_gbs},
                         {"mpi_busbw_gbs", row.mpi_busbw_gbs},
                         {"loom_over_mpi", row.ratio}});
  }
  return j;
}

}  // namespace loom::bench
