// library_resources: memory other libraries take from loom's pools, counted per library.
//
// When PyTorch, CuPy or Numba allocate through loom (the C ABI's loom_allocate_for, the
// plug-ins of python/loom/cuda.py), each does so under a library name ("torch", "cupy",
// "numba"), and the blocks go through a statistics_adaptor of that (device, library) pair:
//
//   auto& torch = loom::memory::library_resource({device_type::cuda, 0}, "torch");
//   void* p = torch.allocate(1 << 20, 256, s);          // from cuda:0's pool
//   library_stats({device_type::cuda, 0}, "torch");     // bytes_in_use 1 MiB, num_allocs 1
//   get_device_resource({device_type::cuda, 0}).stats(); // the pool: every library's blocks
//
// The adaptor's upstream is the resource serving the device at the time of each call
// (get_device_resource), exactly as for loom_allocate: the pool's own figures stay the
// totals of everyone, and a library's figures are its share of them. A block must be given
// back through the same library's resource (or the library's figures would drift).
//
// Each (device, library) resource is made on first use and lives for the whole process
// (blocks may be given back to it while static objects are destroyed at exit). Lookups are
// lock-free: a scan of an append-only table. Thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/device_id.hpp"
#include "loom/core/memory_stats.hpp"
#include "loom/memory/statistics_adaptor.hpp"

namespace loom::memory {

/// The longest library name, in bytes.
inline constexpr std::size_t max_library_name = 63;

/// How many (device, library) pairs the process may count.
inline constexpr std::size_t max_library_resources = 256;

/// Why `library` cannot name a library (empty, longer than max_library_name, a byte
/// outside printable ASCII), or "" when it can.
[[nodiscard]] std::string check_library_name(std::string_view library);

/// The resource through which `library` allocates on `device`, made on first use (see the
/// header comment). Throws loom::invalid_argument naming the problem for a bad library name
/// (check_library_name), a device the device registry cannot hold, or a table that is full
/// (max_library_resources pairs); std::bad_alloc.
[[nodiscard]] statistics_adaptor& library_resource(device_id device, std::string_view library);

/// The resource of (device, library) when that library has allocated there (or asked for
/// it with library_resource), else nullptr. Never throws.
[[nodiscard]] statistics_adaptor* find_library_resource(device_id device,
                                                        std::string_view library) noexcept;

/// The figures of `library` on `device` (statistics_adaptor::get_stats), or nullopt when
/// it has no resource there.
[[nodiscard]] std::optional<memory_stats> library_stats(device_id device, std::string_view library);

/// The libraries with a resource on `device`, in the order they first had one.
[[nodiscard]] std::vector<std::string> libraries(device_id device);

}  // namespace loom::memory
