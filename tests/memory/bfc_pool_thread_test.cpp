// bfc_pool from many threads at once: allocation with content checks, trims that run
// while other threads keep allocating, concurrent growth under max_size, and statistics
// read meanwhile. Run under TSan too.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "loom/memory/bfc_pool.hpp"
#include "memory/bfc_test_support.hpp"

namespace {

using bfc_test::block;
using bfc_test::recording_upstream;
using loom::memory::bfc_pool;
using loom::memory::bfc_pool_options;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr int threads = 4;

#if defined(LOOM_TSAN) || defined(LOOM_ASAN)
constexpr int ops_per_thread = 3000;
#else
constexpr int ops_per_thread = 20000;
#endif

// Allocates and frees random blocks of up to `max_bytes` on the calling thread, holding up
// to `max_live` at once, filling each with a pattern and checking it before freeing.
// Returns the number of blocks that came back overwritten (0 when all is well).
int churn(bfc_pool& pool, std::uint64_t seed, std::size_t max_bytes, std::size_t max_live,
          int ops) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> size(0, max_bytes);
  std::vector<block> live;
  int broken = 0;
  for (int i = 0; i < ops; ++i) {
    if (live.size() < max_live && (live.empty() || rng() % 2 == 0)) {
      const std::size_t bytes = size(rng);
      try {
        void* p = pool.allocate(bytes);
        block b{static_cast<unsigned char*>(p), bytes, loom::memory::default_alignment,
                loom::stream{}, static_cast<unsigned char>(rng() % 255 + 1)};
        bfc_test::fill(b);
        live.push_back(b);
      } catch (const loom::out_of_memory&) {
        // A bounded pool may be full for a moment; the others free soon.
      }
    } else {
      const std::size_t k = rng() % live.size();
      if (!bfc_test::intact(live[k])) ++broken;
      pool.deallocate(live[k].p, live[k].bytes);
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (const block& b : live) {
    if (!bfc_test::intact(b)) ++broken;
    pool.deallocate(b.p, b.bytes);
  }
  return broken;
}

TEST(BfcPoolThreads, ManyThreadsAllocateAndFreeWithoutCorruption) {
  recording_upstream upstream;
  bfc_pool_options o;
  o.name = "threads";
  o.growth_step = MiB;
  bfc_pool pool(upstream, o);
  std::atomic<int> broken{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] { broken += churn(pool, 100 + t, 64 * KiB, 64, ops_per_thread); });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(broken.load(), 0);
  pool.check_invariants();
  const loom::memory_stats s = pool.get_stats();
  EXPECT_EQ(s.allocations_in_use, 0U);
  EXPECT_EQ(s.bytes_in_use, 0U);
  EXPECT_EQ(s.num_allocs, s.num_deallocs);
  EXPECT_EQ(s.bytes_reserved, upstream.bytes_held());
}

TEST(BfcPoolThreads, TrimRunsWhileOtherThreadsKeepAllocating) {
  recording_upstream upstream;
  bfc_pool_options o;
  o.name = "trimmed";
  o.growth_step = 256 * KiB;  // small regions, so that many become wholly free
  bfc_pool pool(upstream, o);
  std::atomic<int> running{threads};
  std::atomic<int> broken{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      broken += churn(pool, 200 + t, 200 * KiB, 16, ops_per_thread);
      --running;
    });
  }
  std::size_t trims = 0;
  std::size_t released = 0;
  while (running.load() != 0) {
    released += pool.trim();
    ++trims;
    pool.check_invariants();
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(broken.load(), 0);
  EXPECT_GT(trims, 0U);
  released += pool.trim();
  EXPECT_GT(released, 0U);
  EXPECT_EQ(upstream.bytes_held(), 0U);
  EXPECT_EQ(pool.get_stats().num_regions, 0U);
  // And the pool still works.
  void* p = pool.allocate(KiB);
  pool.deallocate(p, KiB);
  pool.check_invariants();
}

TEST(BfcPoolThreads, ConcurrentGrowthNeverPassesMaxSize) {
  recording_upstream upstream;
  bfc_pool_options o;
  o.name = "bounded";
  o.growth_step = MiB;
  o.max_size = 6 * MiB;
  bfc_pool pool(upstream, o);
  std::atomic<int> broken{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back(
        [&, t] { broken += churn(pool, 300 + t, 900 * KiB, 4, ops_per_thread / 4); });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(broken.load(), 0);
  EXPECT_LE(upstream.peak_bytes_held(), 6 * MiB);
  EXPECT_LE(pool.get_stats().peak_bytes_reserved, 6 * MiB);
  pool.check_invariants();
}

TEST(BfcPoolThreads, StatisticsAndDumpsCanBeReadMeanwhile) {
  recording_upstream upstream;
  bfc_pool_options o;
  o.name = "observed";
  o.growth_step = MiB;
  bfc_pool pool(upstream, o);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const loom::memory_stats s = pool.get_stats();
      EXPECT_EQ(s.bytes_in_use + s.unusable_bytes + s.free_bytes, s.bytes_reserved);
      pool.check_invariants();
      (void)pool.dump_json();
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < threads - 1; ++t) {
    workers.emplace_back(
        [&, t] { EXPECT_EQ(churn(pool, 400 + t, 32 * KiB, 32, ops_per_thread), 0); });
  }
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  pool.check_invariants();
}

}  // namespace
