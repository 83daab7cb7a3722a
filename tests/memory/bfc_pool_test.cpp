// bfc_pool: construction, best fit, split and coalesce, growth and its limits, alignment,
// misuse, leaks, and the dumps. (Randomized sequences, streams and threads have their own
// files.)
#include "loom/memory/bfc_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "loom/memory/host_resource.hpp"
#include "memory/bfc_test_support.hpp"

namespace {

using bfc_test::recording_upstream;
using loom::memory::bfc_pool;
using loom::memory::bfc_pool_options;
using loom::memory::chunk_info;
using loom::memory::misuse_kind;
using loom::memory::region_info;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

bfc_pool_options fixed(std::size_t size, std::size_t granularity = 256) {
  bfc_pool_options o;
  o.name = "fixed";
  o.initial_size = size;
  o.growth_step = 0;
  o.granularity = granularity;
  return o;
}

bfc_pool_options growing(std::size_t step, std::size_t max_size) {
  bfc_pool_options o;
  o.name = "growing";
  o.growth_step = step;
  o.max_size = max_size;
  return o;
}

char* as_bytes(void* p) {
  return static_cast<char*>(p);
}

// The chunk that starts at p, from a snapshot of the pool.
const chunk_info* chunk_at(const std::vector<region_info>& regions, const void* p) {
  for (const region_info& r : regions) {
    for (const chunk_info& c : r.chunks) {
      if (static_cast<const char*>(r.base) + c.offset == p) return &c;
    }
  }
  return nullptr;
}

TEST(BfcPool, RejectsOptionsThatCannotWork) {
  recording_upstream upstream;
  const auto rejects = [&](bfc_pool_options o) {
    o.name = "bad";
    try {
      bfc_pool pool(upstream, o);
      ADD_FAILURE() << "accepted granularity " << o.granularity << ", initial_size "
                    << o.initial_size << ", growth_step " << o.growth_step;
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("bfc_pool 'bad'"), std::string::npos) << e.what();
    }
  };
  bfc_pool_options o;
  o.granularity = 100;
  rejects(o);
  o.granularity = 32;
  rejects(o);
  o.granularity = std::size_t{1} << 31;
  rejects(o);
  o = bfc_pool_options{};
  o.initial_size = 2 * MiB;
  o.max_size = MiB;
  rejects(o);
  o = bfc_pool_options{};
  o.growth_step = 0;
  rejects(o);
  o = bfc_pool_options{};
  o.region_alignment = 3000;
  rejects(o);
  EXPECT_EQ(upstream.regions_held(), 0U);
}

// Host memory that records the alignment each region was asked with.
class alignment_recording_upstream final : public loom::memory::memory_resource {
 public:
  std::vector<std::size_t> asked;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, loom::stream s) override {
    asked.push_back(alignment);
    return loom::memory::host_resource::instance().allocate(bytes, alignment, s);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     loom::stream s) noexcept override {
    loom::memory::host_resource::instance().deallocate(p, bytes, alignment, s);
  }
};

// A page by default; what the options say otherwise (CUDA's resources refuse more than 256
// bytes), but never less than the granularity.
TEST(BfcPool, AsksItsUpstreamForRegionsAlignedAsConfigured) {
  for (const auto& [region_alignment, granularity, want] :
       {std::tuple{std::size_t{0}, std::size_t{256}, std::size_t{4096}},
        std::tuple{std::size_t{256}, std::size_t{256}, std::size_t{256}},
        std::tuple{std::size_t{256}, std::size_t{8192}, std::size_t{8192}}}) {
    alignment_recording_upstream upstream;
    bfc_pool_options o;
    if (region_alignment != 0) o.region_alignment = region_alignment;
    o.granularity = granularity;
    {
      bfc_pool pool(upstream, o);
      void* p = pool.allocate(1000);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % std::min(want, std::size_t{4096}), 0u);
      pool.deallocate(p, 1000);
    }
    ASSERT_FALSE(upstream.asked.empty());
    for (const std::size_t a : upstream.asked) EXPECT_EQ(a, want);
  }
}

