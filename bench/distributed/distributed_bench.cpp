#include "distributed/distributed_bench.hpp"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "bench_stats.hpp"
#include "distributed/mpi_persistent.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

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

// One round of data-parallel training with `t` on `comm` (nullptr: this process alone): two
// epochs of t.max_steps_per_epoch steps, the second timed (the first builds the plan and
// warms the pools); t.batch is each rank's.
training_row train_round(train::train_options t, const train::dataset& data,
                         std::shared_ptr<distributed::communicator> comm) {
  t.epochs = 2;
  t.threads = 1;
  t.evaluate = false;
  const int ranks = comm ? comm->size() : 1;
  t.batch *= ranks;
  t.communicator = std::move(comm);
  const train::train_report r = train::train(data, train::dataset{}, t);
  training_row row;
  row.ranks = ranks;
  const auto& e = r.epochs.back();
  const auto steps = static_cast<double>(r.steps) / 2;
  row.step_ms = 1e3 * e.seconds / steps;
  row.samples_per_second = e.samples_per_second;
  row.communication_ms = 1e3 * r.communication_seconds / static_cast<double>(r.steps);
  row.overlapped_ms = 1e3 * r.overlapped_seconds / static_cast<double>(r.steps);
  row.buckets = r.buckets;
  return row;
}

// The median of a configuration's rounds (by step time), named `what`.
training_row median_round(std::vector<training_row> rounds, std::string what) {
  std::ranges::sort(rounds, {}, &training_row::step_ms);
  training_row row = rounds[rounds.size() / 2];
  row.what = std::move(what);
  return row;
}

// The median round of each configuration (by step time), rounds alternating between them.
std::vector<training_row> training_rows(const distributed_bench_options& o) {
  const auto world = distributed::world();
  const int ranks = world->size();
  const train::dataset data = train::make_digits(o.rank_batch * ranks * o.train_steps, 1);
  train::train_options t;
  t.max_steps_per_epoch = o.train_steps;
  t.bucket_bytes = o.bucket_bytes;
  t.batch = o.rank_batch;
  train::train_options serial = t;
  serial.overlap = false;
  std::vector<std::vector<training_row>> rounds(3);
  for (int k = 0; k < o.train_rounds; ++k) {
    rounds[0].push_back(train_round(t, data, world));
    rounds[1].push_back(train_round(serial, data, world));
    // One rank alone, the others waiting (and yielding their cores, OMPI_MCA_mpi_yield_when_idle).
    MPI_Barrier(MPI_COMM_WORLD);
    if (world->rank() == 0) rounds[2].push_back(train_round(t, data, nullptr));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  std::vector<training_row> out;
  const char* names[] = {"overlap", "no overlap", "one rank alone"};
  for (std::size_t c = 0; c < rounds.size(); ++c) {
    if (rounds[c].empty()) continue;
    out.push_back(median_round(std::move(rounds[c]),
                               c < 2 ? fmt::format("{} ranks, {}", ranks, names[c]) : names[c]));
  }
  return out;
}

// The CNN with batch norms, data-parallel on every rank: plain (each rank's statistics)
// and synchronized (sync_batch_norm), rounds alternating, the median round of each.
std::vector<training_row> batch_norm_rows(const distributed_bench_options& o) {
  const auto world = distributed::world();
  const train::dataset data =
      train::make_digits(o.batch_norm_rank_batch * world->size() * o.batch_norm_steps, 2);
  train::train_options t;
  t.model = "cnn";
  t.batch_norm = true;
  t.max_steps_per_epoch = o.batch_norm_steps;
  t.batch = o.batch_norm_rank_batch;
  train::train_options sync = t;
  sync.sync_batch_norm = true;
  std::vector<std::vector<training_row>> rounds(2);
  for (int k = 0; k < o.train_rounds; ++k) {
    rounds[0].push_back(train_round(t, data, world));
    rounds[1].push_back(train_round(sync, data, world));
  }
  return {median_round(std::move(rounds[0]), fmt::format("{} ranks, batch norm", world->size())),
          median_round(std::move(rounds[1]),
                       fmt::format("{} ranks, sync batch norm", world->size()))};
}

}  // namespace

