#include "memory/memory_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>

#include "bench_stats.hpp"
#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/limiting_adaptor.hpp"
#include "loom/memory/logging_adaptor.hpp"
#include "loom/memory/replay.hpp"
#include "loom/memory/statistics_adaptor.hpp"

namespace loom::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// A precomputed sequence of (slot, size) steps, so that random numbers are not timed and
// every peer sees exactly the same requests.
struct workload {
  std::vector<std::size_t> initial_sizes;  // one per live slot
  std::vector<std::uint32_t> slots;        // the slot replaced at each step
  std::vector<std::size_t> sizes;          // the new size at each step
};

std::size_t log_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  return static_cast<std::size_t>(std::exp(u(rng)));
}

workload make_workload(std::size_t live, std::size_t steps, double lo, double hi, unsigned seed) {
  std::mt19937_64 rng(seed);
  workload w;
  w.initial_sizes.resize(live);
  for (auto& s : w.initial_sizes) s = log_uniform(rng, lo, hi);
  std::uniform_int_distribution<std::uint32_t> slot(0, static_cast<std::uint32_t>(live - 1));
  w.slots.resize(steps);
  w.sizes.resize(steps);
  for (std::size_t i = 0; i < steps; ++i) {
    w.slots[i] = slot(rng);
    w.sizes[i] = log_uniform(rng, lo, hi);
  }
  return w;
}

// The two ways of getting memory that the workloads compare.
struct malloc_peer {
  void* allocate(std::size_t n) {
    void* p = std::malloc(n);  // NOLINT(cppcoreguidelines-no-malloc): the peer
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, std::size_t /*n*/) { std::free(p); }  // NOLINT
};

struct resource_peer {
  memory::memory_resource& r;
  void* allocate(std::size_t n) { return r.allocate(n); }
  void deallocate(void* p, std::size_t n) { r.deallocate(p, n); }
};

// Mixed workload: returns ns per allocate+deallocate pair.
template <typename Peer>
double run_mixed(Peer& peer, const workload& w) {
  std::vector<void*> live(w.initial_sizes.size());
  std::vector<std::size_t> live_size = w.initial_sizes;
  for (std::size_t i = 0; i < live.size(); ++i) {
    live[i] = peer.allocate(live_size[i]);
    static_cast<volatile char*>(live[i])[0] = 1;
  }
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < w.slots.size(); ++i) {
    const std::uint32_t k = w.slots[i];
    peer.deallocate(live[k], live_size[k]);
    live_size[k] = w.sizes[i];
    live[k] = peer.allocate(live_size[k]);
    static_cast<volatile char*>(live[k])[0] = static_cast<char>(i);
  }
  const auto t1 = clock_type::now();
  for (std::size_t i = 0; i < live.size(); ++i) peer.deallocate(live[i], live_size[i]);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() /
         static_cast<double>(w.slots.size());
}

// Large workload: allocate, write every page, free. Returns ns per pair.
template <typename Peer>
double run_large(Peer& peer, const workload& w) {
  constexpr std::size_t page = 4096;
  const auto t0 = clock_type::now();
  for (std::size_t n : w.sizes) {
    auto* p = static_cast<volatile char*>(peer.allocate(n));
    for (std::size_t off = 0; off < n; off += page) p[off] = 1;
    peer.deallocate(const_cast<char*>(p), n);
  }
  const auto t1 = clock_type::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() /
         static_cast<double>(w.sizes.size());
}

// Runs every function `reps` times, after one warm-up call each, interleaving them within
// each repetition so that drifts in machine load hit all alike. Returns the samples of each.
std::vector<std::vector<double>> interleaved(int reps,
                                             const std::vector<std::function<double()>>& fns) {
  std::vector<std::vector<double>> samples(fns.size());
  for (const auto& fn : fns) fn();  // warm-up: pools grow, pages fault in, caches fill
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < fns.size(); ++i) samples[i].push_back(fns[i]());
  }
  return samples;
}

measurement named(std::string name, std::string unit, std::vector<double> samples) {
  const double m = median(samples);
  return {std::move(name), std::move(unit), m, std::move(samples)};
}

memory::bfc_pool_options pool_options(std::string name) {
  memory::bfc_pool_options o;
  o.name = std::move(name);
  o.growth_step = std::size_t{64} << 20;
  return o;
}

// statistics -> limiting -> a pool of its own: the adaptor stack whose cost is measured.
struct adapted_pool {
  explicit adapted_pool(std::string name)
      : pool(memory::host_resource::instance(), pool_options(std::move(name))) {}
  memory::bfc_pool pool;
  memory::statistics_adaptor stats{pool};
  memory::limiting_adaptor limit{stats, std::size_t{64} << 30, "bench budget"};
};

// Records `w` through the logging adaptor and parses the log back.
memory::allocation_log record_log(const workload& w) {
  std::stringstream csv;
  {
    memory::bfc_pool pool(memory::host_resource::instance(), pool_options("bench recording"));
    memory::logging_adaptor logger(pool, csv);
    resource_peer peer{logger};
    run_mixed(peer, w);
  }
  return memory::parse_allocation_log(csv);
}

// Replays `log` against a fresh growing pool; returns events per second.
double run_replay(const memory::allocation_log& log) {
  memory::bfc_pool pool(memory::host_resource::instance(), pool_options("bench replay"));
  const memory::replay_report r = memory::replay(log, pool);
  if (!r.ok()) throw error("bench replay: " + r.first_failure->describe());
  return 1e9 / r.timing.ns_per_event;
}

}  // namespace

