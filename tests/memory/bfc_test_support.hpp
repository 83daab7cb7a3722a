// Helpers shared by the bfc_pool tests: an upstream that records what the pool holds, a
// shadow model of the pool's blocks and statistics, misuse capture, and fake streams.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/misuse.hpp"

namespace bfc_test {

/// A stream handle for tests: distinct for each n, never dereferenced.
inline loom::stream fake_stream(std::uintptr_t n) {
  return loom::stream{reinterpret_cast<void*>(n)};
}

/// Host memory that records every region it hands out, checks that each comes back with
/// its size and alignment, and refuses requests past `limit` bytes held. Thread-safe.
class recording_upstream final : public loom::memory::memory_resource {
 public:
  explicit recording_upstream(std::size_t limit = std::numeric_limits<std::size_t>::max())
      : limit_(limit) {}
  ~recording_upstream() override {
    EXPECT_TRUE(held_.empty()) << held_.size() << " regions were never given back";
  }

  [[nodiscard]] std::size_t bytes_held() const {
    const std::lock_guard lock(mutex_);
    return bytes_held_;
  }
  [[nodiscard]] std::size_t peak_bytes_held() const {
    const std::lock_guard lock(mutex_);
    return peak_bytes_held_;
  }
  [[nodiscard]] std::size_t regions_held() const {
    const std::lock_guard lock(mutex_);
    return held_.size();
  }
  [[nodiscard]] std::size_t refusals() const {
    const std::lock_guard lock(mutex_);
    return refusals_;
  }
  /// The sizes of the regions held, in address order.
  [[nodiscard]] std::vector<std::size_t> region_sizes() const {
    const std::lock_guard lock(mutex_);
    std::vector<std::size_t> sizes;
    for (const auto& [p, r] : held_) sizes.push_back(r.bytes);
    return sizes;
  }

 private:
  struct region {
    std::size_t bytes;
    std::size_t alignment;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment, loom::stream /*s*/) override {
    const std::lock_guard lock(mutex_);
    if (bytes > limit_ - bytes_held_) {
      ++refusals_;
      throw loom::out_of_memory("recording_upstream: over its limit", bytes, "recording_upstream");
    }
    void* p = loom::memory::host_resource::instance().allocate(bytes, alignment);
    held_.emplace(reinterpret_cast<std::uintptr_t>(p), region{bytes, alignment});
    bytes_held_ += bytes;
    peak_bytes_held_ = std::max(peak_bytes_held_, bytes_held_);
    return p;
  }

  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     loom::stream /*s*/) noexcept override {
    const std::lock_guard lock(mutex_);
    const auto it = held_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == held_.end()) {
      ADD_FAILURE() << "recording_upstream: " << p << " was not handed out";
      return;
    }
    EXPECT_EQ(it->second.bytes, bytes) << "region given back with another size";
    EXPECT_EQ(it->second.alignment, alignment) << "region given back with another alignment";
    loom::memory::host_resource::instance().deallocate(p, it->second.bytes, it->second.alignment);
    bytes_held_ -= it->second.bytes;
    held_.erase(it);
  }

  mutable std::mutex mutex_;
  std::size_t limit_;
  std::map<std::uintptr_t, region> held_;
  std::size_t bytes_held_ = 0;
  std::size_t peak_bytes_held_ = 0;
  std::size_t refusals_ = 0;
};

/// A block handed out by the pool, as the tests remember it.
struct block {
  unsigned char* p;
  std::size_t bytes;
  std::size_t alignment;
  loom::stream on;
  unsigned char fill;
};

/// Fills a block with its pattern.
inline void fill(const block& b) {
  std::memset(b.p, b.fill, b.bytes);
}

/// True when every byte of the block still holds its pattern (b.p[i] == b.p[i + 1] for
/// all i, and the first is the pattern: one memcmp, quick under the sanitizers too).
inline bool intact(const block& b) {
  return b.bytes == 0 || (b.p[0] == b.fill && std::memcmp(b.p, b.p + 1, b.bytes - 1) == 0);
}

