// device_id: which device, as a small value type; device names and partial device specs.
//
// The type codes are DLPack's DLDeviceType values (every type DLPack 0.6 defines), so
// conversion to and from DLDevice (loom/core/dlpack_device.hpp) is a copy of two integers.
//
// Note [device names]
// A device has two spellings. The full name, "/device:CPU:0" or "/device:CUDA:1", is
// TensorFlow's: what listings, placement reasons and traces print (full_name). The short
// form, "cpu:0" or "cuda:1", is what to_string prints in messages. parse_device_id reads
// both, with the type in any case, "gpu" meaning "cuda" (so "/device:GPU:1" works), and an
// index of decimal digits that fits std::int32_t. Nothing else is accepted: no spaces, no
// sign, no extra fields. A placement request may leave out the index or the type
// (device_spec: "cpu", "/device:CPU:*", "*:1", or "" for any device).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

/// A kind of device; the values are DLPack's (DLDeviceType).
enum class device_type : std::int32_t {
  cpu = 1,            // kDLCPU
  cuda = 2,           // kDLCUDA
  cuda_host = 3,      // kDLCUDAHost (pinned host memory)
  opencl = 4,         // kDLOpenCL
  vulkan = 7,         // kDLVulkan
  metal = 8,          // kDLMetal
  vpi = 9,            // kDLVPI (Verilog simulator)
  rocm = 10,          // kDLROCM
  rocm_host = 11,     // kDLROCMHost (pinned host memory, HIP)
  ext_dev = 12,       // kDLExtDev (reserved for extensions)
  cuda_managed = 13,  // kDLCUDAManaged
};

/// Every device_type, in code order (for tests and listings).
inline constexpr device_type all_device_types[] = {
    device_type::cpu,       device_type::cuda,    device_type::cuda_host,   device_type::opencl,
    device_type::vulkan,    device_type::metal,   device_type::vpi,         device_type::rocm,
    device_type::rocm_host, device_type::ext_dev, device_type::cuda_managed};

/// True when `code` is the value of a device_type (a type DLPack 0.6 defines).
[[nodiscard]] constexpr bool is_valid_device_type(std::int32_t code) noexcept {
  for (device_type t : all_device_types) {
    if (static_cast<std::int32_t>(t) == code) return true;
  }
  return false;
}

/// True when the CPU can read and write the device's memory directly (cpu, cuda_host,
/// cuda_managed, rocm_host), so a memcpy moves data to or from it.
[[nodiscard]] constexpr bool is_host_accessible(device_type t) noexcept {
  return t == device_type::cpu || t == device_type::cuda_host || t == device_type::cuda_managed ||
         t == device_type::rocm_host;
}

struct device_id {
  device_type type = device_type::cpu;
  std::int32_t index = 0;

  friend constexpr bool operator==(device_id, device_id) noexcept = default;
};

/// "cpu", "cuda", "cuda_host", "opencl", ..., "cuda_managed"; "unknown" for a value that
/// is no device_type.
const char* to_string(device_type t) noexcept;
/// "cpu:0", "cuda:1".
std::string to_string(device_id d);

/// The full name (Note [device names]): "/device:CPU:0", "/device:CUDA:1",
/// "/device:CUDA_HOST:0". A value that is no device_type prints as "/device:UNKNOWN(<code>):i".
std::string full_name(device_id d);

/// Reads a device name (Note [device names]): "/device:CPU:0", "/device:cpu:0",
/// "/device:GPU:1", "/device:CUDA:1", "cpu:0", "cuda:1", "gpu:1". Throws
/// loom::invalid_argument, quoting `text` and saying what was expected, for anything else
/// (no index, a negative or non-numeric index, one beyond std::int32_t, an unknown type,
/// extra fields, spaces).
device_id parse_device_id(std::string_view text);

/// A partial device: what a placement request names. An empty field matches anything.
struct device_spec {
  std::optional<device_type> type;
  std::optional<std::int32_t> index;

  /// True when `d` has this spec's type and index (where they are given).
  [[nodiscard]] bool matches(device_id d) const noexcept;
  /// "cpu:0", "cpu" (any index), "*:1" (any type), "*" (any device); parse_device_spec
  /// reads each back.
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const device_spec&, const device_spec&) = default;
};

/// Reads a placement request: everything parse_device_id accepts, plus forms that leave
/// the index out ("cpu", "CPU", "/device:CPU", "/device:CPU:*", "cuda") or the type ("*:1",
/// "/device:*:1"), and "" or "*" for any device. Throws loom::invalid_argument, quoting
/// `text` and saying what was expected, for anything else.
device_spec parse_device_spec(std::string_view text);

/// A placement request's process and device (Note [device names]; docs/distributed.md,
/// "Devices in other processes"): "/job:worker/task:1/device:CPU:0" (TensorFlow's form;
/// "/replica:0" may stand before the task) is task 1's "/device:CPU:0";
/// "/job:worker/task:1/cpu:0" and "/task:1/cpu:0" the same; "/job:worker/task:1" any device
/// of task 1. A request without a task ("/device:CPU:0") has none.
struct task_request {
  std::optional<std::int32_t> task;
  device_spec device;
};

/// Reads a placement request with its task (parse_device_spec for the device part). Throws
/// loom::invalid_argument, quoting `text`, for a job other than "worker" (loom's processes
/// are one job), a replica other than 0, a task that is not a non-negative integer below
/// 2^31, and a device part parse_device_spec refuses.
task_request parse_task_request(std::string_view text);

/// "/job:worker/task:<task>" + full_name(d): a device's name across processes.
std::string task_device_name(std::int32_t task, device_id d);

}  // namespace loom
