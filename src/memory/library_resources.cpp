#include "loom/memory/library_resources.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

#include "loom/core/error.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/misuse.hpp"

namespace loom::memory {
namespace {

// Sends each call to the resource serving the device at that moment, as the C ABI's
// loom_allocate does; keeps no figures of its own (the adaptor over it does).
class device_forwarder final : public memory_resource {
 public:
  explicit device_forwarder(device_id device) noexcept : device_(device) {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override {
    return get_device_resource(device_).allocate(bytes, alignment, s);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override {
    memory_resource* r = nullptr;
    try {
      r = find_device_resource(device_);
    } catch (...) {  // only cpu:0's default pool can fail to be made, and it exists by now
    }
    if (r == nullptr) {
      // deallocate is noexcept: with no memory for the message, report_misuse writes its own.
      misuse_report report{misuse_kind::unknown_pointer, {}, p, bytes, 0, s, {}};
      try {
        report.resource = "library resource";
        report.message = fmt::format(
            "a block of {} bytes at {} was given back for device {}, which no memory resource "
            "serves any more; it is not freed",
            bytes, p, to_string(device_));
      } catch (...) {
        report.message.clear();
      }
      report_misuse(std::move(report));
      return;
    }
    r->deallocate(p, bytes, alignment, s);
  }

  device_id device_;
};

struct library_entry {
  library_entry(device_id d, std::string_view library)
      : device(d), name(library), upstream(d), adaptor(upstream) {}

  device_id device;
  std::string name;
  device_forwarder upstream;
  statistics_adaptor adaptor;
};

// Append-only: an entry is stored before the count that covers it is published, and is
// never removed or destroyed (blocks may come back at exit, after static destructors).
std::array<std::atomic<library_entry*>, max_library_resources> g_entries{};
std::atomic<std::size_t> g_count{0};
std::mutex g_append_mutex;

library_entry* find_entry(device_id device, std::string_view library) noexcept {
  const std::size_t n = g_count.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    library_entry* e = g_entries[i].load(std::memory_order_acquire);
    if (e->device == device && e->name == library) return e;
  }
  return nullptr;
}

// The device registry's rule (device_resources.cpp): these types, indices below 64.
bool registry_can_hold(device_id d) noexcept {
  const bool known = d.type == device_type::cpu || d.type == device_type::cuda ||
                     d.type == device_type::cuda_host || d.type == device_type::cuda_managed;
  return known && d.index >= 0 && d.index < max_device_index;
}

}  // namespace

std::string check_library_name(std::string_view library) {
  if (library.empty()) return "a library name must not be empty";
  if (library.size() > max_library_name) {
    return fmt::format("the library name '{}...' is longer than {} bytes", library.substr(0, 16),
                       max_library_name);
  }
  for (std::size_t i = 0; i < library.size(); ++i) {
    const auto c = static_cast<unsigned char>(library[i]);
    if (c < 0x20 || c > 0x7e) {
      return fmt::format(
          "the library name has byte 0x{:02x} at offset {}; only printable ASCII "
          "is allowed",
          c, i);
    }
  }
  return {};
}

statistics_adaptor& library_resource(device_id device, std::string_view library) {
  if (library_entry* e = find_entry(device, library)) return e->adaptor;
  if (std::string why = check_library_name(library); !why.empty()) {
    throw invalid_argument(fmt::format("library_resource: {}", why));
  }
  if (!registry_can_hold(device)) {
    throw invalid_argument(fmt::format(
        "library_resource: device {} cannot have a memory resource (known types: cpu, cuda, "
        "cuda_host, cuda_managed; indices 0 to {})",
        to_string(device), max_device_index - 1));
  }
  std::lock_guard lock(g_append_mutex);
  if (library_entry* e = find_entry(device, library)) return e->adaptor;
  const std::size_t n = g_count.load(std::memory_order_relaxed);
  if (n == max_library_resources) {
    throw invalid_argument(fmt::format(
        "library_resource: cannot count library '{}' on {}: all {} (device, library) pairs are "
        "taken",
        library, to_string(device), max_library_resources));
  }
  auto* e = new library_entry(device, library);  // never destroyed (see above)
  g_entries[n].store(e, std::memory_order_release);
  g_count.store(n + 1, std::memory_order_release);
  return e->adaptor;
}

statistics_adaptor* find_library_resource(device_id device, std::string_view library) noexcept {
  library_entry* e = find_entry(device, library);
  return e != nullptr ? &e->adaptor : nullptr;
}

std::optional<memory_stats> library_stats(device_id device, std::string_view library) {
  const library_entry* e = find_entry(device, library);
  if (e == nullptr) return std::nullopt;
  return e->adaptor.get_stats();
}

std::vector<std::string> libraries(device_id device) {
  std::vector<std::string> out;
  const std::size_t n = g_count.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    const library_entry* e = g_entries[i].load(std::memory_order_acquire);
    if (e->device == device) out.push_back(e->name);
  }
  return out;
}

}  // namespace loom::memory