TEST(BfcPool, PreallocatesTheInitialSizeRoundedUpToTheGranularity) {
  recording_upstream upstream;
  {
    bfc_pool pool(upstream, fixed(1000));
    EXPECT_EQ(upstream.region_sizes(), std::vector<std::size_t>{1024});
    const loom::memory_stats s = pool.get_stats();
    EXPECT_EQ(s.bytes_reserved, 1024U);
    EXPECT_EQ(s.num_regions, 1U);
    EXPECT_EQ(s.free_bytes, 1024U);
    EXPECT_EQ(s.largest_free_block, 1024U);
    EXPECT_EQ(&pool.upstream(), &upstream);
    EXPECT_EQ(pool.options().name, "fixed");
  }
  EXPECT_EQ(upstream.regions_held(), 0U);
}

TEST(BfcPool, AllocateZeroGivesDistinctMinimumBlocks) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(4 * KiB));
  void* a = pool.allocate(0);
  void* b = pool.allocate(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  const auto regions = pool.regions();
  for (void* p : {a, b}) {
    const chunk_info* c = chunk_at(regions, p);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->in_use);
    EXPECT_EQ(c->size, 256U);
    EXPECT_EQ(c->requested, 0U);
  }
  EXPECT_EQ(pool.get_stats().allocations_in_use, 2U);
  EXPECT_EQ(pool.get_stats().unusable_bytes, 512U);
  pool.deallocate(a, 0);
  pool.deallocate(b, 0);
  pool.check_invariants();
  EXPECT_EQ(pool.get_stats().allocations_in_use, 0U);
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPool, BestFitTakesTheSmallestHoleThatFits) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(64 * KiB));
  // Holes of 1, 3, 2 and 2 KiB, kept apart by walls in use, then the free tail.
  std::vector<std::pair<void*, std::size_t>> live;
  const auto take = [&](std::size_t bytes) {
    live.emplace_back(pool.allocate(bytes), bytes);
    return live.back().first;
  };
  void* hole1 = pool.allocate(1 * KiB);
  take(256);
  void* hole3 = pool.allocate(3 * KiB);
  take(256);
  void* hole2a = pool.allocate(2 * KiB);
  take(256);
  void* hole2b = pool.allocate(2 * KiB);
  void* last_wall = take(256);
  pool.deallocate(hole1, 1 * KiB);
  pool.deallocate(hole3, 3 * KiB);
  pool.deallocate(hole2a, 2 * KiB);
  pool.deallocate(hole2b, 2 * KiB);
  pool.check_invariants();

  // 1.5 KiB fits the 2 KiB holes best; of two equal holes, the most recently freed wins.
  EXPECT_EQ(take(1536), hole2b);
  // The rest of that hole (512 bytes) is now the best fit for 512 bytes.
  EXPECT_EQ(take(512), as_bytes(hole2b) + 1536);
  EXPECT_EQ(take(2 * KiB), hole2a);
  EXPECT_EQ(take(1 * KiB), hole1);
  EXPECT_EQ(take(2560), hole3);
  // Nothing left fits 4 KiB but the tail, after the last wall.
  EXPECT_EQ(take(4 * KiB), as_bytes(last_wall) + 256);
  pool.check_invariants();
  EXPECT_EQ(pool.get_stats().allocations_in_use, live.size());
  for (const auto& [p, bytes] : live) pool.deallocate(p, bytes);
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPool, BestFitSearchesWithinASizeClass) {
  // Above 32 granules a size class spans several sizes: 64 to 67 granules share one.
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(MiB));
  constexpr std::size_t g = 256;
  std::vector<std::pair<void*, std::size_t>> walls;
  const auto hole = [&](std::size_t granules) {
    void* p = pool.allocate(granules * g);
    walls.emplace_back(pool.allocate(g), g);
    return p;
  };
  void* h67 = hole(67);
  void* h65 = hole(65);
  void* h66 = hole(66);
  pool.deallocate(h66, 66 * g);
  pool.deallocate(h65, 65 * g);
  pool.deallocate(h67, 67 * g);  // the most recently freed, but not the best fit
  EXPECT_EQ(pool.allocate(65 * g + 1), h66);
  EXPECT_EQ(pool.allocate(65 * g), h65);
  EXPECT_EQ(pool.allocate(60 * g), h67);  // its own class is empty: the next class's best
  pool.deallocate(h66, 65 * g + 1);
  pool.deallocate(h65, 65 * g);
  pool.deallocate(h67, 60 * g);
  for (const auto& [p, bytes] : walls) pool.deallocate(p, bytes);
  pool.check_invariants();
}

