// allocation_log: a parsed, validated allocation log, ready for replay (see replay.hpp).
//
// The log is the CSV that logging_adaptor writes:
//
//   # loom allocation log v1
//   seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome
//   0,0,1200,allocate,0x7f0000000000,4096,64,0x0,mlp/forward,ok
//   1,0,1900,deallocate,0x7f0000000000,4096,64,0x0,mlp/forward,ok
//
// Lines starting with '#' are comments and blank lines are ignored, anywhere; the first
// other line must be the header exactly. Fields: seq, thread, time_ns, bytes and alignment
// are unsigned decimals; pointer and stream are hexadecimal with a 0x prefix (stream 0x0
// is the default stream; pointer 0x0 marks a failed allocate); action is allocate or
// deallocate; outcome is ok, out_of_memory or invalid_argument (allocate only); tag is a
// CSV field, quoted as RFC 4180 says when it holds a comma, a quote or a line break.
// Lines may end in "\r\n".
//
// Parsing resolves every pointer to a dense *slot*: an allocate that succeeded fills a
// slot, and the deallocate of that block names the same slot, so a replay keeps its live
// blocks in a plain array and never hashes a pointer. A slot is reused once its block is
// given back, so there are as many slots as blocks were ever live at once. Tags are
// interned. Events keep the order of the lines; seq is kept for reports, not checked.
//
// The parser checks the log for consistency, so that a replay never has to: a deallocate
// must name a block live at that point, with the size and alignment it was allocated with;
// an allocate that succeeded must not return a block that is still live. Anything else
// malformed (a wrong number of fields, a bad number, an unknown action or outcome, an
// alignment that is not a power of two, a missing header, an unterminated quote) throws
// loom::parse_error carrying the 1-based line number, which the message also names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/stream.hpp"

namespace loom::memory {

/// What a logged call did.
enum class log_action : std::uint8_t { allocate, deallocate };

/// How a logged call ended. A deallocate always ends ok.
enum class log_outcome : std::uint8_t { ok, out_of_memory, invalid_argument };

/// "allocate", "deallocate".
const char* to_string(log_action a) noexcept;
/// "ok", "out_of_memory", "invalid_argument".
const char* to_string(log_outcome o) noexcept;

/// One event as a replay needs it (32 bytes; the events lie in one array).
struct log_event {
  /// The slot of an allocate whose logged outcome was not ok: such a block has no
  /// deallocate in the log.
  static constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

  std::size_t bytes;
  /// As logged: a power of two, except for an allocate that failed with invalid_argument.
  std::size_t alignment;
  stream on_stream;
  /// The block's slot (see the note at the top), or no_slot.
  std::uint32_t slot;
  log_action action;
  log_outcome outcome;
};

/// Where an event came from: what reports name, kept apart from the events so that the
/// replay loop does not stream through it.
struct log_origin {
  std::uint64_t seq;
  std::uint64_t time_ns;
  /// 1-based line on which the event's record starts.
  std::size_t line;
  std::uint32_t thread;
  /// Index into allocation_log::tags().
  std::uint32_t tag;
};

/// A parsed log: immutable once built. Thread safety: like a const std::vector.
class allocation_log {
 public:
  /// The events in log order.
  [[nodiscard]] const std::vector<log_event>& events() const noexcept { return events_; }
  /// origins()[i] describes events()[i].
  [[nodiscard]] const std::vector<log_origin>& origins() const noexcept { return origins_; }
  /// The distinct tags, in order of first appearance ("" when a record had none).
  [[nodiscard]] const std::vector<std::string>& tags() const noexcept { return tags_; }
  /// The tag of event i. Precondition: i < size().
  [[nodiscard]] const std::string& tag_of(std::size_t i) const { return tags_[origins_[i].tag]; }
  /// The number of slots the events use: the most blocks live at once in the log.
  [[nodiscard]] std::uint32_t slot_count() const noexcept { return slot_count_; }
  [[nodiscard]] std::size_t size() const noexcept { return events_.size(); }

 private:
  friend class allocation_log_parser;

  std::vector<log_event> events_;
  std::vector<log_origin> origins_;
  std::vector<std::string> tags_;
  std::uint32_t slot_count_ = 0;
};

/// Reads and parses a whole log from `in`. Error messages read "line N: what is wrong".
/// Throws loom::parse_error as described at the top, and loom::error when `in` fails.
[[nodiscard]] allocation_log parse_allocation_log(std::istream& in);

/// Reads and parses the log in the file at `path`. Error messages read
/// "PATH:N: what is wrong". Throws loom::parse_error as described at the top, and
/// loom::not_found when the file cannot be opened.
[[nodiscard]] allocation_log parse_allocation_log(const std::filesystem::path& path);

}  // namespace loom::memory
