#include "loom/memory/misuse.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>

namespace loom::memory {
namespace {
std::atomic<misuse_handler> g_handler{&print_misuse};
}  // namespace

const char* to_string(misuse_kind k) noexcept {
  switch (k) {
    case misuse_kind::unknown_pointer: return "unknown_pointer";
    case misuse_kind::double_free: return "double_free";
    case misuse_kind::size_mismatch: return "size_mismatch";
    case misuse_kind::alignment_mismatch: return "alignment_mismatch";
    case misuse_kind::invalid_alignment: return "invalid_alignment";
    case misuse_kind::leak: return "leak";
  }
  return "unknown";
}

misuse_handler set_misuse_handler(misuse_handler h) noexcept {
  return g_handler.exchange(h == nullptr ? &print_misuse : h);
}

void report_misuse(misuse_report r) noexcept {
  try {
    if (r.message.empty()) {
      r.message = fmt::format("{}: {} in deallocate({}, {} bytes, stream {:#x})", r.resource,
                              to_string(r.kind), r.pointer, r.bytes, r.on_stream.value());
      if (r.expected != 0) r.message += fmt::format("; expected {} bytes", r.expected);
    }
  } catch (...) {
    // Formatting failed (out of memory): report with whatever message we have.
  }
  g_handler.load()(r);
}

void print_misuse(const misuse_report& r) noexcept {
  std::fprintf(stderr, "loom: memory misuse: %s\n", r.message.c_str());
}

}  // namespace loom::memory
