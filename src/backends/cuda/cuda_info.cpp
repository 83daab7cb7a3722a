// loom/cuda/info.hpp for builds with the CUDA backend; the device factories it adds
// (cuda_info.hpp).
#include "cuda_info.hpp"

#include <fmt/format.h>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_libraries.hpp"
#include "loom/cuda/info.hpp"
#include "loom/cuda/resources.hpp"
#include "loom/device/cpu_device.hpp"

namespace loom {
namespace cuda {
namespace {

// cudaGetDeviceCount's answer, asked once (it initialises the runtime). With a GPU present,
// cuBLAS, cuBLASLt and NVRTC are loaded here (Note [lazy CUDA libraries]); without them the
// GPUs are unusable, and loom runs on the CPU saying why.
struct probe {
  cudaError_t status = cudaSuccess;
  int count = 0;
  std::string missing;  // the libraries that could not be loaded
};
const probe& probed() {
  static const probe p = [] {
    probe r;
    r.status = cudaGetDeviceCount(&r.count);
    if (r.status != cudaSuccess) {
      (void)cudaGetLastError();
      r.count = 0;
    }
    if (r.count > 0) {
      r.missing = load_libraries();
      if (!r.missing.empty()) r.count = 0;
    }
    return r;
  }();
  return p;
}

}  // namespace

std::size_t trim(int ordinal) {
  memory::bfc_pool* pool = find_process_pool(ordinal);
  return pool == nullptr ? 0 : pool->trim();
}

bool is_built() noexcept {
  return true;
}

int device_count() noexcept {
  return probed().count;
}

std::string availability() {
  const probe& p = probed();
  if (p.status == cudaErrorInsufficientDriver || p.status == cudaErrorNoDevice) {
    return p.status == cudaErrorNoDevice ? "no CUDA GPU is visible (" + describe(p.status) + ")"
                                         : "no usable CUDA driver (" + describe(p.status) + ")";
  }
  if (p.status != cudaSuccess) return "CUDA is unavailable (" + describe(p.status) + ")";
  if (!p.missing.empty()) return "the GPUs are unusable without CUDA's libraries: " + p.missing;
  if (p.count == 0) return "no CUDA GPU is visible";
  return "";
}

std::string describe() {
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  int driver = 0;
  (void)cudaDriverGetVersion(&driver);
  const std::string versions =
      fmt::format("CUDA runtime {}.{}, driver {}", runtime / 1000, (runtime % 1000) / 10,
                  driver == 0 ? std::string("none")
                              : fmt::format("{}.{}", driver / 1000, (driver % 1000) / 10));
  const int n = device_count();
  if (n == 0) return versions + ": " + availability();
  std::string out = fmt::format("{}, {} GPU{}:", versions, n, n == 1 ? "" : "s");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += fmt::format(" {}{} (sm_{}{}, {:.1f} GiB)", i == 0 ? "" : "; ", p.name, p.major, p.minor,
                       static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30));
  }
  return out;
}

namespace {

// TensorFlow's GPU-compatible CPU device: with a GPU present, CPU devices allocate from
// pinned host memory, so every host tensor can be copied to and from the GPU asynchronously.
// Without one, it makes the plain CPU devices.
class gpu_compatible_cpu_factory final : public device_factory {
 public:
  device_type type() const noexcept override { return device_type::cpu; }
  std::vector<std::unique_ptr<device>> create_devices(const device_options& options) override {
    if (device_count() > 0 && options.cuda.pinned_cpu_memory && options.cuda_device_count != 0) {
      return cpu_device_factory(&memory::pinned_host_resource::instance(), "pinned memory")
          .create_devices(options);
    }
    return cpu_device_factory().create_devices(options);
  }
};

}  // namespace
}  // namespace cuda

void register_cuda_device_factories(device_factory_registry& registry) {
  // Above the CPU factory's priority (0), as a plugin's would be.
  registry.register_factory(std::make_unique<cuda::gpu_compatible_cpu_factory>(), 10);
  registry.register_factory(std::make_unique<cuda::cuda_device_factory>(), 10);
}

}  // namespace loom
