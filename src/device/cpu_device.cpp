#include "loom/device/cpu_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "loom/core/error.hpp"
#include "loom/memory/host_resource.hpp"

namespace loom {
namespace {

constexpr const char* host_architecture() noexcept {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#elif defined(__i386__)
  return "x86";
#elif defined(__arm__)
  return "arm";
#elif defined(__powerpc64__)
  return "ppc64";
#elif defined(__riscv)
  return "riscv";
#else
  return "unknown";
#endif
}

device_attributes cpu_attributes(int index, int threads, std::size_t memory_limit,
                                 std::string description) {
  if (index < 0) {
    throw invalid_argument(fmt::format("cpu_device: index {} is negative", index));
  }
  device_attributes a;
  a.id = device_id{device_type::cpu, index};
  a.name = full_name(a.id);
  a.memory_limit = memory_limit;
  a.threads = threads;
  a.description = std::move(description);
  return a;
}

}  // namespace

memory::bfc_pool_options cpu_pool_options(int index, std::size_t memory_limit) {
  memory::bfc_pool_options o;
  o.name = fmt::format("cpu:{}", index);
  if (memory_limit != 0) o.max_size = memory_limit;
  return o;
}

cpu_device::cpu_device(int index, int threads, std::size_t memory_limit, std::string description)
    : cpu_device(index, threads, memory_limit, std::move(description),
                 memory::host_resource::instance()) {}

cpu_device::cpu_device(int index, int threads, std::size_t memory_limit, std::string description,
                       memory::memory_resource& upstream)
    : device(cpu_attributes(index, threads, memory_limit, std::move(description))),
      pool_allocator_(
          std::make_unique<memory::bfc_pool>(upstream, cpu_pool_options(index, memory_limit))),
      threads_(std::make_unique<thread_pool>(threads, fmt::format("cpu:{}", index))) {}

// threads_ goes first (declared last), so work still queued on the pool finishes while the
// memory pool is alive.
cpu_device::~cpu_device() = default;

void cpu_device::log_allocations(const std::filesystem::path& path) {
  log_ = std::make_unique<memory::logging_adaptor>(*pool_allocator_, path);
}

std::vector<std::unique_ptr<device>> cpu_device_factory::create_devices(
    const device_options& options) {
  const int n = options.virtual_cpu_devices;
  if (n < 1) {
    throw invalid_argument(fmt::format(
        "cpu_device_factory: virtual_cpu_devices is {}; at least 1 CPU device is needed", n));
  }
  if (options.cpu_threads < 0) {
    throw invalid_argument(fmt::format(
        "cpu_device_factory: cpu_threads is {}; expected a thread count, or 0 for one per core",
        options.cpu_threads));
  }
  int total = options.cpu_threads;
  if (total == 0) total = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_device = std::max(1, total / n);

  std::vector<std::unique_ptr<device>> devices;
  devices.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::string description = fmt::format("{} host, {} thread{}", host_architecture(), per_device,
                                          per_device == 1 ? "" : "s");
    if (n > 1) description += fmt::format(", virtual {} of {}", i + 1, n);
    if (!memory_note_.empty()) description += ", " + memory_note_;
    auto d = std::make_unique<cpu_device>(
        i, per_device, options.cpu_memory_limit, std::move(description),
        upstream_ != nullptr ? *upstream_ : memory::host_resource::instance());
    if (i == 0 && !options.cpu_memory_log.empty()) d->log_allocations(options.cpu_memory_log);
    devices.push_back(std::move(d));
  }
  return devices;
}

}  // namespace loom
