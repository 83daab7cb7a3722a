// statistics_adaptor against a shadow model that recomputes every figure from the calls.
#include "loom/memory/statistics_adaptor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/host_resource.hpp"
#include "memory/test_upstreams.hpp"

namespace {

namespace lm = loom::memory;
using lm::testing::picky_upstream;
using lm::statistics_adaptor;

#if defined(LOOM_ASAN) || defined(LOOM_TSAN)
constexpr int ops_per_thread = 3000;
#else
constexpr int ops_per_thread = 30000;
#endif

// The smallest k with 2^k >= bytes, by counting.
std::size_t model_size_class(std::size_t bytes) {
  std::size_t k = 0;
  while ((std::size_t{1} << k) < bytes) ++k;
  return k;
}

// What the adaptor should report, recomputed from the calls one at a time.
struct model {
  loom::memory_stats stats;
  statistics_adaptor::histogram_type histogram{};

  void allocated(std::size_t bytes) {
    stats.bytes_in_use += bytes;
    stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
    stats.total_bytes_allocated += bytes;
    ++stats.allocations_in_use;
    ++stats.num_allocs;
    auto& c = histogram[model_size_class(bytes)];
    ++c.num_allocs;
    ++c.in_use;
  }
  void freed(std::size_t bytes) {
    stats.bytes_in_use -= bytes;
    --stats.allocations_in_use;
    ++stats.num_deallocs;
    --histogram[model_size_class(bytes)].in_use;
  }
  void failed() { ++stats.num_failed_allocs; }
};

void expect_stats_eq(const loom::memory_stats& actual, const loom::memory_stats& expected) {
  EXPECT_EQ(actual.bytes_in_use, expected.bytes_in_use);
  EXPECT_EQ(actual.peak_bytes_in_use, expected.peak_bytes_in_use);
  EXPECT_EQ(actual.total_bytes_allocated, expected.total_bytes_allocated);
  EXPECT_EQ(actual.allocations_in_use, expected.allocations_in_use);
  EXPECT_EQ(actual.num_allocs, expected.num_allocs);
  EXPECT_EQ(actual.num_deallocs, expected.num_deallocs);
  EXPECT_EQ(actual.num_failed_allocs, expected.num_failed_allocs);
  // The fields a pool fills stay 0.
  EXPECT_EQ(actual.bytes_reserved, 0u);
  EXPECT_EQ(actual.free_bytes, 0u);
  EXPECT_EQ(actual.num_regions, 0u);
}

struct block {
  void* p;
  std::size_t bytes;
};

// Random calls on `stats`, mirrored into `m`: allocations of up to twice what the
// upstream accepts (so some fail), frees of random live blocks. Leaves `live` live.
void random_calls(statistics_adaptor& stats, model& m, std::vector<block>& live, std::uint64_t seed,
                  int ops) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < ops; ++i) {
    if (live.size() < 100 && (live.empty() || rng() % 2 == 0)) {
      const std::size_t bytes =
          rng() % 8 == 0 ? rng() % (2 * picky_upstream::max_bytes) : rng() % 5000;
      if (bytes == picky_upstream::rejected_bytes) continue;
      try {
        live.push_back({stats.allocate(bytes), bytes});
        m.allocated(bytes);
      } catch (const loom::out_of_memory&) {
        m.failed();
      }
    } else {
      const std::size_t k = rng() % live.size();
      stats.deallocate(live[k].p, live[k].bytes);
      m.freed(live[k].bytes);
      live[k] = live.back();
      live.pop_back();
    }
  }
}

TEST(StatisticsAdaptor, SizeClassesArePowersOfTwo) {
  for (std::size_t k = 0; k <= 62; ++k) {
    const std::size_t power = std::size_t{1} << k;
    EXPECT_EQ(statistics_adaptor::size_class(power), model_size_class(power));
    EXPECT_EQ(statistics_adaptor::size_class(power + 1), model_size_class(power + 1));
    if (power > 2) {
      EXPECT_EQ(statistics_adaptor::size_class(power - 1), k);
    }
  }
  EXPECT_EQ(statistics_adaptor::size_class(0), 0u);
  EXPECT_EQ(statistics_adaptor::size_class(lm::max_allocation_size),
            statistics_adaptor::num_size_classes - 1);
}

TEST(StatisticsAdaptor, MatchesTheModelAfterEveryCall) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  model m;
  std::vector<block> live;
  for (int round = 0; round < 200; ++round) {
    random_calls(stats, m, live, static_cast<std::uint64_t>(round), 25);
    expect_stats_eq(stats.get_stats(), m.stats);
    ASSERT_EQ(stats.histogram(), m.histogram) << "after round " << round;
  }
  EXPECT_GT(m.stats.num_failed_allocs, 0u);  // the sequence did exercise failures
  for (const block& b : live) stats.deallocate(b.p, b.bytes);
}

TEST(StatisticsAdaptor, StatsReportsItsOwnFigures) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  void* p = stats.allocate(1000);
  const std::optional<loom::memory_stats> s = stats.stats();
  ASSERT_TRUE(s.has_value());
  expect_stats_eq(*s, stats.get_stats());
  EXPECT_EQ(s->bytes_in_use, 1000u);
  stats.deallocate(p, 1000);
}