memory_bench_result run_memory_bench(const memory_bench_options& options) {
  memory_bench_result result;
  auto& host = memory::host_resource::instance();
  const int reps = options.repetitions;

  // --- mixed sizes ---
  const workload mixed =
      make_workload(options.live_blocks, options.mixed_steps, 64.0, 1024.0 * 1024.0, options.seed);
  malloc_peer glibc;
  // Each peer gets a pool of its own, so that none inherits the free lists another left.
  memory::bfc_pool mixed_pool(host, pool_options("bench mixed"));
  resource_peer pool_peer{mixed_pool};
  adapted_pool mixed_adapted("bench mixed adapted");
  resource_peer adapted_peer{mixed_adapted.limit};
  auto mixed_runs = interleaved(
      reps, {[&] { return run_mixed(glibc, mixed); }, [&] { return run_mixed(pool_peer, mixed); },
             [&] { return run_mixed(adapted_peer, mixed); }});
  measurement m_glibc = named("mixed: glibc malloc+free", "ns/pair", mixed_runs[0]);
  measurement m_pool = named("mixed: bfc_pool allocate+deallocate", "ns/pair", mixed_runs[1]);
  measurement m_adapted =
      named("mixed: statistics+limiting over bfc_pool", "ns/pair", mixed_runs[2]);

  // --- adaptor overhead ---
  // The adaptors' own cost, measured where it is not drowned in cache misses: 100 live
  // blocks of 64 B to 4 KiB, all cache-resident. (The mixed workload above shows what
  // they add when every pair also misses the cache.)
  const workload hot = make_workload(100, options.mixed_steps, 64.0, 4096.0, options.seed + 3);
  memory::bfc_pool hot_pool(host, pool_options("bench hot"));
  resource_peer hot_peer{hot_pool};
  adapted_pool hot_adapted("bench hot adapted");
  resource_peer hot_adapted_peer{hot_adapted.limit};
  auto hot_runs = interleaved(reps, {[&] { return run_mixed(hot_peer, hot); },
                                     [&] { return run_mixed(hot_adapted_peer, hot); }});
  measurement h_pool = named("hot: bfc_pool allocate+deallocate", "ns/pair", hot_runs[0]);
  measurement h_adapted = named("hot: statistics+limiting over bfc_pool", "ns/pair", hot_runs[1]);

  // --- large tensors ---
  const workload large = make_workload(1, options.large_steps, 1024.0 * 1024.0,
                                       64.0 * 1024.0 * 1024.0, options.seed + 1);
  memory::bfc_pool large_pool(host, pool_options("bench large"));
  resource_peer large_peer{large_pool};
  auto large_runs = interleaved(reps, {[&] { return run_large(glibc, large); },
                                       [&] { return run_large(large_peer, large); }});
  measurement l_glibc = named("large: glibc malloc+touch+free", "ns/pair", large_runs[0]);
  measurement l_pool = named("large: bfc_pool allocate+touch+deallocate", "ns/pair", large_runs[1]);

  // --- replay ---
  // The mixed workload again, steps/2 replacements (each two events, plus the initial
  // allocations and the final frees), recorded, parsed, then replayed.
  const workload recorded = make_workload(options.live_blocks, options.replay_events / 2, 64.0,
                                          1024.0 * 1024.0, options.seed + 2);
  const memory::allocation_log log = record_log(recorded);
  measurement r_rate = named(fmt::format("replay: {} events against a growing pool", log.size()),
                             "events/s", interleaved(reps, {[&] { return run_replay(log); }})[0]);

  result.measurements = {m_glibc, m_pool, m_adapted, h_pool, h_adapted, l_glibc, l_pool, r_rate};
  result.targets = {
      {"mixed: glibc time / pool time", m_glibc.median / m_pool.median, ">=", 1.0},
      {"large: glibc time / pool time", l_glibc.median / l_pool.median, ">=", 10.0},
      {"adaptors: ns added per pair (hot)", h_adapted.median - h_pool.median, "<=", 20.0},
      {"replay: million events/s", r_rate.median / 1e6, ">=", 5.0},
  };
  return result;
}

std::string to_text(const memory_bench_result& r) {
  std::string out = fmt::format("{:<48} {:>12} {:>8}   samples\n", "measurement", "median", "unit");
  for (const auto& m : r.measurements) {
    std::string samples;
    for (double s : m.samples) samples += fmt::format(" {:.1f}", s);
    out += fmt::format("{:<48} {:>12.1f} {:>8}  {}\n", m.name, m.median, m.unit, samples);
  }
  out += "\ntargets\n";
  for (const auto& t : r.targets) {
    out += fmt::format("  [{}] {:<40} {:>8.2f} (target {} {})\n", t.met() ? "met" : "MISSED",
                       t.name, t.value, t.op, t.target);
  }
  return out;
}

nlohmann::json to_json(const memory_bench_result& r) {
  nlohmann::json j;
  j["suite"] = "memory";
  for (const auto& m : r.measurements) {
    j["measurements"].push_back(
        {{"name", m.name}, {"unit", m.unit}, {"median", m.median}, {"samples", m.samples}});
  }
  for (const auto& t : r.targets) {
    j["targets"].push_back({{"name", t.name},
                            {"value", t.value},
                            {"op", t.op},
                            {"target", t.target},
                            {"met", t.met()}});
  }
  return j;
}

}  // namespace loom::bench
