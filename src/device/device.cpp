#include "loom/device/device.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom {
namespace {

// The base implementations copy with the CPU: both sides must be in host-accessible memory.
void require_host_accessible(const char* what, const device& dev, const tensor& src) {
  if (!src.defined()) {
    throw invalid_argument(
        fmt::format("{} on {}: the source tensor is undefined", what, dev.name()));
  }
  if (!is_host_accessible(dev.type())) {
    throw invalid_argument(fmt::format(
        "{}: {} has no host-accessible memory and no copy of its own", what, dev.name()));
  }
  if (!is_host_accessible(src.device().type)) {
    throw invalid_argument(fmt::format("{} on {}: the source {} is not in host memory", what,
                                       dev.name(), src.describe()));
  }
}

}  // namespace

tensor device::allocate(dtype t, const shape& s) {
  return memory::allocate_tensor(allocator(), id(), t, s, tensor_stream());
}

tensor device::copy_from_host(const tensor& src) {
  require_host_accessible("copy_from_host", *this, src);
  tensor out = allocate(src.type(), src.shape());
  copy_to_dense(src, out.raw_data());
  return out;
}

tensor device::contiguous_copy(const tensor& src) {
  require_host_accessible("contiguous_copy", *this, src);
  return memory::contiguous_copy(src, allocator(), id());
}

tensor device::copy_to_host(const tensor& src, memory::memory_resource& host) {
  require_host_accessible("copy_to_host", *this, src);
  tensor out =
      memory::allocate_tensor(host, device_id{device_type::cpu, 0}, src.type(), src.shape());
  copy_to_dense(src, out.raw_data());
  return out;
}

}  // namespace loom