TEST(StatisticsAdaptor, HistogramCountsEachSizeClass) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  model m;
  std::vector<block> live;
  for (const std::size_t bytes : {0, 1, 2, 3, 4, 5, 1000, 1024, 1025, 4096, 4097}) {
    live.push_back({stats.allocate(bytes), bytes});
    m.allocated(bytes);
  }
  EXPECT_EQ(stats.histogram(), m.histogram);
  EXPECT_EQ(stats.histogram()[10], (lm::size_class_counts{2, 2}));  // 1000 and 1024
  for (std::size_t i = 0; i < live.size(); i += 2) {
    stats.deallocate(live[i].p, live[i].bytes);
    m.freed(live[i].bytes);
  }
  EXPECT_EQ(stats.histogram(), m.histogram);
  for (std::size_t i = 1; i < live.size(); i += 2) stats.deallocate(live[i].p, live[i].bytes);
}

TEST(StatisticsAdaptor, ResetPeaksLowersThePeakToTheBytesInUse) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  void* a = stats.allocate(1000);
  void* b = stats.allocate(2000);
  stats.deallocate(b, 2000);
  EXPECT_EQ(stats.get_stats().peak_bytes_in_use, 3000u);
  stats.reset_peaks();
  EXPECT_EQ(stats.get_stats().peak_bytes_in_use, 1000u);
  void* c = stats.allocate(500);
  EXPECT_EQ(stats.get_stats().peak_bytes_in_use, 1500u);
  stats.deallocate(c, 500);
  stats.deallocate(a, 1000);
  EXPECT_EQ(stats.get_stats().peak_bytes_in_use, 1500u);
}

TEST(StatisticsAdaptor, CountsOnlyOutOfMemoryAsAFailure) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  EXPECT_THROW((void)stats.allocate(picky_upstream::rejected_bytes), loom::invalid_argument);
  EXPECT_THROW((void)stats.allocate(lm::max_allocation_size + 1), loom::out_of_memory);
  EXPECT_EQ(stats.get_stats().num_failed_allocs, 0u);  // neither reached the upstream
  EXPECT_THROW((void)stats.allocate(picky_upstream::max_bytes + 1), loom::out_of_memory);
  const loom::memory_stats s = stats.get_stats();
  EXPECT_EQ(s.num_failed_allocs, 1u);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.bytes_in_use, 0u);
}

// Threads run random calls, each mirrored into its own model; some blocks outlive their
// thread and are freed by another. Once the threads are joined every count is exact.
TEST(StatisticsAdaptor, CountsExactlyAcrossThreads) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  constexpr int threads = 4;
  std::vector<model> models(threads);
  std::vector<std::vector<block>> left(threads);
  for (int round = 0; round < 2; ++round) {  // the second round reuses exited threads' shards
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const auto i = static_cast<std::size_t>(t);
        random_calls(stats, models[i], left[i], static_cast<std::uint64_t>(round * 10 + t),
                     ops_per_thread);
      });
    }
    for (std::thread& w : workers) w.join();

    model sum;
    std::size_t max_thread_peak = 0;
    std::size_t sum_thread_peaks = 0;
    for (const model& m : models) {
      sum.stats.bytes_in_use += m.stats.bytes_in_use;
      sum.stats.total_bytes_allocated += m.stats.total_bytes_allocated;
      sum.stats.allocations_in_use += m.stats.allocations_in_use;
      sum.stats.num_allocs += m.stats.num_allocs;
      sum.stats.num_deallocs += m.stats.num_deallocs;
      sum.stats.num_failed_allocs += m.stats.num_failed_allocs;
      for (std::size_t k = 0; k < statistics_adaptor::num_size_classes; ++k) {
        sum.histogram[k].num_allocs += m.histogram[k].num_allocs;
        sum.histogram[k].in_use += m.histogram[k].in_use;
      }
      max_thread_peak = std::max(max_thread_peak, m.stats.peak_bytes_in_use);
      sum_thread_peaks += m.stats.peak_bytes_in_use;
    }
    const loom::memory_stats s = stats.get_stats();
    sum.stats.peak_bytes_in_use = s.peak_bytes_in_use;  // checked by bounds below
    expect_stats_eq(s, sum.stats);
    EXPECT_EQ(stats.histogram(), sum.histogram);
    // Each thread held only its own blocks, so the global peak is at least any thread's
    // and at most their sum.
    EXPECT_GE(s.peak_bytes_in_use, max_thread_peak);
    EXPECT_LE(s.peak_bytes_in_use, sum_thread_peaks);
  }
  for (std::size_t t = 0; t < threads; ++t) {
    for (const block& b : left[t]) stats.deallocate(b.p, b.bytes);
  }
  const loom::memory_stats s = stats.get_stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.allocations_in_use, 0u);
  EXPECT_EQ(s.num_allocs, s.num_deallocs);
}

// A thread_local destroyed after the adaptor's per-thread state (it was constructed
// before the thread first used the adaptor) frees through the adaptor at thread exit.
struct frees_at_thread_exit {
  lm::memory_resource* resource = nullptr;
  void* p = nullptr;
  ~frees_at_thread_exit() {
    if (p != nullptr) resource->deallocate(p, 64);
  }
};
thread_local frees_at_thread_exit t_frees_at_exit;

TEST(StatisticsAdaptor, CountsFreesMadeWhileAThreadExits) {
  picky_upstream upstream;
  statistics_adaptor stats(upstream);
  std::thread([&] {
    t_frees_at_exit.resource = &stats;
    t_frees_at_exit.p = stats.allocate(64);
  }).join();
  const loom::memory_stats s = stats.get_stats();
  EXPECT_EQ(s.num_allocs, 1u);
  EXPECT_EQ(s.num_deallocs, 1u);
  EXPECT_EQ(s.bytes_in_use, 0u);
}

}  // namespace
