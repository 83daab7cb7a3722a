// device_id: which device, as a small value type.
//
// The type codes are DLPack's DLDeviceType values, so conversion to and from DLDevice is
// a copy of two integers. (Name parsing, "/device:CPU:0" and "cuda:1", arrives with the
// runtime core.)
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class device_type : std::int32_t {
  cpu = 1,          // kDLCPU
  cuda = 2,         // kDLCUDA
  cuda_host = 3,    // kDLCUDAHost (pinned host memory)
  cuda_managed = 13 // kDLCUDAManaged
};

struct device_id {
  device_type type = device_type::cpu;
  std::int32_t index = 0;

  friend constexpr bool operator==(device_id, device_id) noexcept = default;
};

/// "cpu", "cuda", "cuda_host", "cuda_managed".
const char* to_string(device_type t) noexcept;
/// "cpu:0", "cuda:1".
std::string to_string(device_id d);

}  // namespace loom
