// memory_resource: loom's external allocator interface.
//
// Every byte loom hands to a tensor comes through this interface, and any library in the
// process may allocate through it too (see c_api.h). It has the shape of std::pmr's and
// RMM's: public non-virtual calls that check arguments, over private virtual do_* that a
// resource implements.
//
// Contract (docs/memory.md has the long form):
// - allocate(bytes, alignment, stream) returns a block of at least `bytes` bytes whose
//   address is a multiple of `alignment`, ready for use on `stream`. It throws
//   loom::invalid_argument when `alignment` is not a power of two, and loom::out_of_memory
//   (a std::bad_alloc) when the request cannot be met, including sizes that no address
//   space holds (above max_allocation_size). allocate(0) returns a distinct, valid,
//   aligned pointer that must be given back like any other (with bytes == 0); it is never
//   nullptr.
// - deallocate(p, bytes, alignment, stream) gives a block back. `bytes` and `alignment`
//   must be those passed to allocate; `stream` is the stream on which the caller's last use
//   of the block was ordered (Note [stream-ordered memory] in loom/core/stream.hpp).
//   deallocate(nullptr, ...) does nothing. deallocate never throws: misuse that a resource
//   detects (a pointer it did not hand out, a wrong size, a double free) is reported
//   through report_misuse() (loom/memory/misuse.hpp) and leaves the resource unchanged.
// - is_equal(other): true when memory from one may be given back to the other.
// - Thread safety: every resource in loom may be called from any number of threads at
//   once, unless its own header says otherwise.
#pragma once

#include <cstddef>
#include <optional>

#include "loom/core/memory_stats.hpp"
#include "loom/core/stream.hpp"

namespace loom::memory {

/// The alignment allocate() uses when none is given: a cache line, and enough for AVX-512.
inline constexpr std::size_t default_alignment = 64;

/// Requests above this many bytes fail with out_of_memory before reaching any resource.
/// (2^62: no machine maps that much, and sums of two requests cannot overflow.)
inline constexpr std::size_t max_allocation_size = std::size_t{1} << 62;

/// True when `alignment` is a power of two.
[[nodiscard]] constexpr bool is_valid_alignment(std::size_t alignment) noexcept {
  return alignment != 0 && (alignment & (alignment - 1)) == 0;
}

/// Rounds `n` up to a multiple of `alignment` (a power of two); n must not be near 2^64.
[[nodiscard]] constexpr std::size_t align_up(std::size_t n, std::size_t alignment) noexcept {
  return (n + alignment - 1) & ~(alignment - 1);
}

class memory_resource {
 public:
  memory_resource() = default;
  memory_resource(const memory_resource&) = default;
  memory_resource& operator=(const memory_resource&) = default;
  virtual ~memory_resource() = default;

  /// See the contract above. Throws invalid_argument (alignment) or out_of_memory.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_alignment,
                               stream s = stream{});
  /// allocate(bytes, default_alignment, s).
  [[nodiscard]] void* allocate(std::size_t bytes, stream s) {
    return allocate(bytes, default_alignment, s);
  }

  /// See the contract above. Never throws.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment,
                  stream s = stream{}) noexcept;
  /// deallocate(p, bytes, default_alignment, s).
  void deallocate(void* p, std::size_t bytes, stream s) noexcept {
    deallocate(p, bytes, default_alignment, s);
  }

  /// True when memory allocated from *this may be deallocated through `other`, and back.
  [[nodiscard]] bool is_equal(const memory_resource& other) const noexcept {
    return this == &other || do_is_equal(other);
  }

  /// The resource's figures now, when it keeps any (pools and the statistics adaptor do;
  /// adaptors that keep none report their upstream's). nullopt when nothing is known.
  [[nodiscard]] std::optional<memory_stats> stats() const { return do_stats(); }

 private:
  // Called with a valid alignment and bytes <= max_allocation_size.
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) = 0;
  // Called with p != nullptr and a valid alignment.
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                             stream s) noexcept = 0;
  virtual bool do_is_equal(const memory_resource& /*other*/) const noexcept { return false; }
  virtual std::optional<memory_stats> do_stats() const { return std::nullopt; }
};

}  // namespace loom::memory
