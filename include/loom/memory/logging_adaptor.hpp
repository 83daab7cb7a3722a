// logging_adaptor: writes every call that passes through it to a CSV event log, which the
// replay tool reads back to re-run a program's allocations against other pools.
//
// Format, version 1 (the replay parser depends on it; change it only with a new version):
//
//   # loom allocation log v1
//   seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome
//   0,0,1532,allocate,0x7f3a2c000040,4096,64,0x0,optimizer/adam,ok
//   1,1,2210,allocate,0x0,68719476736,64,0x0,"loader,batch",out_of_memory
//   2,0,3071,deallocate,0x7f3a2c000040,4096,64,0x0,optimizer/adam,ok
//
// - seq: the 0-based event number; events appear in seq order.
// - thread: a small id per thread, 0, 1, ... in order of first appearance in this log.
// - time_ns: nanoseconds since the adaptor was created (steady clock); never decreases
//   from one event to the next.
// - action: allocate or deallocate. pointer: lower-case hex with 0x prefix (0x0 for a
//   failed allocate). bytes, alignment: decimal. stream: the stream's handle in hex (0x0
//   is the default stream).
// - tag: current_tag() of the calling thread, quoted per RFC 4180 when it holds a comma,
//   quote, CR or LF; may be empty.
// - outcome: ok; out_of_memory (the upstream threw std::bad_alloc) or invalid_argument
//   (it threw loom::invalid_argument), after which the exception is rethrown. Other
//   exceptions pass through unlogged.
//
// Ordering: an allocate is logged after the upstream returns, a deallocate before the
// block goes back to the upstream, so a block handed out again by the upstream always
// appears freed before it appears allocated again.
//
// Cost: each call formats its line into a small buffer of its own, then takes a mutex only
// to number the event and append the line; the log goes to the stream in blocks of
// flush_threshold bytes, outside that mutex. A deallocate whose line cannot be formatted
// for lack of memory is forwarded and left out of the log (deallocate cannot throw).
//
// Thread-safe. An adaptor is equal (is_equal) only to itself; stats() reports the
// upstream's figures.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

class logging_adaptor final : public memory_resource {
 public:
  /// Bytes of log gathered before they are written to the stream.
  static constexpr std::size_t flush_threshold = std::size_t{64} << 10;

  /// Logs calls to `upstream` into `out`; both must outlive the adaptor.
  explicit logging_adaptor(memory_resource& upstream, std::ostream& out);
  /// Logs calls to `upstream` (which must outlive the adaptor) into a file it creates or
  /// truncates at `path`. Throws loom::error naming the path when it cannot be opened.
  explicit logging_adaptor(memory_resource& upstream, const std::filesystem::path& path);
  /// Flushes the log.
  ~logging_adaptor() override;

  logging_adaptor(const logging_adaptor&) = delete;
  logging_adaptor& operator=(const logging_adaptor&) = delete;

  /// Writes every event logged so far to the stream and flushes it. Throws loom::error
  /// when the stream has failed. Thread-safe.
  void flush();

  /// The resource this adaptor forwards to.
  [[nodiscard]] memory_resource& upstream() const noexcept { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return upstream_.stats(); }

  void log(std::string_view action, const void* p, std::size_t bytes, std::size_t alignment,
           stream s, std::string_view outcome);
  [[nodiscard]] std::uint32_t thread_index();  // with buffer_mutex_ held
  // Hands the gathered log to the stream; takes buffer_mutex_'s lock and releases it.
  void write_out(std::unique_lock<std::mutex> buffer_lock);

  memory_resource& upstream_;
  std::unique_ptr<std::ofstream> file_;  // when the adaptor opened the log itself
  std::ostream& out_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const std::uint64_t id_;  // keys the thread_local thread-index cache

  std::mutex buffer_mutex_;  // guards the three below
  std::string buffer_;       // lines not yet handed to the stream
  std::uint64_t next_seq_ = 0;
  std::unordered_map<std::thread::id, std::uint32_t> thread_indices_;

  // Taken while still holding buffer_mutex_, so blocks reach the stream in seq order.
  std::mutex io_mutex_;
  std::string spare_;  // the block being written; reused as the next buffer
};

}  // namespace loom::memory
