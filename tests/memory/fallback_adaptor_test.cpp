// fallback_adaptor: the "spill rather than fail" policy (the CUDA backend stacks it over the
// device pool with managed memory below; here both sides are host memory). Runs under TSan.
#include "loom/memory/fallback_adaptor.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "test_upstreams.hpp"

namespace loom::memory {
namespace {

using testing::counting_upstream;

struct fixture {
  counting_upstream primary_upstream;
  counting_upstream fallback;
  bfc_pool pool{primary_upstream, {.name = "small", .initial_size = 1 << 20, .growth_step = 0}};
  fallback_adaptor adaptor{pool, fallback};
};

TEST(FallbackAdaptor, ServesFromThePrimaryUntilItIsFull) {
  fixture f;
  void* a = f.adaptor.allocate(512 << 10);
  EXPECT_EQ(f.fallback.allocations.load(), 0);
  EXPECT_EQ(f.adaptor.fallback_blocks(), 0u);
  void* b = f.adaptor.allocate(768 << 10);  // does not fit beside a: the fallback serves it
  EXPECT_EQ(f.fallback.allocations.load(), 1);
  EXPECT_EQ(f.adaptor.fallback_blocks(), 1u);
  EXPECT_EQ(f.adaptor.fallback_bytes(), 768u << 10);
  EXPECT_EQ(f.adaptor.fallback_allocations(), 1u);
  // Each block goes back where it came from.
  f.adaptor.deallocate(b, 768 << 10);
  EXPECT_EQ(f.fallback.deallocations.load(), 1);
  EXPECT_EQ(f.fallback.in_use.load(), 0u);
  EXPECT_EQ(f.adaptor.fallback_blocks(), 0u);
  f.adaptor.deallocate(a, 512 << 10);
  EXPECT_EQ(f.pool.get_stats().bytes_in_use, 0u);
  f.pool.check_invariants();
  // The figures are the primary's.
  EXPECT_EQ(f.adaptor.stats()->num_allocs, 1u);
}

TEST(FallbackAdaptor, FailsOnlyWhenBothSidesRefuse) {
  fixture f;
  f.fallback.refuse = true;
  void* a = f.adaptor.allocate(1 << 20);
  EXPECT_THROW((void)f.adaptor.allocate(1), out_of_memory);
  EXPECT_EQ(f.adaptor.fallback_blocks(), 0u);
  f.adaptor.deallocate(a, 1 << 20);
  // Still usable, and other errors are not swallowed.
  EXPECT_THROW((void)f.adaptor.allocate(64, 3), invalid_argument);
  void* b = f.adaptor.allocate(64);
  f.adaptor.deallocate(b, 64);
}

TEST(FallbackAdaptor, ManyThreadsSpillAndReturnConsistently) {
  fixture f;
  constexpr int threads = 4;
  constexpr int rounds = 400;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&f, t] {
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < rounds; ++i) {
        const std::size_t bytes =
            static_cast<std::size_t>((i * 7919 + t * 104729) % (300 << 10)) + 1;
        held.emplace_back(f.adaptor.allocate(bytes), bytes);
        if (held.size() > 3) {
          f.adaptor.deallocate(held.front().first, held.front().second);
          held.erase(held.begin());
        }
      }
      for (auto [p, n] : held) f.adaptor.deallocate(p, n);
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_GT(f.adaptor.fallback_allocations(), 0u);  // 4 threads x 4 blocks of up to 300 KiB > 1 MiB
  EXPECT_EQ(f.adaptor.fallback_blocks(), 0u);
  EXPECT_EQ(f.fallback.in_use.load(), 0u);
  EXPECT_EQ(f.pool.get_stats().bytes_in_use, 0u);
  f.pool.check_invariants();
}

}  // namespace
}  // namespace loom::memory