/// The live blocks of one pool and the statistics the pool should report, kept
/// independently of the pool. Single-threaded.
class shadow {
 public:
  /// Records a block the pool handed out: checks that it is aligned and overlaps no live
  /// block, fills it with a pattern. Returns its index among the live blocks.
  std::size_t allocated(void* p, std::size_t bytes, std::size_t alignment, loom::stream on) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(addr % alignment, 0U) << "block " << p << " not aligned to " << alignment;
    const std::uintptr_t end = addr + std::max<std::size_t>(bytes, 1);
    const auto next = extents_.lower_bound(addr);
    EXPECT_TRUE(next == extents_.end() || next->first >= end)
        << "block " << p << " of " << bytes << " bytes overlaps a live block";
    EXPECT_TRUE(next == extents_.begin() || std::prev(next)->second <= addr)
        << "block " << p << " of " << bytes << " bytes overlaps a live block";
    extents_.emplace(addr, end);
    const block b{static_cast<unsigned char*>(p), bytes, alignment, on,
                  static_cast<unsigned char>(++fills_ % 251 + 1)};
    fill(b);
    blocks_.push_back(b);
    bytes_in_use_ += bytes;
    peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
    total_bytes_allocated_ += bytes;
    ++num_allocs_;
    return blocks_.size() - 1;
  }

  /// Records an allocate that threw out_of_memory.
  void failed() { ++num_failed_allocs_; }

  /// Forgets live block `i` after checking that nothing overwrote it; returns it, for the
  /// test to deallocate.
  block take(std::size_t i) {
    const block b = blocks_.at(i);
    EXPECT_TRUE(intact(b)) << "block " << static_cast<void*>(b.p) << " of " << b.bytes
                           << " bytes was overwritten";
    blocks_[i] = blocks_.back();
    blocks_.pop_back();
    extents_.erase(reinterpret_cast<std::uintptr_t>(b.p));
    bytes_in_use_ -= b.bytes;
    ++num_deallocs_;
    return b;
  }

  [[nodiscard]] std::size_t live() const { return blocks_.size(); }
  [[nodiscard]] const block& at(std::size_t i) const { return blocks_.at(i); }

  /// Checks the pool against the model: its statistics against the counts kept here and
  /// against its own chunk map, and every live block against the chunk holding it.
  void expect_matches(const loom::memory::bfc_pool& pool) const {
    const loom::memory_stats s = pool.get_stats();
    EXPECT_EQ(s.bytes_in_use, bytes_in_use_);
    EXPECT_EQ(s.peak_bytes_in_use, peak_bytes_in_use_);
    EXPECT_EQ(s.total_bytes_allocated, total_bytes_allocated_);
    EXPECT_EQ(s.allocations_in_use, blocks_.size());
    EXPECT_EQ(s.num_allocs, num_allocs_);
    EXPECT_EQ(s.num_deallocs, num_deallocs_);
    EXPECT_EQ(s.num_failed_allocs, num_failed_allocs_);

    std::size_t reserved = 0;
    std::size_t free_bytes = 0;
    std::size_t largest = 0;
    std::size_t in_use_chunk_bytes = 0;
    std::map<std::uintptr_t, const loom::memory::chunk_info*> in_use;
    const std::vector<loom::memory::region_info> regions = pool.regions();
    for (const auto& r : regions) {
      reserved += r.size;
      for (const auto& c : r.chunks) {
        if (c.in_use) {
          in_use_chunk_bytes += c.size;
          in_use.emplace(reinterpret_cast<std::uintptr_t>(r.base) + c.offset, &c);
        } else {
          free_bytes += c.size;
          largest = std::max(largest, c.size);
        }
      }
    }
    EXPECT_EQ(s.bytes_reserved, reserved);
    EXPECT_GE(s.peak_bytes_reserved, reserved);
    EXPECT_EQ(s.num_regions, regions.size());
    EXPECT_EQ(s.free_bytes, free_bytes);
    EXPECT_EQ(s.largest_free_block, largest);
    EXPECT_EQ(s.unusable_bytes, in_use_chunk_bytes - bytes_in_use_);
    ASSERT_EQ(in_use.size(), blocks_.size()) << "chunks in use do not match live blocks";
    for (const block& b : blocks_) {
      const auto it = in_use.find(reinterpret_cast<std::uintptr_t>(b.p));
      ASSERT_NE(it, in_use.end()) << "live block " << static_cast<void*>(b.p)
                                  << " starts no chunk in use";
      EXPECT_EQ(it->second->requested, b.bytes);
      EXPECT_GE(it->second->size, std::max<std::size_t>(b.bytes, 1));
    }
  }

 private:
  std::vector<block> blocks_;
  std::map<std::uintptr_t, std::uintptr_t> extents_;  // start -> end of each live block
  unsigned fills_ = 0;
  std::size_t bytes_in_use_ = 0;
  std::size_t peak_bytes_in_use_ = 0;
  std::uint64_t total_bytes_allocated_ = 0;
  std::uint64_t num_allocs_ = 0;
  std::uint64_t num_deallocs_ = 0;
  std::uint64_t num_failed_allocs_ = 0;
};

/// Captures misuse reports while alive (one at a time per process).
class misuse_capture {
 public:
  misuse_capture() {
    reports().clear();
    previous_ = loom::memory::set_misuse_handler(&record);
  }
  ~misuse_capture() { loom::memory::set_misuse_handler(previous_); }
  misuse_capture(const misuse_capture&) = delete;
  misuse_capture& operator=(const misuse_capture&) = delete;

  /// The reports so far, oldest first.
  [[nodiscard]] std::vector<loom::memory::misuse_report> taken() const {
    const std::lock_guard lock(mutex());
    return reports();
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<loom::memory::misuse_report>& reports() {
    static std::vector<loom::memory::misuse_report> r;
    return r;
  }
  static void record(const loom::memory::misuse_report& r) noexcept {
    const std::lock_guard lock(mutex());
    reports().push_back(r);
  }

  loom::memory::misuse_handler previous_;
};

/// Records the streams a pool asks to synchronise. Thread-safe.
class sync_recorder {
 public:
  [[nodiscard]] loom::memory::stream_synchronizer callback() {
    return [this](loom::stream s) {
      const std::lock_guard lock(mutex_);
      calls_.push_back(s);
    };
  }
  [[nodiscard]] std::vector<loom::stream> calls() const {
    const std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<loom::stream> calls_;
};

/// True when two snapshots of a pool show the same regions and chunks.
inline bool same_layout(const std::vector<loom::memory::region_info>& a,
                        const std::vector<loom::memory::region_info>& b) {
  const auto same_chunk = [](const loom::memory::chunk_info& x, const loom::memory::chunk_info& y) {
    return x.offset == y.offset && x.size == y.size && x.requested == y.requested &&
           x.in_use == y.in_use && x.freed_on == y.freed_on && x.needs_sync == y.needs_sync;
  };
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [&](const auto& x, const auto& y) {
    return x.base == y.base && x.size == y.size &&
           std::equal(x.chunks.begin(), x.chunks.end(), y.chunks.begin(), y.chunks.end(),
                      same_chunk);
  });
}

}  // namespace bfc_test
