// bfc_pool's stream-ordered reuse (Note [stream-ordered memory]): a block freed on stream
// S is reused at once on S, and on another stream only after the pool has synchronised S.
// Two fake streams are distinct handles; the synchronizer records its calls.
#include <gtest/gtest.h>

#include <sstream>

#include "loom/memory/bfc_pool.hpp"
#include "memory/bfc_test_support.hpp"

namespace {

using bfc_test::fake_stream;
using bfc_test::recording_upstream;
using bfc_test::sync_recorder;
using loom::memory::bfc_pool;
using loom::memory::bfc_pool_options;

constexpr std::size_t KiB = 1024;
const loom::stream s1 = fake_stream(1);
const loom::stream s2 = fake_stream(2);
const loom::stream s3 = fake_stream(3);

bfc_pool_options with_streams(sync_recorder& recorder, std::size_t initial, std::size_t step = 0) {
  bfc_pool_options o;
  o.name = "streams";
  o.initial_size = initial;
  o.growth_step = step;
  o.synchronize = recorder.callback();
  return o;
}

TEST(BfcPoolStreams, ReusesABlockAtOnceOnTheStreamItWasFreedOn) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 4 * KiB));
  void* p = pool.allocate(4 * KiB, s1);
  pool.deallocate(p, 4 * KiB, s1);
  const auto regions = pool.regions();
  ASSERT_EQ(regions.at(0).chunks.size(), 1U);
  EXPECT_TRUE(regions[0].chunks[0].needs_sync);
  EXPECT_EQ(regions[0].chunks[0].freed_on, s1);
  EXPECT_EQ(pool.allocate(4 * KiB, s1), p);
  EXPECT_TRUE(recorder.calls().empty());
  pool.deallocate(p, 4 * KiB, s1);
}

TEST(BfcPoolStreams, ReusesABlockOnAnotherStreamOnlyAfterSynchronising) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 4 * KiB));
  void* p = pool.allocate(4 * KiB, s1);
  pool.deallocate(p, 4 * KiB, s1);
  EXPECT_EQ(pool.allocate(4 * KiB, s2), p);
  EXPECT_EQ(recorder.calls(), std::vector<loom::stream>{s1});
  pool.deallocate(p, 4 * KiB, s2);
  pool.check_invariants();
}

TEST(BfcPoolStreams, PrefersReadyMemoryToWaiting) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 8 * KiB));
  void* p = pool.allocate(4 * KiB, s1);
  pool.deallocate(p, 4 * KiB, s1);
  void* q = pool.allocate(4 * KiB, s2);  // the other, never used half is ready
  EXPECT_NE(q, p);
  EXPECT_TRUE(recorder.calls().empty());
  pool.deallocate(q, 4 * KiB, s2);
}

TEST(BfcPoolStreams, SynchronisesBeforeGrowing) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 4 * KiB, 64 * KiB));
  void* p = pool.allocate(4 * KiB, s1);
  pool.deallocate(p, 4 * KiB, s1);
  EXPECT_EQ(pool.allocate(4 * KiB, s2), p);
  EXPECT_EQ(recorder.calls(), std::vector<loom::stream>{s1});
  EXPECT_EQ(upstream.regions_held(), 1U);
  pool.deallocate(p, 4 * KiB, s2);
}

TEST(BfcPoolStreams, ChunksInDifferentStreamStatesCoalesceOnlyOnceSynchronised) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 3 * KiB));
  void* a = pool.allocate(KiB);
  void* b = pool.allocate(KiB);
  void* c = pool.allocate(KiB);
  pool.deallocate(a, KiB, s1);
  pool.deallocate(b, KiB, s2);
  pool.check_invariants();
  auto chunks = pool.regions().at(0).chunks;
  ASSERT_EQ(chunks.size(), 3U);
  EXPECT_TRUE(chunks[0].needs_sync);
  EXPECT_EQ(chunks[0].freed_on, s1);
  EXPECT_TRUE(chunks[1].needs_sync);
  EXPECT_EQ(chunks[1].freed_on, s2);
  EXPECT_TRUE(chunks[2].in_use);
  std::ostringstream dump;
  pool.dump(dump);
  EXPECT_NE(dump.str().find("pending:0x1"), std::string::npos) << dump.str();
  EXPECT_NE(dump.str().find("pending:0x2"), std::string::npos) << dump.str();

  pool.synchronize_streams();
  auto calls = recorder.calls();
  std::sort(calls.begin(), calls.end(),
            [](loom::stream x, loom::stream y) { return x.value() < y.value(); });
  EXPECT_EQ(calls, (std::vector<loom::stream>{s1, s2}));
  chunks = pool.regions().at(0).chunks;
  ASSERT_EQ(chunks.size(), 2U);
  EXPECT_FALSE(chunks[0].in_use);
  EXPECT_FALSE(chunks[0].needs_sync);
  EXPECT_EQ(chunks[0].size, 2 * KiB);

  // A pending chunk next to a ready one stays apart from it.
  pool.deallocate(c, KiB, s1);
  chunks = pool.regions().at(0).chunks;
  ASSERT_EQ(chunks.size(), 2U);
  EXPECT_TRUE(chunks[1].needs_sync);
  pool.check_invariants();
  pool.synchronize_streams();
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPoolStreams, SynchronisesEveryStreamOfARunThatWouldFit) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 2 * KiB));
  void* a = pool.allocate(KiB);
  void* b = pool.allocate(KiB);
  pool.deallocate(a, KiB, s1);
  pool.deallocate(b, KiB, s2);
  // Neither half fits 2 KiB, but the two together do once both streams are done.
  EXPECT_EQ(pool.allocate(2 * KiB, s3), a);
  EXPECT_EQ(recorder.calls().size(), 2U);
  pool.deallocate(a, 2 * KiB, s3);
}

