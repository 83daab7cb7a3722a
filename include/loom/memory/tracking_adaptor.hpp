// tracking_adaptor: remembers every outstanding allocation, to find leaks and misuse.
//
// Each allocation is recorded with its size, alignment, stream, the calling thread's tag
// (loom/memory/allocation_tag.hpp), thread, a sequence number and, when asked, the stack
// that made it. outstanding() lists what is live, bytes_by_tag() attributes the live bytes
// to tags, and leak_report() prints them grouped by tag. When the adaptor is destroyed
// with allocations outstanding it ignores them, reports them through report_misuse as a
// misuse_kind::leak (the default; the default handler prints to stderr), or prints the
// report to stderr and aborts, the mode that makes a test fail on a leak:
//
//   tracking_adaptor tracker{pool, {.on_leak = leak_action::abort}};
//
// deallocate checks each call against the records: a pointer the adaptor did not hand out
// (or already took back), or a size or alignment other than the one allocated, is reported
// through report_misuse and not forwarded to the upstream.
//
// Thread-safe: one mutex guards the records; a stack trace, when captured, is captured
// before taking it. An adaptor is equal (is_equal) only to itself; stats() reports the
// upstream's figures.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "loom/memory/memory_resource.hpp"
#include "loom/memory/misuse.hpp"

namespace loom::memory {

/// What a tracking_adaptor does when it is destroyed with allocations outstanding.
enum class leak_action {
  ignore,  // nothing
  report,  // report_misuse(): kind leak, bytes outstanding, the leak report as the message
  abort,   // print the leak report to stderr, then std::abort()
};

struct tracking_options {
  /// Name used in reports ("tracking_adaptor 'session 7'").
  std::string name = "tracking";
  /// Capture the stack of each allocation with backtrace(); symbolised only in reports.
  /// Costs a few microseconds per allocation.
  bool capture_stack_traces = false;
  /// The most frames kept per stack trace.
  std::size_t max_stack_depth = 32;
  /// What the destructor does about outstanding allocations.
  leak_action on_leak = leak_action::report;
};

/// One outstanding allocation.
struct allocation_record {
  const void* pointer = nullptr;
  std::size_t bytes = 0;
  std::size_t alignment = 0;
  stream on_stream;
  std::string tag;             // current_tag() when it was allocated
  std::thread::id thread;      // the thread that allocated it
  std::uint64_t sequence = 0;  // 0-based, in allocation order
  std::vector<void*> stack;    // return addresses, innermost first; empty unless captured
};

class tracking_adaptor final : public memory_resource {
 public:
  /// Tracks allocations from `upstream`, which must outlive the adaptor.
  explicit tracking_adaptor(memory_resource& upstream, tracking_options options = {});
  /// Acts on outstanding allocations per options().on_leak; they are not freed.
  ~tracking_adaptor() override;

  tracking_adaptor(const tracking_adaptor&) = delete;
  tracking_adaptor& operator=(const tracking_adaptor&) = delete;

  /// The outstanding allocations, in sequence order. Thread-safe.
  [[nodiscard]] std::vector<allocation_record> outstanding() const;
  /// Outstanding bytes per tag (untagged allocations under ""). Thread-safe.
  [[nodiscard]] std::map<std::string, std::size_t> bytes_by_tag() const;
  /// Outstanding allocations and bytes. Thread-safe.
  [[nodiscard]] std::size_t outstanding_count() const;
  [[nodiscard]] std::size_t outstanding_bytes() const;
  /// A readable report of the outstanding allocations grouped by tag, with totals per tag
  /// and overall, and symbolised stack traces when captured; one line when none.
  /// Thread-safe.
  [[nodiscard]] std::string leak_report() const;

  [[nodiscard]] const tracking_options& options() const noexcept { return options_; }
  /// The resource this adaptor forwards to.
  [[nodiscard]] memory_resource& upstream() const noexcept { return upstream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return upstream_.stats(); }

  // The calling thread's stack from the frame that returns to `caller` outwards.
  [[nodiscard]] std::vector<void*> capture_stack(const void* caller) const;
  [[nodiscard]] std::string format_report(const std::vector<allocation_record>& live) const;
  [[nodiscard]] bool freed_recently(const void* p) const noexcept;  // with mutex_ held
  void report_bad_deallocate(misuse_kind kind, const void* p, std::size_t bytes,
                             std::size_t alignment, std::size_t expected, stream s) const noexcept;

  memory_resource& upstream_;
  tracking_options options_;
  std::string label_;  // "tracking_adaptor 'name'"

  mutable std::mutex mutex_;
  std::unordered_map<const void*, allocation_record> records_;
  std::uint64_t next_sequence_ = 0;
  // The last pointers given back, to tell a double free from an unknown pointer.
  std::array<const void*, 256> recently_freed_{};
  std::size_t next_freed_slot_ = 0;
};

}  // namespace loom::memory
