#include "loom/memory/host_resource.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "loom/core/error.hpp"

namespace loom::memory {

host_resource& host_resource::instance() noexcept {
  // Never destroyed, so that pools that outlive static destruction (the default cpu:0 pool
  // of device_resources.cpp) may still give memory back to it.
  static host_resource* const r = new host_resource;
  return *r;
}

void* host_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream /*s*/) {
  // aligned_alloc wants a size that is a multiple of the alignment, and at least
  // sizeof(void*) alignment; a zero-byte request still gets a distinct block.
  alignment = std::max(alignment, sizeof(void*));
  const std::size_t size = align_up(std::max<std::size_t>(bytes, 1), alignment);
  void* p = std::aligned_alloc(alignment, size);
  if (p == nullptr) {
    throw out_of_memory(fmt::format("host_resource: aligned_alloc of {} bytes (alignment {}) "
                                    "failed",
                                    bytes, alignment),
                        bytes, "host_resource");
  }
  return p;
}

void host_resource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/,
                                  stream /*s*/) noexcept {
  std::free(p);  // NOLINT(cppcoreguidelines-no-malloc): this is the C library's upstream
}

bool host_resource::do_is_equal(const memory_resource& other) const noexcept {
  return dynamic_cast<const host_resource*>(&other) != nullptr;
}

}  // namespace loom::memory
