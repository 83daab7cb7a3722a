// Upstream resources that the adaptor tests stack their adaptor on. Header-only test
// support; each is host memory with one twist.
#pragma once

#include <atomic>
#include <cstddef>

#include "loom/core/error.hpp"
#include "loom/memory/host_resource.hpp"

namespace loom::memory::testing {

/// Host memory that counts its calls and the bytes it holds, remembers the most it ever
/// held, and can be told to refuse everything. Thread-safe.
class counting_upstream final : public memory_resource {
 public:
  std::atomic<int> allocations{0};
  std::atomic<int> deallocations{0};
  std::atomic<std::size_t> in_use{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<bool> refuse{false};

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override {
    if (refuse.load()) throw out_of_memory("counting_upstream: refused", bytes, "counting");
    void* p = host_resource::instance().allocate(bytes, alignment, s);
    ++allocations;
    const std::size_t now = in_use.fetch_add(bytes) + bytes;
    std::size_t old = peak.load();
    while (now > old && !peak.compare_exchange_weak(old, now)) {
    }
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override {
    ++deallocations;
    in_use.fetch_sub(bytes);
    host_resource::instance().deallocate(p, bytes, alignment, s);
  }
};

/// Host memory that refuses requests above max_bytes with out_of_memory and requests of
/// exactly rejected_bytes with invalid_argument: both failures an adaptor must pass on.
class picky_upstream final : public memory_resource {
 public:
  static constexpr std::size_t max_bytes = 1 << 20;
  static constexpr std::size_t rejected_bytes = 777;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override {
    if (bytes > max_bytes) throw out_of_memory("picky_upstream: too big", bytes, "picky");
    if (bytes == rejected_bytes) throw invalid_argument("picky_upstream: 777 bytes");
    return host_resource::instance().allocate(bytes, alignment, s);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override {
    host_resource::instance().deallocate(p, bytes, alignment, s);
  }
};

}  // namespace loom::memory::testing
