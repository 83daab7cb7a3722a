// libFuzzer target: the input drives a small growing bfc_pool (max_size 4 MiB, so that the
// out-of-memory paths run) through allocate, deallocate, trim and synchronize_streams.
// After every operation the pool's invariants must hold and its counters must match a
// shadow model; blocks must be aligned, disjoint, and keep their contents until freed.
// Everything is freed at the end, and a trim must then give every region back.
//
// Input: byte 0 chooses the configuration; then each operation is one byte, op % 8:
//   0-3 allocate, then 3 bytes: size exponent and mantissa (0 to ~8 MiB), alignment
//       exponent (1 to 64 KiB) and stream (4 streams, one the default)
//   4-5 deallocate, then 1 byte: which live block, and the stream it is freed on
//   6   trim
//   7   synchronize_streams
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"

namespace {

using loom::memory::bfc_pool;

constexpr std::size_t max_size = std::size_t{4} << 20;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "bfc_pool_fuzz: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

struct live_block {
  unsigned char* p;
  std::size_t bytes;
  std::size_t alignment;
  loom::stream on;
  unsigned char fill;
};

// Reads the input a byte at a time; 0 once it is used up.
class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool done() const { return at_ >= size_; }
  std::uint8_t next() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

loom::stream stream_of(unsigned n) {
  return loom::stream{reinterpret_cast<void*>(static_cast<std::uintptr_t>(n))};
}

// The pool and the model of what it should hold.
class session {
 public:
  explicit session(std::uint8_t config)
      : pool_(loom::memory::host_resource::instance(), options(config)) {}

  void allocate(reader& in) {
    const unsigned exponent = in.next() % 24;
    const std::size_t bytes =
        ((std::size_t{1} << exponent) - 1) + ((std::size_t{in.next()} << exponent) >> 8);
    const std::uint8_t more = in.next();
    const std::size_t alignment = std::size_t{1} << (more % 17);
    const loom::stream on = stream_of(more >> 6);
    try {
      auto* p = static_cast<unsigned char*>(pool_.allocate(bytes, alignment, on));
      const auto addr = reinterpret_cast<std::uintptr_t>(p);
      check(addr % alignment == 0, "a block is misaligned");
      const std::uintptr_t end = addr + (bytes == 0 ? 1 : bytes);
      const auto after = extents_.lower_bound(addr);
      check(after == extents_.end() || after->first >= end, "blocks overlap");
      check(after == extents_.begin() || std::prev(after)->second <= addr, "blocks overlap");
      extents_.emplace(addr, end);
      const live_block b{p, bytes, alignment, on, static_cast<unsigned char>(++fills_ % 251 + 1)};
      std::memset(b.p, b.fill, b.bytes);
      blocks_.push_back(b);
      bytes_in_use_ += bytes;
      ++allocs_;
    } catch (const loom::out_of_memory& e) {
      check(e.stats().has_value(), "out_of_memory without statistics");
      ++failed_;
    }
  }

  void deallocate(reader& in) {
    if (blocks_.empty()) return;
    const std::uint8_t pick = in.next();
    const std::size_t k = pick % blocks_.size();
    const live_block b = blocks_[k];
    check(b.bytes == 0 || (b.p[0] == b.fill && std::memcmp(b.p, b.p + 1, b.bytes - 1) == 0),
          "a block was overwritten");
    blocks_[k] = blocks_.back();
    blocks_.pop_back();
    extents_.erase(reinterpret_cast<std::uintptr_t>(b.p));
    bytes_in_use_ -= b.bytes;
    ++deallocs_;
    pool_.deallocate(b.p, b.bytes, b.alignment, pick >= 192 ? stream_of(pick % 4) : b.on);
  }

  void trim() { pool_.trim(); }
  void synchronize() { pool_.synchronize_streams(); }

  void verify() const {
    try {
      pool_.check_invariants();
    } catch (const loom::error& e) {
      fail(e.what());
    }
    const loom::memory_stats s = pool_.get_stats();
    check(s.bytes_in_use == bytes_in_use_, "bytes_in_use disagrees with the model");
    check(s.allocations_in_use == blocks_.size(), "allocations_in_use disagrees");
    check(s.num_allocs == allocs_, "num_allocs disagrees");
    check(s.num_deallocs == deallocs_, "num_deallocs disagrees");
    check(s.num_failed_allocs == failed_, "num_failed_allocs disagrees");
    check(s.peak_bytes_reserved <= max_size, "the pool passed max_size");
  }

  void free_everything() {
    while (!blocks_.empty()) {
      const live_block& b = blocks_.back();
      pool_.deallocate(b.p, b.bytes, b.alignment, b.on);
      blocks_.pop_back();
    }
    pool_.trim();
    const loom::memory_stats s = pool_.get_stats();
    check(s.bytes_reserved == 0 && s.num_regions == 0, "trim kept a free region");
  }

 private:
  static loom::memory::bfc_pool_options options(std::uint8_t config) {
    loom::memory::bfc_pool_options o;
    o.name = "fuzz";
    o.granularity = std::size_t{64} << (config & 3);
    o.initial_size = (config & 4) != 0 ? 256 << 10 : 0;
    o.growth_step = (config & 8) != 0 ? std::size_t{1} << 20 : 256 << 10;
    o.max_size = max_size;
    if ((config & 16) != 0) o.synchronize = [](loom::stream) {};
    return o;
  }

  bfc_pool pool_;
  std::vector<live_block> blocks_;
  std::map<std::uintptr_t, std::uintptr_t> extents_;
  unsigned fills_ = 0;
  std::size_t bytes_in_use_ = 0;
  std::uint64_t allocs_ = 0;
  std::uint64_t deallocs_ = 0;
  std::uint64_t failed_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in(data, size);
  session run(in.next());
  for (int ops = 0; !in.done() && ops < 4096; ++ops) {
    switch (in.next() % 8) {
      case 0:
      case 1:
      case 2:
      case 3:
        run.allocate(in);
        break;
      case 4:
      case 5:
        run.deallocate(in);
        break;
      case 6:
        run.trim();
        break;
      default:
        run.synchronize();
        break;
    }
    run.verify();
  }
  run.free_everything();
  return 0;
}
