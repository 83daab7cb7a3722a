// buffer: a reference-counted block of device memory.
//
// A buffer owns `bytes` bytes at `data()` on one device and gives them back through the
// release function it was made with (a memory resource's deallocate, a DLPack deleter, a
// NumPy array's reference) when the last reference goes. Tensors are views of buffers.
// The count is intrusive and atomic: buffer_ptr copies are thread-safe, as shared_ptr's are.
// `writable_in_place()` (unique and not read-only) is what lets the executor write an output
// into an input's buffer in place (Note [buffer forwarding] in runtime/executor.cpp), and
// variables update in place. A read-only buffer (memory a DLPack producer lent with its
// READ_ONLY flag) is never written by loom.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "loom/core/device_id.hpp"
#include "loom/core/stream.hpp"

namespace loom {

class buffer_ptr;

class buffer {
 public:
  /// Gives the memory back. Must not throw.
  using release_fn = void (*)(void* context, void* data, std::size_t bytes,
                              std::size_t alignment, stream s) noexcept;

  /// A buffer over `data`, owned from now on: `release(context, data, bytes, alignment, s)`
  /// runs once, when the last reference goes. A null `release` borrows the memory.
  /// `read_only` buffers are never written in place by loom.
  static buffer_ptr adopt(void* data, std::size_t bytes, std::size_t alignment, device_id device,
                          stream s, release_fn on_release, void* context, bool read_only = false);

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] device_id device() const noexcept { return device_; }
  /// The stream the memory is ordered on (the default stream on CPU).
  [[nodiscard]] stream stream_of() const noexcept { return stream_; }
  /// True when exactly one reference exists.
  [[nodiscard]] bool unique() const noexcept { return refs_.load(std::memory_order_acquire) == 1; }
  /// True for memory loom must not write (a read-only import).
  [[nodiscard]] bool read_only() const noexcept { return read_only_; }
  /// True when whoever holds the only reference may overwrite the data: unique() and not
  /// read_only().
  [[nodiscard]] bool writable_in_place() const noexcept { return !read_only_ && unique(); }

  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

 private:
  friend class buffer_ptr;
  buffer(void* data, std::size_t bytes, std::size_t alignment, device_id device, stream s,
         release_fn release_fn_, void* context, bool read_only) noexcept
      : data_(data), bytes_(bytes), alignment_(alignment), device_(device), stream_(s),
        release_(release_fn_), context_(context), read_only_(read_only) {}
  ~buffer() = default;
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void drop_ref() noexcept;

  void* data_;
  std::size_t bytes_;
  std::size_t alignment_;
  device_id device_;
  stream stream_;
  release_fn release_;
  void* context_;
  bool read_only_;
  std::atomic<std::int32_t> refs_{1};
};

/// An owning reference to a buffer (intrusive; null when default-constructed).
class buffer_ptr {
 public:
  buffer_ptr() noexcept = default;
  buffer_ptr(const buffer_ptr& o) noexcept : p_(o.p_) {
    if (p_) p_->retain();
  }
  buffer_ptr(buffer_ptr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  buffer_ptr& operator=(const buffer_ptr& o) noexcept {
    buffer_ptr(o).swap(*this);
    return *this;
  }
  buffer_ptr& operator=(buffer_ptr&& o) noexcept {
    buffer_ptr(std::move(o)).swap(*this);
    return *this;
  }
  ~buffer_ptr() {
    if (p_) p_->drop_ref();
  }
  void swap(buffer_ptr& o) noexcept { std::swap(p_, o.p_); }
  void reset() noexcept { buffer_ptr().swap(*this); }

  [[nodiscard]] buffer* get() const noexcept { return p_; }
  buffer* operator->() const noexcept { return p_; }
  buffer& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  friend bool operator==(const buffer_ptr& a, const buffer_ptr& b) noexcept { return a.p_ == b.p_; }

 private:
  friend class buffer;
  explicit buffer_ptr(buffer* p) noexcept : p_(p) {}
  buffer* p_ = nullptr;
};

}  // namespace loom