distributed_bench_result run_distributed_bench(const distributed_bench_options& o) {
  const auto comm = distributed::world();  // initialises MPI
  // The same all_reduce without the ranks' agreement check (communicator::set_checked).
  const auto bare = comm->split(0, comm->rank());
  bare->set_checked(false);
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
  struct signature_words {
    std::int32_t words[6]{};
  };
  signature_words mine;
  std::vector<signature_words> every(static_cast<std::size_t>(r.ranks));
  MPI_Request agreement = MPI_REQUEST_NULL;
  distributed::allgather_init(&mine, sizeof mine, MPI_BYTE, every.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD,
                              MPI_INFO_NULL, &agreement);
  for (const std::int64_t bytes : o.sizes) {
    const std::int64_t n = std::max<std::int64_t>(1, bytes / 4);
    const tensor t = memory::host_tensor(dtype::f32, shape{n});
    std::fill_n(t.data<float>(), n, 1.0F / static_cast<float>(r.ranks));
    const auto via_loom = [&] { comm->all_reduce(t, t, distributed::reduce_op::sum)->wait(); };
    const auto unchecked = [&] { bare->all_reduce(t, t, distributed::reduce_op::sum)->wait(); };
    const auto direct = [&] {
      MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    // The floor of a checked all_reduce: the communicator's agreement exchange (a persistent
    // all-gather of 24 bytes, polled; Note [agreeing ranks]) made directly, then MPI_Allreduce.
    const auto agreed = [&] {
      MPI_Start(&agreement);
      for (int flag = 0; flag == 0;) MPI_Test(&agreement, &flag, MPI_STATUS_IGNORE);
      direct();
    };
    // Calibrate on rank 0's estimate, shared: every rank must make the same number of calls.
    via_loom();
    unchecked();
    direct();
    agreed();
    double once = round_seconds(1, direct);
    MPI_Bcast(&once, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int calls = static_cast<int>(std::clamp(o.round_ms / 1e3 / std::max(once, 1e-7), 1.0, 10000.0));
    MPI_Bcast(&calls, 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<double> loom_s;
    std::vector<double> unchecked_s;
    std::vector<double> mpi_s;
    std::vector<double> agreed_s;
    for (int k = 0; k < o.rounds; ++k) {  // alternate, so that drift hits each alike
      loom_s.push_back(round_seconds(calls, via_loom) / calls);
      unchecked_s.push_back(round_seconds(calls, unchecked) / calls);
      mpi_s.push_back(round_seconds(calls, direct) / calls);
      agreed_s.push_back(round_seconds(calls, agreed) / calls);
    }
    distributed_bench_row row;
    row.bytes = n * 4;
    row.calls_per_round = calls;
    row.loom_us = median(loom_s) * 1e6;
    row.unchecked_us = median(unchecked_s) * 1e6;
    row.mpi_us = median(mpi_s) * 1e6;
    row.agreed_mpi_us = median(agreed_s) * 1e6;
    row.loom_busbw_gbs = static_cast<double>(row.bytes) * bus_factor / (row.loom_us * 1e3);
    row.mpi_busbw_gbs = static_cast<double>(row.bytes) * bus_factor / (row.mpi_us * 1e3);
    row.ratio = row.mpi_us / row.loom_us;
    row.unchecked_ratio = row.mpi_us / row.unchecked_us;
    row.agreed_ratio = row.agreed_mpi_us / row.loom_us;
    r.rows.push_back(row);
  }
  MPI_Request_free(&agreement);
  if (o.train_steps > 0) {
    r.rank_batch = o.rank_batch;
    r.bucket_bytes = o.bucket_bytes;
    r.training = training_rows(o);
  }
  if (o.batch_norm_steps > 0) {
    r.batch_norm_rank_batch = o.batch_norm_rank_batch;
    r.batch_norm = batch_norm_rows(o);
  }
  return r;
}

// The batch norm comparison's lines (none without it).
std::string batch_norm_text(const distributed_bench_result& r) {
  if (r.batch_norm.size() < 2) return {};
  std::string out = fmt::format(
      "\ndata-parallel training, cnn with batch norms (Adam), {} examples a rank a step, 1 "
      "thread a rank\n{:<28} {:>9} {:>12} {:>11}\n",
      r.batch_norm_rank_batch, "", "ms/step", "samples/s", "comm ms");
  for (const auto& t : r.batch_norm) {
    out += fmt::format("{:<28} {:>9.3f} {:>12.0f} {:>11.3f}\n", t.what, t.step_ms,
                       t.samples_per_second, t.communication_ms);
  }
  const training_row& plain = r.batch_norm[0];
  const training_row& sync = r.batch_norm[1];
  out += fmt::format(
      "sync batch norm: {:+.3f} ms a step ({:+.1f}%) over plain data-parallel batch norm\n",
      sync.step_ms - plain.step_ms, 100 * (sync.step_ms - plain.step_ms) / plain.step_ms);
  return out;
}

std::string to_text(const distributed_bench_result& r) {
  std::string out = fmt::format("all_reduce (float32 sum, in place) on {} ranks, {}\n", r.ranks, r.mpi_version);
  out += fmt::format("{:>10} {:>7} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} {:>9}\n", "bytes", "calls",
                     "loom us", "unchk us", "MPI us", "MPI+a us", "loom GB/s", "MPI GB/s", "loom/MPI", "unchk/MPI",
                     "loom/MPI+a");
  for (const auto& row : r.rows) {
    out += fmt::format(
        "{:>10} {:>7} | {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} | {:>9.2f} {:>9.2f} | {:>8.3f}x {:>8.3f}x {:>8.3f}x\n",
        row.bytes, row.calls_per_round, row.loom_us, row.unchecked_us, row.mpi_us, row.agreed_mpi_us,
        row.loom_busbw_gbs, row.mpi_busbw_gbs, row.ratio, row.unchecked_ratio, row.agreed_ratio);
  }
  out += r.ranks > 1 ? "GB/s: bus bandwidth, bytes x 2(N-1)/N per second (the slowest rank's time); "
                       "loom/MPI: MPI's median time over loom's; unchk: loom with set_checked(false), no agreement check or timeout; "
                       "MPI+a: the checked communicator's agreement exchange (a persistent 24-byte all-gather) made directly, then MPI_Allreduce\n"
                     : "one rank: bytes per second of a copy-free in-place all_reduce (run under mpirun -np N)\n";
  if (r.training.empty()) return out + batch_norm_text(r);
  out += fmt::format(
      "\ndata-parallel training, mlp 784-512-512-10 (Adam), {} examples a rank a step, 1 thread "
      "a rank, {} gradient buckets of at most {:.2f} MiB\n",
      r.rank_batch, r.training.front().buckets, static_cast<double>(r.bucket_bytes) / (1 << 20));
  out += fmt::format("{:<24} {:>9} {:>12} {:>11} {:>11}\n", "", "ms/step", "samples/s", "comm ms",
                     "hidden ms");
  for (const auto& t : r.training) {
    out += fmt::format("{:<24} {:>9.3f} {:>12.0f} {:>11.3f} {:>11.3f}\n", t.what, t.step_ms,
                       t.samples_per_second, t.communication_ms, t.overlapped_ms);
  }
  const auto find = [&](std::string_view what) -> const training_row* {
    for (const auto& t : r.training) {
      if (t.what.ends_with(what)) return &t;
    }
    return nullptr;
  };
  const training_row* ov = find(", overlap");
  const training_row* no = find("no overlap");
  const training_row* one = find("alone");
  if (ov != nullptr && no != nullptr && r.ranks > 1) {
    out += fmt::format(
        "overlap: a step {:.1f}% shorter than without ({:.3f} vs {:.3f} ms); {:.0f}% of the "
        "communication ran beside compute\n",
        100 * (no->step_ms - ov->step_ms) / no->step_ms, ov->step_ms, no->step_ms,
        ov->communication_ms > 0 ? 100 * ov->overlapped_ms / ov->communication_ms : 0.0);
  }
  if (ov != nullptr && one != nullptr && r.ranks > 1) {
    out += fmt::format("scaling: {} ranks train {:.2f}x the samples/s of one rank alone ({:.0f}% "
                       "of linear)\n",
                       r.ranks, ov->samples_per_second / one->samples_per_second,
                       100 * ov->samples_per_second / (one->samples_per_second * r.ranks));
  }
  out += batch_norm_text(r);
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
                         {"loom_over_mpi", row.ratio},
                         {"unchecked_us", row.unchecked_us},
                         {"unchecked_over_mpi", row.unchecked_ratio},
                         {"agreed_mpi_us", row.agreed_mpi_us},
                         {"loom_over_agreed_mpi", row.agreed_ratio}});
  }
  j["training"] = nlohmann::json::array();
  for (const auto& t : r.training) {
    j["training"].push_back({{"what", t.what},
                             {"ranks", t.ranks},
                             {"step_ms", t.step_ms},
                             {"samples_per_second", t.samples_per_second},
                             {"communication_ms", t.communication_ms},
                             {"overlapped_ms", t.overlapped_ms}});
  }
  j["batch_norm"] = nlohmann::json::array();
  for (const auto& t : r.batch_norm) {
    j["batch_norm"].push_back({{"what", t.what},
                               {"ranks", t.ranks},
                               {"step_ms", t.step_ms},
                               {"samples_per_second", t.samples_per_second},
                               {"communication_ms", t.communication_ms}});
  }
  return j;
}

}  // namespace loom::bench