TEST(BfcPool, SplitsAndCoalescesWithFreeNeighboursInAnyOrder) {
  const std::vector<std::vector<int>> orders{{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                             {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const auto& order : orders) {
    recording_upstream upstream;
    bfc_pool pool(upstream, fixed(16 * KiB));
    void* blocks[3] = {pool.allocate(KiB), pool.allocate(KiB), pool.allocate(KiB)};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(blocks[i], as_bytes(blocks[0]) + i * KiB);
    EXPECT_EQ(pool.regions().at(0).chunks.size(), 4U);  // three blocks and the free tail
    int freed = 0;
    for (const int i : order) {
      pool.deallocate(blocks[i], KiB);
      ++freed;
      pool.check_invariants();  // no two free neighbours: every free coalesced
      std::size_t free_bytes = 0;
      const auto regions = pool.regions();
      for (const chunk_info& c : regions.at(0).chunks) {
        if (!c.in_use) free_bytes += c.size;
      }
      EXPECT_EQ(free_bytes, 13 * KiB + freed * KiB);
    }
    const auto regions = pool.regions();
    ASSERT_EQ(regions.at(0).chunks.size(), 1U);
    EXPECT_FALSE(regions[0].chunks[0].in_use);
    EXPECT_EQ(regions[0].chunks[0].size, 16 * KiB);
  }
}

TEST(BfcPool, GrowsByStepsAndStopsAtMaxSize) {
  recording_upstream upstream;
  bfc_pool pool(upstream, growing(MiB, 2 * MiB + MiB / 2));
  EXPECT_EQ(upstream.regions_held(), 0U);
  void* a = pool.allocate(900 * KiB);
  EXPECT_EQ(upstream.region_sizes(), std::vector<std::size_t>{MiB});
  void* b = pool.allocate(900 * KiB);
  EXPECT_EQ(upstream.regions_held(), 2U);
  // A step would pass max_size; the pool takes the half MiB that is left instead.
  void* c = pool.allocate(300 * KiB);
  EXPECT_EQ(upstream.bytes_held(), 2 * MiB + MiB / 2);
  EXPECT_EQ(pool.get_stats().bytes_reserved, 2 * MiB + MiB / 2);
  pool.check_invariants();
  try {
    (void)pool.allocate(300 * KiB);
    ADD_FAILURE() << "allocated past max_size";
  } catch (const loom::out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bfc_pool 'growing'"), std::string::npos) << what;
    EXPECT_NE(what.find("max_size"), std::string::npos) << what;
    EXPECT_EQ(e.refused_by(), "bfc_pool 'growing'");
    EXPECT_EQ(e.requested_bytes(), 300 * KiB);
    ASSERT_TRUE(e.stats().has_value());
    EXPECT_EQ(e.stats()->num_regions, 3U);
    EXPECT_EQ(e.stats()->bytes_reserved, 2 * MiB + MiB / 2);
    EXPECT_EQ(e.stats()->bytes_in_use, 2100 * KiB);
    EXPECT_EQ(e.stats()->num_failed_allocs, 1U);
  }
  EXPECT_EQ(pool.get_stats().num_failed_allocs, 1U);
  EXPECT_LE(upstream.peak_bytes_held(), 2 * MiB + MiB / 2);
  pool.deallocate(a, 900 * KiB);
  pool.deallocate(b, 900 * KiB);
  pool.deallocate(c, 300 * KiB);
  pool.check_invariants();
}

TEST(BfcPool, GivesARequestLargerThanTheStepARegionOfItsOwn) {
  recording_upstream upstream;
  bfc_pool pool(upstream, growing(MiB, loom::memory::max_allocation_size));
  const std::size_t big = 3 * MiB + 100;
  void* p = pool.allocate(big);
  EXPECT_EQ(upstream.region_sizes(), std::vector<std::size_t>{3 * MiB + 256});
  EXPECT_EQ(pool.get_stats().unusable_bytes, 156U);
  pool.deallocate(p, big);
  pool.check_invariants();
}

TEST(BfcPool, AsksForJustTheRequestWhenTheUpstreamRefusesAStep) {
  recording_upstream upstream(3 * MiB);
  bfc_pool pool(upstream, growing(2 * MiB, loom::memory::max_allocation_size));
  void* a = pool.allocate(1536 * KiB);  // a 2 MiB step
  void* b = pool.allocate(1 * MiB);     // a step is refused; 1 MiB is not
  EXPECT_EQ(upstream.refusals(), 1U);
  EXPECT_EQ(upstream.region_sizes().size(), 2U);
  EXPECT_EQ(upstream.bytes_held(), 3 * MiB);
  pool.deallocate(a, 1536 * KiB);
  pool.deallocate(b, 1 * MiB);
  pool.check_invariants();
}

TEST(BfcPool, FixedPoolRunsOutOfMemoryAndKeepsWorking) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(64 * KiB));
  void* big = pool.allocate(60 * KiB);
  EXPECT_THROW((void)pool.allocate(8 * KiB), loom::out_of_memory);
  try {
    (void)pool.allocate(8 * KiB, 128, bfc_test::fake_stream(7));
    ADD_FAILURE() << "allocated past the end of a fixed pool";
  } catch (const std::bad_alloc& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bfc_pool 'fixed'"), std::string::npos) << what;
    EXPECT_NE(what.find("8192 bytes (alignment 128, stream 0x7)"), std::string::npos) << what;
    EXPECT_NE(what.find("growth_step 0"), std::string::npos) << what;
    EXPECT_NE(what.find("reserved 64.00 KiB"), std::string::npos) << what;
  }
  EXPECT_EQ(pool.get_stats().num_failed_allocs, 2U);
  EXPECT_EQ(upstream.regions_held(), 1U);
  pool.deallocate(big, 60 * KiB);
  void* again = pool.allocate(64 * KiB);
  EXPECT_EQ(again, big);
  pool.deallocate(again, 64 * KiB);
  pool.check_invariants();
}

