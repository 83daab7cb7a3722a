#include "loom/core/device_id.hpp"

#include <fmt/format.h>

namespace loom {

const char* to_string(device_type t) noexcept {
  switch (t) {
    case device_type::cpu: return "cpu";
    case device_type::cuda: return "cuda";
    case device_type::cuda_host: return "cuda_host";
    case device_type::cuda_managed: return "cuda_managed";
  }
  return "unknown";
}

std::string to_string(device_id d) { return fmt::format("{}:{}", to_string(d.type), d.index); }

}  // namespace loom
