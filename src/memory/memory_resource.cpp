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
    report_misuse({misuse_kind::invalid_alignment, "memory_resource", p, bytes, 0, s,
                   fmt::format("deallocate({}, {} bytes): alignment {} is not a power of two; "
                               "the block was not freed",
                               p, bytes, alignment)});
    return;
  }
  do_deallocate(p, bytes, alignment, s);
}

}  // namespace loom::memory