TEST(BfcPool, RefusesHugeRequestsWithOutOfMemory) {
  recording_upstream upstream(64 * MiB);
  bfc_pool pool(upstream, growing(MiB, loom::memory::max_allocation_size));
  // Past what any resource accepts: refused by the interface before the pool.
  EXPECT_THROW((void)pool.allocate(loom::memory::max_allocation_size + 1), loom::out_of_memory);
  // More granules than a chunk can span.
  EXPECT_THROW((void)pool.allocate(std::size_t{1} << 50), std::bad_alloc);
  // Indexable, but the upstream refuses it.
  try {
    (void)pool.allocate(std::size_t{1} << 36);
    ADD_FAILURE() << "allocated 64 GiB";
  } catch (const loom::out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("upstream refused"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.get_stats().num_failed_allocs, 2U);
  EXPECT_EQ(upstream.regions_held(), 0U);
  pool.check_invariants();
  void* p = pool.allocate(KiB);
  pool.deallocate(p, KiB);
}

TEST(BfcPool, RejectsAlignmentsThatAreNotPowersOfTwo) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(4 * KiB));
  EXPECT_THROW((void)pool.allocate(64, 48), loom::invalid_argument);
  EXPECT_THROW((void)pool.allocate(64, 0), loom::invalid_argument);
  EXPECT_EQ(pool.get_stats().num_failed_allocs, 0U);
  EXPECT_EQ(pool.get_stats().num_allocs, 0U);
}

