#include "loom/core/memory_stats.hpp"

#include <gtest/gtest.h>

#include "loom/core/device_id.hpp"
#include "loom/core/error.hpp"

namespace {

TEST(MemoryStats, FragmentationIsZeroWhenNothingIsFree) {
  loom::memory_stats s;
  EXPECT_EQ(s.fragmentation(), 0.0);
}

TEST(MemoryStats, FragmentationMeasuresHowScatteredFreeMemoryIs) {
  loom::memory_stats s;
  s.free_bytes = 1000;
  s.largest_free_block = 1000;
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.0);
  s.largest_free_block = 250;
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.75);
}

TEST(MemoryStats, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(loom::format_bytes(0), "0 B");
  EXPECT_EQ(loom::format_bytes(1023), "1023 B");
  EXPECT_EQ(loom::format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(loom::format_bytes(3u << 20), "3.00 MiB");
  EXPECT_EQ(loom::format_bytes(std::uint64_t{5} << 40), "5.00 TiB");
}

TEST(MemoryStats, ToStringNamesEveryFigure) {
  loom::memory_stats s;
  s.bytes_in_use = 2048;
  s.bytes_reserved = 4096;
  s.free_bytes = 2048;
  s.largest_free_block = 1024;
  const std::string text = loom::to_string(s);
  EXPECT_NE(text.find("in use 2.00 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("reserved 4.00 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("fragmentation 50.0%"), std::string::npos) << text;
}

TEST(Errors, OutOfMemoryIsABadAllocCarryingTheRequestAndStats) {
  loom::memory_stats s;
  s.bytes_in_use = 7;
  try {
    throw loom::out_of_memory("no room", 42, "pool 'x'", s);
  } catch (const std::bad_alloc& e) {
    const auto* oom = dynamic_cast<const loom::out_of_memory*>(&e);
    ASSERT_NE(oom, nullptr);
    EXPECT_STREQ(e.what(), "no room");
    EXPECT_EQ(oom->requested_bytes(), 42u);
    EXPECT_EQ(oom->refused_by(), "pool 'x'");
    ASSERT_TRUE(oom->stats().has_value());
    EXPECT_EQ(oom->stats()->bytes_in_use, 7u);
  }
}

TEST(DeviceId, NamesMatchDLPackCodes) {
  EXPECT_EQ(static_cast<int>(loom::device_type::cpu), 1);
  EXPECT_EQ(static_cast<int>(loom::device_type::cuda), 2);
  EXPECT_EQ(loom::to_string(loom::device_id{loom::device_type::cuda, 1}), "cuda:1");
}

}  // namespace