TEST(BfcPoolStreams, RunsOutOfMemoryWithoutWaitingWhenWaitingCannotHelp) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 4 * KiB));
  void* a = pool.allocate(KiB);
  void* wall = pool.allocate(KiB);
  pool.deallocate(a, KiB, s1);
  EXPECT_THROW((void)pool.allocate(3 * KiB, s2), loom::out_of_memory);
  EXPECT_TRUE(recorder.calls().empty());
  pool.deallocate(wall, KiB);
}

TEST(BfcPoolStreams, ChunksFreedWhileWaitingStayPending) {
  recording_upstream upstream;
  bfc_pool* pool_ptr = nullptr;
  void* late = nullptr;
  bfc_pool_options o;
  o.name = "late frees";
  o.initial_size = 16 * KiB;
  o.growth_step = 0;
  // The wait runs without the pool's lock: another free on the stream may come meanwhile.
  o.synchronize = [&](loom::stream s) {
    if (late != nullptr) {
      pool_ptr->deallocate(late, KiB, s);
      late = nullptr;
    }
  };
  bfc_pool pool(upstream, o);
  pool_ptr = &pool;
  void* early = pool.allocate(KiB);
  void* wall = pool.allocate(KiB);
  late = pool.allocate(KiB);
  void* late_block = late;
  pool.deallocate(early, KiB, s1);
  pool.synchronize_streams();
  const auto regions = pool.regions();
  const auto& chunks = regions.at(0).chunks;
  ASSERT_GE(chunks.size(), 3U);
  EXPECT_FALSE(chunks[0].needs_sync) << "freed before the wait: ready";
  EXPECT_TRUE(chunks[1].in_use);
  EXPECT_EQ(static_cast<const char*>(regions[0].base) + chunks[2].offset, late_block);
  EXPECT_TRUE(chunks[2].needs_sync) << "freed during the wait: still pending";
  pool.check_invariants();
  pool.deallocate(wall, KiB);
  pool.synchronize_streams();
  EXPECT_EQ(pool.regions().at(0).chunks.size(), 1U);
}

TEST(BfcPoolStreams, TrimSynchronisesTheStreamsOfTheRegionsItReleases) {
  recording_upstream upstream;
  sync_recorder recorder;
  bfc_pool pool(upstream, with_streams(recorder, 0, 64 * KiB));
  void* kept = pool.allocate(60 * KiB, s1);
  void* released = pool.allocate(60 * KiB, s2);
  pool.deallocate(released, 60 * KiB, s2);
  EXPECT_EQ(upstream.regions_held(), 2U);
  EXPECT_EQ(pool.trim(), 64 * KiB);
  EXPECT_EQ(recorder.calls(), std::vector<loom::stream>{s2});
  EXPECT_EQ(upstream.regions_held(), 1U);
  pool.deallocate(kept, 60 * KiB, s1);
  pool.check_invariants();
}

TEST(BfcPoolStreams, WithoutASynchronizerFreedChunksAreReadyAtOnce) {
  recording_upstream upstream;
  bfc_pool_options o;
  o.initial_size = 2 * KiB;
  o.growth_step = 0;
  bfc_pool pool(upstream, o);
  void* a = pool.allocate(KiB, s1);
  void* b = pool.allocate(KiB, s2);
  pool.deallocate(a, KiB, s1);
  pool.deallocate(b, KiB, s2);
  const auto regions = pool.regions();
  ASSERT_EQ(regions.at(0).chunks.size(), 1U);
  EXPECT_FALSE(regions[0].chunks[0].needs_sync);
  EXPECT_EQ(pool.allocate(2 * KiB, s3), a);
  pool.deallocate(a, 2 * KiB, s3);
}

}  // namespace
