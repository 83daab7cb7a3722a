// Reporting misuse that deallocate() detects.
//
// deallocate is noexcept, so a resource that catches a caller's mistake (a pointer it did
// not hand out, the wrong size or alignment, a second free of the same block) cannot
// throw. It builds a misuse_report, hands it to the process-wide misuse handler, and
// leaves its own state unchanged: the bad call frees nothing, so nothing is corrupted.
// The default handler prints the report to stderr; tests install their own to assert on
// reports, and a program may install one that aborts.
#pragma once

#include <cstddef>
#include <string>

#include "loom/core/stream.hpp"

namespace loom::memory {

enum class misuse_kind {
  unknown_pointer,  // not handed out by this resource, or not the start of a block
  double_free,      // handed out once, already given back
  size_mismatch,    // given back with a size other than the one allocated
  alignment_mismatch,
  invalid_alignment,
  leak,             // the resource was destroyed with blocks still in use (bytes: their sum)
};

/// "unknown_pointer", "double_free", ...
const char* to_string(misuse_kind k) noexcept;

struct misuse_report {
  misuse_kind kind;
  std::string resource;  // who detected it ("bfc_pool 'cpu:0'", "tracking_adaptor", ...)
  const void* pointer;
  std::size_t bytes;     // what the caller passed
  std::size_t expected;  // what the resource recorded (0 when unknown)
  stream on_stream;
  std::string message;   // a full sentence naming all of the above
};

/// The handler receives every report; it must not throw (it runs inside noexcept code).
using misuse_handler = void (*)(const misuse_report&) noexcept;

/// Installs `h` for the whole process (nullptr restores the default) and returns the
/// handler it replaces. Thread-safe.
misuse_handler set_misuse_handler(misuse_handler h) noexcept;

/// Builds the message when `r.message` is empty, and calls the installed handler.
void report_misuse(misuse_report r) noexcept;

/// The default handler: prints "loom: memory misuse: <message>" to stderr.
void print_misuse(const misuse_report& r) noexcept;

}  // namespace loom::memory
