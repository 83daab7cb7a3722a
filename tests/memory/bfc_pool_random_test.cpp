// bfc_pool under long seeded random sequences of allocate, deallocate, trim and
// synchronize_streams, in several configurations. After every step the pool's own
// invariants must hold (chunks tile the regions, free chunks are coalesced and binned) and
// its statistics and chunk map must agree with a shadow model kept by the test; blocks
// never overlap and keep their contents until freed.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "loom/memory/bfc_pool.hpp"
#include "memory/bfc_test_support.hpp"

namespace {

using bfc_test::recording_upstream;
using bfc_test::shadow;
using loom::memory::bfc_pool;
using loom::memory::bfc_pool_options;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

struct config {
  const char* name;
  std::size_t granularity;
  std::size_t initial_size;
  std::size_t growth_step;
  std::size_t max_size;
  std::size_t upstream_limit;
  std::size_t max_alignment;  // the largest alignment asked for
  std::size_t max_bytes;      // the largest request
  int streams;                // > 1: blocks move between streams that need synchronising
  int trim_every;             // steps between trims (0: never)
  int steps;
};

void PrintTo(const config& c, std::ostream* os) {
  *os << c.name;
}

class BfcPoolRandom : public ::testing::TestWithParam<config> {};

TEST_P(BfcPoolRandom, KeepsItsInvariantsAndAgreesWithAShadowModel) {
  const config& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  recording_upstream upstream(c.upstream_limit);
  bfc_pool_options o;
  o.name = c.name;
  o.granularity = c.granularity;
  o.initial_size = c.initial_size;
  o.growth_step = c.growth_step;
  o.max_size = c.max_size;
  if (c.streams > 1) o.synchronize = [](loom::stream) {};
  bfc_pool pool(upstream, o);
  shadow model;

  std::uniform_real_distribution<double> log_size(0.0, std::log(static_cast<double>(c.max_bytes)));
  std::uniform_int_distribution<int> percent(0, 99);
  std::uniform_int_distribution<int> alignment_log2(
      0, static_cast<int>(std::log2(static_cast<double>(c.max_alignment))));
  std::uniform_int_distribution<std::uintptr_t> stream_of(
      0, static_cast<std::uintptr_t>(c.streams - 1));
  std::size_t trimmed = 0;
  for (int step = 0; step < c.steps; ++step) {
    SCOPED_TRACE(testing::Message() << c.name << ", step " << step);
    // Hold between 0 and ~64 blocks, drifting, so that the pool fills and empties.
    const bool allocate = model.live() == 0 || (percent(rng) < (step / 256 % 2 == 0 ? 60 : 40));
    const loom::stream s = bfc_test::fake_stream(stream_of(rng));
    if (allocate) {
      const std::size_t bytes =
          percent(rng) < 5 ? 0 : static_cast<std::size_t>(std::exp(log_size(rng)));
      const std::size_t alignment = percent(rng) < 50 ? loom::memory::default_alignment
                                                      : std::size_t{1} << alignment_log2(rng);
      try {
        void* p = pool.allocate(bytes, alignment, s);
        model.allocated(p, bytes, alignment, s);
      } catch (const loom::out_of_memory& e) {
        model.failed();
        ASSERT_TRUE(e.stats().has_value());
        EXPECT_EQ(e.stats()->num_failed_allocs, pool.get_stats().num_failed_allocs);
        EXPECT_NE(std::string(e.what()).find(c.name), std::string::npos);
      }
    } else {
      std::uniform_int_distribution<std::size_t> pick(0, model.live() - 1);
      const bfc_test::block b = model.take(pick(rng));
      // Freed on the stream of its last use: usually where it was allocated.
      pool.deallocate(b.p, b.bytes, b.alignment, percent(rng) < 80 ? b.on : s);
    }
    if (c.trim_every != 0 && step % c.trim_every == c.trim_every - 1) {
      trimmed += pool.trim();
    } else if (c.streams > 1 && percent(rng) < 2) {
      pool.synchronize_streams();
    }
    ASSERT_NO_THROW(pool.check_invariants());
    model.expect_matches(pool);
    EXPECT_EQ(pool.get_stats().bytes_reserved, upstream.bytes_held());
    EXPECT_LE(upstream.bytes_held(), c.max_size);
    if (HasFailure()) return;
  }
  while (model.live() != 0) {
    const bfc_test::block b = model.take(model.live() - 1);
    pool.deallocate(b.p, b.bytes, b.alignment, b.on);
  }
  pool.check_invariants();
  model.expect_matches(pool);
  if (c.growth_step != 0) {
    EXPECT_GT(trimmed + pool.trim(), 0U);
    EXPECT_EQ(upstream.bytes_held(), 0U);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, BfcPoolRandom,
    ::testing::Values(
        config{"fixed_4MiB", 256, 4 * MiB, 0, unlimited, unlimited, 64, MiB, 1, 0, 4000},
        config{"growing_g64", 64, 0, MiB, 12 * MiB, unlimited, 4 * KiB, 3 * MiB, 1, 50, 4000},
        config{"growing_g1024_refusing_upstream", 1024, 512 * KiB, 256 * KiB, unlimited, 6 * MiB,
               64 * KiB, 2 * MiB, 1, 20, 4000},
        config{"growing_g4096_big_steps", 4096, 0, 4 * MiB, 48 * MiB, unlimited, 64 * KiB, 6 * MiB,
               1, 100, 3000},
        config{"three_streams", 256, MiB, 512 * KiB, 8 * MiB, unlimited, 1 * KiB, 512 * KiB, 3, 64,
               4000}),
    [](const ::testing::TestParamInfo<config>& p) { return std::string(p.param.name); });

}  // namespace