TEST(BfcPool, ServesLargeAlignmentsAndLeavesTheSkippedFrontFree) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(1 * MiB));
  void* first = pool.allocate(256);  // so that the free space starts unaligned
  for (std::size_t alignment = 512; alignment <= 64 * KiB; alignment *= 2) {
    void* p = pool.allocate(1000, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0U) << alignment;
    pool.check_invariants();
    pool.deallocate(p, 1000, alignment);
  }
  void* p = pool.allocate(100, 64 * KiB);
  const auto regions = pool.regions();
  const chunk_info* front = chunk_at(regions, as_bytes(first) + 256);
  ASSERT_NE(front, nullptr);
  EXPECT_FALSE(front->in_use);
  EXPECT_EQ(as_bytes(first) + 256 + front->size, p);
  pool.deallocate(p, 100, 64 * KiB);
  pool.deallocate(first, 256);
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPool, ReportsMisuseAndChangesNothing) {
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(16 * KiB));
  void* a = pool.allocate(1000);
  void* b = pool.allocate(2 * KiB, 256);
  void* c = pool.allocate(100);
  pool.deallocate(c, 100);
  const auto layout = pool.regions();
  const loom::memory_stats stats = pool.get_stats();

  bfc_test::misuse_capture capture;
  int on_stack = 0;
  pool.deallocate(&on_stack, 4);            // not from this pool
  pool.deallocate(as_bytes(b) + 256, 256);  // inside a block, at a granule
  pool.deallocate(as_bytes(a) + 8, 992);    // inside a block
  pool.deallocate(c, 100);                  // freed already
  pool.deallocate(a, 1024);                 // wrong size
  pool.deallocate(b, 2 * KiB, 64);          // wrong alignment
  const std::vector<loom::memory::misuse_report> reports = capture.taken();
  ASSERT_EQ(reports.size(), 6U);
  const misuse_kind kinds[] = {misuse_kind::unknown_pointer, misuse_kind::unknown_pointer,
                               misuse_kind::unknown_pointer, misuse_kind::double_free,
                               misuse_kind::size_mismatch,   misuse_kind::alignment_mismatch};
  const void* pointers[] = {&on_stack, as_bytes(b) + 256, as_bytes(a) + 8, c, a, b};
  for (std::size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].kind, kinds[i]) << i;
    EXPECT_EQ(reports[i].resource, "bfc_pool 'fixed'") << i;
    EXPECT_EQ(reports[i].pointer, pointers[i]) << i;
    EXPECT_NE(reports[i].message.find("bfc_pool 'fixed'"), std::string::npos);
    EXPECT_NE(reports[i].message.find("nothing was freed"), std::string::npos);
  }
  EXPECT_EQ(reports[4].bytes, 1024U);
  EXPECT_EQ(reports[4].expected, 1000U);
  EXPECT_EQ(reports[5].expected, 2 * KiB);
  EXPECT_NE(reports[5].message.find("alignment 256"), std::string::npos) << reports[5].message;

  EXPECT_TRUE(bfc_test::same_layout(pool.regions(), layout));
  const loom::memory_stats after = pool.get_stats();
  EXPECT_EQ(after.bytes_in_use, stats.bytes_in_use);
  EXPECT_EQ(after.num_deallocs, stats.num_deallocs);
  pool.check_invariants();
  pool.deallocate(a, 1000);
  pool.deallocate(b, 2 * KiB, 256);
  EXPECT_EQ(capture.taken().size(), 6U);
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPool, ReportsBlocksStillInUseWhenDestroyed) {
  recording_upstream upstream;
  bfc_test::misuse_capture capture;
  {
    bfc_pool pool(upstream, fixed(16 * KiB));
    (void)pool.allocate(1000);
    void* p = pool.allocate(500);
    (void)pool.allocate(24);
    pool.deallocate(p, 500);
  }
  EXPECT_EQ(upstream.regions_held(), 0U);
  const auto reports = capture.taken();
  ASSERT_EQ(reports.size(), 1U);
  EXPECT_EQ(reports[0].kind, misuse_kind::leak);
  EXPECT_EQ(reports[0].bytes, 1024U);
  EXPECT_EQ(reports[0].resource, "bfc_pool 'fixed'");
  EXPECT_NE(reports[0].message.find("2 blocks of 1024 bytes"), std::string::npos)
      << reports[0].message;
}

