// The C ABI allocator (loom/memory/c_api.h) over the device registry.
#include "loom/memory/c_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/library_resources.hpp"

namespace {

using loom::memory::memory_resource;

// The calling thread's last error. The message lives in a fixed buffer, so recording an
// error allocates nothing and works when memory has run out.
struct last_error {
  int code = LOOM_OK;
  std::array<char, 512> message{};
};

thread_local last_error t_last_error;

void set_ok() noexcept {
  t_last_error.code = LOOM_OK;
  t_last_error.message[0] = '\0';
}

void set_error(int code, std::string_view message) noexcept {
  t_last_error.code = code;
  const std::size_t n = std::min(message.size(), t_last_error.message.size() - 1);
  std::memcpy(t_last_error.message.data(), message.data(), n);
  t_last_error.message[n] = '\0';
}

// Records the exception being handled; call only from a handler.
void set_error_from_current_exception() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    set_error(LOOM_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const loom::invalid_argument& e) {
    set_error(LOOM_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    set_error(LOOM_ERROR_INTERNAL, e.what());
  } catch (...) {
    set_error(LOOM_ERROR_INTERNAL, "an exception that is not a std::exception");
  }
}

loom::device_id to_device_id(loom_device d) noexcept {
  return {static_cast<loom::device_type>(d.device_type), d.device_id};
}

// The resource serving `d`; nullptr, with LOOM_ERROR_NO_DEVICE recorded, when none does.
memory_resource* resource_for(loom_device d) {
  memory_resource* r = loom::memory::find_device_resource(to_device_id(d));
  if (r == nullptr) {
    set_error(LOOM_ERROR_NO_DEVICE,
              fmt::format("no memory resource for device {} (device_type {}, device_id {})",
                          loom::to_string(to_device_id(d)), d.device_type, d.device_id));
  }
  return r;
}

std::size_t alignment_or_default(std::size_t alignment) noexcept {
  return alignment == 0 ? loom::memory::default_alignment : alignment;
}

void fill(const loom::memory_stats& s, loom_memory_statistics* out) noexcept {
  out->bytes_in_use = s.bytes_in_use;
  out->peak_bytes_in_use = s.peak_bytes_in_use;
  out->total_bytes_allocated = s.total_bytes_allocated;
  out->bytes_reserved = s.bytes_reserved;
  out->peak_bytes_reserved = s.peak_bytes_reserved;
  out->allocations_in_use = s.allocations_in_use;
  out->num_allocs = s.num_allocs;
  out->num_deallocs = s.num_deallocs;
  out->num_failed_allocs = s.num_failed_allocs;
  out->free_bytes = s.free_bytes;
  out->largest_free_block = s.largest_free_block;
  out->unusable_bytes = s.unusable_bytes;
  out->num_regions = s.num_regions;
  out->fragmentation = s.fragmentation();
}

// The library's name, or nullopt with LOOM_ERROR_INVALID_ARGUMENT recorded when it cannot
// name one.
std::optional<std::string_view> library_name(const char* library, const char* what) {
  if (library == nullptr) {
    set_error(LOOM_ERROR_INVALID_ARGUMENT, fmt::format("{}: library is NULL", what));
    return std::nullopt;
  }
  // Bounded, so that a name without its terminating NUL is never read past its limit + 1.
  const std::string_view name(library, strnlen(library, loom::memory::max_library_name + 1));
  if (std::string why = loom::memory::check_library_name(name); !why.empty()) {
    set_error(LOOM_ERROR_INVALID_ARGUMENT, fmt::format("{}: {}", what, why));
    return std::nullopt;
  }
  return name;
}

}  // namespace

extern "C" {

void* loom_allocate(size_t bytes, size_t alignment, loom_device device,
                    loom_stream stream) noexcept {
  try {
    memory_resource* r = resource_for(device);
    if (r == nullptr) return nullptr;
    void* p = r->allocate(bytes, alignment_or_default(alignment), loom::stream{stream});
    set_ok();
    return p;
  } catch (...) {
    set_error_from_current_exception();
    return nullptr;
  }
}

void loom_deallocate(void* p, size_t bytes, size_t alignment, loom_device device,
                     loom_stream stream) noexcept {
  try {
    if (p == nullptr) {
      set_ok();
      return;
    }
    memory_resource* r = resource_for(device);
    if (r == nullptr) return;
    r->deallocate(p, bytes, alignment_or_default(alignment), loom::stream{stream});
    set_ok();
  } catch (...) {
    set_error_from_current_exception();
  }
}

int loom_memory_stats(loom_device device, loom_memory_statistics* out) noexcept {
  try {
    if (out == nullptr) {
      set_error(LOOM_ERROR_INVALID_ARGUMENT, "loom_memory_stats: out is NULL");
      return t_last_error.code;
    }
    memory_resource* r = resource_for(device);
    if (r == nullptr) return t_last_error.code;
    const std::optional<loom::memory_stats> s = r->stats();
    *out = {};
    if (s) fill(*s, out);
    set_ok();
  } catch (...) {
    set_error_from_current_exception();
  }
  return t_last_error.code;
}

void* loom_allocate_for(const char* library, size_t bytes, size_t alignment, loom_device device,
                        loom_stream stream) noexcept {
  try {
    const std::optional<std::string_view> name = library_name(library, "loom_allocate_for");
    if (!name) return nullptr;
    if (resource_for(device) == nullptr) return nullptr;
    void* p = loom::memory::library_resource(to_device_id(device), *name)
                  .allocate(bytes, alignment_or_default(alignment), loom::stream{stream});
    set_ok();
    return p;
  } catch (...) {
    set_error_from_current_exception();
    return nullptr;
  }
}

void loom_deallocate_for(const char* library, void* p, size_t bytes, size_t alignment,
                         loom_device device, loom_stream stream) noexcept {
  try {
    if (p == nullptr) {
      set_ok();
      return;
    }
    const std::optional<std::string_view> name = library_name(library, "loom_deallocate_for");
    if (!name) return;
    loom::memory::memory_resource* r =
        loom::memory::find_library_resource(to_device_id(device), *name);
    if (r == nullptr) {
      set_error(LOOM_ERROR_INVALID_ARGUMENT,
                fmt::format("loom_deallocate_for: library '{}' has allocated nothing on {}, so "
                            "the block at {} cannot be its; it is not freed",
                            *name, loom::to_string(to_device_id(device)), p));
      return;
    }
    if (resource_for(device) == nullptr) return;
    r->deallocate(p, bytes, alignment_or_default(alignment), loom::stream{stream});
    set_ok();
  } catch (...) {
    set_error_from_current_exception();
  }
}

int loom_memory_stats_for(loom_device device, const char* library,
                          loom_memory_statistics* out) noexcept {
  try {
    if (out == nullptr) {
      set_error(LOOM_ERROR_INVALID_ARGUMENT, "loom_memory_stats_for: out is NULL");
      return t_last_error.code;
    }
    const std::optional<std::string_view> name = library_name(library, "loom_memory_stats_for");
    if (!name) return t_last_error.code;
    const std::optional<loom::memory_stats> s =
        loom::memory::library_stats(to_device_id(device), *name);
    if (!s && resource_for(device) == nullptr) return t_last_error.code;
    *out = {};
    if (s) fill(*s, out);
    set_ok();
  } catch (...) {
    set_error_from_current_exception();
  }
  return t_last_error.code;
}

int loom_last_error(void) noexcept {
  return t_last_error.code;
}

const char* loom_last_error_message(void) noexcept {
  return t_last_error.message.data();
}

}  // extern "C"
