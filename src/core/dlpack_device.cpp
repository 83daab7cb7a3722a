#include "loom/core/dlpack_device.hpp"

#include <fmt/format.h>

#include <cstring>
#include <type_traits>

#include "loom/core/error.hpp"

namespace loom {

// device_type mirrors DLDeviceType code for code; a new DLPack type needs a new enumerator.
static_assert(static_cast<int>(device_type::cpu) == kDLCPU);
static_assert(static_cast<int>(device_type::cuda) == kDLCUDA);
static_assert(static_cast<int>(device_type::cuda_host) == kDLCUDAHost);
static_assert(static_cast<int>(device_type::opencl) == kDLOpenCL);
static_assert(static_cast<int>(device_type::vulkan) == kDLVulkan);
static_assert(static_cast<int>(device_type::metal) == kDLMetal);
static_assert(static_cast<int>(device_type::vpi) == kDLVPI);
static_assert(static_cast<int>(device_type::rocm) == kDLROCM);
static_assert(static_cast<int>(device_type::rocm_host) == kDLROCMHost);
static_assert(static_cast<int>(device_type::ext_dev) == kDLExtDev);
static_assert(static_cast<int>(device_type::cuda_managed) == kDLCUDAManaged);
static_assert(sizeof(DLDeviceType) == sizeof(std::int32_t));

DLDevice to_dlpack(device_id d) {
  const auto code = static_cast<std::int32_t>(d.type);
  if (!is_valid_device_type(code) || d.index < 0) {
    throw invalid_argument(
        fmt::format("to_dlpack: device type code {} index {} has no DLPack equivalent (expected a "
                    "device_type value and a non-negative index)",
                    code, d.index));
  }
  DLDevice out{};
  out.device_type = static_cast<DLDeviceType>(code);
  out.device_id = d.index;
  return out;
}

device_id from_dlpack(const DLDevice& d) {
  // The code is read as an integer, not as a DLDeviceType: a code outside the enumeration's
  // range would be undefined behaviour to load as the enum.
  std::int32_t code = 0;
  std::memcpy(&code, &d.device_type, sizeof code);
  if (!is_valid_device_type(code)) {
    throw invalid_argument(fmt::format(
        "from_dlpack: device type code {} (device_id {}) is not one DLPack {}.{} defines "
        "(expected 1-4 or 7-13)",
        code, d.device_id, DLPACK_VERSION / 100, DLPACK_VERSION % 100 / 10));
  }
  if (d.device_id < 0) {
    throw invalid_argument(fmt::format("from_dlpack: negative device_id {} for a {} device",
                                       d.device_id, to_string(static_cast<device_type>(code))));
  }
  return device_id{static_cast<device_type>(code), d.device_id};
}

}  // namespace loom