TEST(BfcPool, ResetPeaksBringsThemToTheCurrentValues) {
  recording_upstream upstream;
  bfc_pool pool(upstream, growing(64 * KiB, loom::memory::max_allocation_size));
  void* a = pool.allocate(40 * KiB);
  void* b = pool.allocate(40 * KiB);
  pool.deallocate(b, 40 * KiB);
  EXPECT_EQ(pool.get_stats().peak_bytes_in_use, 80 * KiB);
  EXPECT_EQ(pool.trim(), 64 * KiB);
  EXPECT_EQ(pool.get_stats().peak_bytes_reserved, 128 * KiB);
  pool.reset_peaks();
  EXPECT_EQ(pool.get_stats().peak_bytes_in_use, 40 * KiB);
  EXPECT_EQ(pool.get_stats().peak_bytes_reserved, 64 * KiB);
  pool.deallocate(a, 40 * KiB);
}

TEST(BfcPool, TrimReleasesExactlyTheWhollyFreeRegions) {
  recording_upstream upstream;
  bfc_pool pool(upstream, growing(64 * KiB, loom::memory::max_allocation_size));
  void* in_first = pool.allocate(60 * KiB);
  void* in_second = pool.allocate(60 * KiB);
  void* in_third = pool.allocate(60 * KiB);
  EXPECT_EQ(upstream.regions_held(), 3U);
  pool.deallocate(in_second, 60 * KiB);
  EXPECT_EQ(pool.trim(), 64 * KiB);
  EXPECT_EQ(upstream.regions_held(), 2U);
  EXPECT_EQ(pool.get_stats().num_regions, 2U);
  EXPECT_EQ(pool.trim(), 0U);
  pool.check_invariants();
  // The pool keeps working, growing again when it must.
  void* again = pool.allocate(60 * KiB);
  EXPECT_EQ(upstream.regions_held(), 3U);
  pool.deallocate(in_first, 60 * KiB);
  pool.deallocate(in_third, 60 * KiB);
  pool.deallocate(again, 60 * KiB);
  EXPECT_EQ(pool.trim(), 3 * 64 * KiB);
  EXPECT_EQ(upstream.regions_held(), 0U);
  EXPECT_EQ(pool.get_stats().bytes_reserved, 0U);
  void* after = pool.allocate(KiB);
  EXPECT_EQ(upstream.regions_held(), 1U);
  pool.deallocate(after, KiB);
  pool.check_invariants();
}

// A pool with blocks in use, free chunks and two regions, for the dump tests.
struct dump_fixture : ::testing::Test {
  dump_fixture() : pool(upstream, options()) {
    blocks.push_back(pool.allocate(1000));
    blocks.push_back(pool.allocate(3 * KiB));
    blocks.push_back(pool.allocate(24 * KiB));
    blocks.push_back(pool.allocate(20 * KiB));
    pool.deallocate(blocks[1], 3 * KiB);
  }
  ~dump_fixture() override {
    pool.deallocate(blocks[0], 1000);
    pool.deallocate(blocks[2], 24 * KiB);
    pool.deallocate(blocks[3], 20 * KiB);
  }
  static bfc_pool_options options() {
    bfc_pool_options o;
    o.name = "dumped";
    o.growth_step = 32 * KiB;
    return o;
  }
  recording_upstream upstream;
  bfc_pool pool;
  std::vector<void*> blocks;
};

TEST_F(dump_fixture, TextDumpListsStatsThenEveryChunk) {
  std::ostringstream out;
  pool.dump(out);
  std::istringstream in(out.str());
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "bfc_pool 'dumped': " + loom::to_string(pool.get_stats()));
  const auto regions = pool.regions();
  ASSERT_EQ(regions.size(), 2U);
  for (std::size_t i = 0; i < regions.size(); ++i) {
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(line.rfind("region " + std::to_string(i) + ": ", 0), 0U) << line;
    EXPECT_NE(line.find(std::to_string(regions[i].size) + " bytes"), std::string::npos) << line;
    ASSERT_TRUE(std::getline(in, line));  // the column headings
    for (const chunk_info& c : regions[i].chunks) {
      ASSERT_TRUE(std::getline(in, line));
      std::istringstream row(line);
      std::size_t offset = 0;
      std::size_t size = 0;
      std::size_t requested = 0;
      std::string state;
      row >> offset >> size >> requested >> state;
      EXPECT_EQ(offset, c.offset);
      EXPECT_EQ(size, c.size);
      EXPECT_EQ(requested, c.requested);
      EXPECT_EQ(state, c.in_use ? "in_use" : "free");
    }
  }
  EXPECT_FALSE(std::getline(in, line)) << line;
}

