// stream: a handle naming an ordered queue of work on a device.
//
// On CPU there is one stream, the default stream (handle null). On CUDA the handle carries
// a cudaStream_t (the CUDA backend converts; core never includes CUDA headers). A stream
// is a small value type, like RMM's cuda_stream_view: copying it copies the handle, never
// the queue, and it owns nothing.
//
// Note [stream-ordered memory]: memory resources take the stream on which the caller will
// use (allocate) or has finished using (deallocate) a block. A block freed on stream S may
// be handed out again at once for use on S, since later work on S runs after earlier work;
// for use on another stream it may be handed out only after the resource has synchronised
// with S (see bfc_pool's stream_synchronizer). See docs/memory.md.
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

class stream {
 public:
  /// The default stream.
  constexpr stream() noexcept = default;
  /// A stream from a backend handle (a cudaStream_t on CUDA). nullptr is the default stream.
  constexpr explicit stream(void* handle) noexcept : handle_(handle) {}

  [[nodiscard]] static constexpr stream default_stream() noexcept { return stream{}; }
  [[nodiscard]] constexpr void* handle() const noexcept { return handle_; }
  [[nodiscard]] constexpr bool is_default() const noexcept { return handle_ == nullptr; }
  /// The handle as an integer, for logs and hashing.
  [[nodiscard]] std::uintptr_t value() const noexcept {
    return reinterpret_cast<std::uintptr_t>(handle_);
  }

  friend constexpr bool operator==(stream a, stream b) noexcept { return a.handle_ == b.handle_; }

 private:
  void* handle_ = nullptr;
};

}  // namespace loom

template <>
struct std::hash<loom::stream> {
  std::size_t operator()(loom::stream s) const noexcept {
    return std::hash<void*>{}(s.handle());
  }
};
