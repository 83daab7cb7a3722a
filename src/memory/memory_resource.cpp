#include "loom/memory/memory_resource.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"
#include "loom/memory/misuse.hpp"

namespace loom::memory {

void* memory_resource::allocate(std::size_t bytes, std::size_t alignment, stream s) {
  if (!is_valid_alignment(alignment)) {
    throw invalid_argument(fmt::format(
        "allocate: alignment {} is not a power of two (request of {} bytes)", alignment, bytes));
  }
  if (bytes > max_allocation_size) {
    throw out_of_memory(
        fmt::format("allocate: request of {} bytes exceeds the largest possible allocation "
                    "({} bytes)",
                    bytes, max_allocation_size),
        bytes, "memory_resource");
  }
  return do_allocate(bytes, alignment, s);
}

void memory_resource::deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                 stream s) noexcept {
  if (p == nullptr) return;
  if (!is_valid_alignment(alignment)) {
    // deallocate is noexcept: with no memory for the message, report_misuse writes its own.
    misuse_report report{misuse_kind::invalid_alignment, {}, p, bytes, 0, s, {}};
    try {
      report.resource = "memory_resource";
      report.message = fmt::format(
          "deallocate({}, {} bytes): alignment {} is not a power of two; the block was not freed",
          p, bytes, alignment);
    } catch (...) {
      report.message.clear();
    }
    report_misuse(std::move(report));
    return;
  }
  do_deallocate(p, bytes, alignment, s);
}

}  // namespace loom::memory