TEST_F(dump_fixture, JsonDumpParsesBackAndAgreesWithRegions) {
  const nlohmann::json j = nlohmann::json::parse(pool.dump_json());
  EXPECT_EQ(j.at("name"), "dumped");
  const loom::memory_stats s = pool.get_stats();
  EXPECT_EQ(j.at("stats").at("bytes_in_use"), s.bytes_in_use);
  EXPECT_EQ(j.at("stats").at("bytes_reserved"), s.bytes_reserved);
  EXPECT_EQ(j.at("stats").at("allocations_in_use"), s.allocations_in_use);
  EXPECT_EQ(j.at("stats").at("free_bytes"), s.free_bytes);
  EXPECT_EQ(j.at("stats").at("largest_free_block"), s.largest_free_block);
  EXPECT_EQ(j.at("stats").at("unusable_bytes"), s.unusable_bytes);
  EXPECT_EQ(j.at("stats").at("num_regions"), s.num_regions);
  EXPECT_EQ(j.at("stats").size(), 13U);
  const auto regions = pool.regions();
  ASSERT_EQ(j.at("regions").size(), regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const nlohmann::json& r = j["regions"][i];
    EXPECT_EQ(r.at("base").get<std::uintptr_t>(),
              reinterpret_cast<std::uintptr_t>(regions[i].base));
    EXPECT_EQ(r.at("size"), regions[i].size);
    ASSERT_EQ(r.at("chunks").size(), regions[i].chunks.size());
    for (std::size_t k = 0; k < regions[i].chunks.size(); ++k) {
      const nlohmann::json& c = r["chunks"][k];
      const chunk_info& expected = regions[i].chunks[k];
      EXPECT_EQ(c.at("offset"), expected.offset);
      EXPECT_EQ(c.at("size"), expected.size);
      EXPECT_EQ(c.at("requested"), expected.requested);
      EXPECT_EQ(c.at("in_use"), expected.in_use);
      EXPECT_EQ(c.at("stream"), expected.freed_on.value());
      EXPECT_EQ(c.at("needs_sync"), expected.needs_sync);
    }
  }
}

#if defined(LOOM_ASAN)
// Under AddressSanitizer the pool poisons free chunks and the tail of every block, so
// mistakes are caught although the memory never goes back to malloc.
TEST(BfcPoolDeathTest, AddressSanitizerCatchesUseAfterFreeAndOverflows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  recording_upstream upstream;
  bfc_pool pool(upstream, fixed(64 * KiB));
  auto* freed = static_cast<volatile char*>(pool.allocate(1000));
  pool.deallocate(const_cast<char*>(freed), 1000);
  EXPECT_DEATH(freed[10] = 1, "use-after-poison");

  auto* block = static_cast<volatile char*>(pool.allocate(100));
  EXPECT_DEATH(block[100] = 1, "AddressSanitizer");  // into the block's padding
  auto* full = static_cast<volatile char*>(pool.allocate(256));
  EXPECT_DEATH(full[256] = 1, "use-after-poison");  // into the free neighbour
  block[99] = 1;                                    // the block itself is fine
  full[255] = 1;
  pool.deallocate(const_cast<char*>(block), 100);
  pool.deallocate(const_cast<char*>(full), 256);
}

TEST(BfcPoolDeathTest, PoisoningCanBeTurnedOff) {
  recording_upstream upstream;
  bfc_pool_options o = fixed(64 * KiB);
  o.poison_free_memory = false;
  bfc_pool pool(upstream, o);
  auto* p = static_cast<volatile char*>(pool.allocate(100));
  p[200] = 1;  // padding, not poisoned: the memory is the pool's and stays mapped
  pool.deallocate(const_cast<char*>(p), 100);
}
#endif

}  // namespace
