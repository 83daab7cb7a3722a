#include "loom/memory/tensor_allocation.hpp"

#include <fmt/format.h>

#include "loom/memory/device_resources.hpp"

namespace loom::memory {
namespace {

void release_to_resource(void* context, void* data, std::size_t bytes, std::size_t alignment,
                         stream s) noexcept {
  static_cast<memory_resource*>(context)->deallocate(data, bytes, alignment, s);
}

}  // namespace

tensor allocate_tensor(memory_resource& resource, device_id device, dtype t, const shape& s,
                       stream s_stream) {
  for (auto d : s.dims()) {
    if (d < 0) {
      throw invalid_argument(
          fmt::format("cannot allocate a {} tensor of shape {}", to_string(t), to_string(s)));
    }
  }
  const std::size_t bytes = static_cast<std::size_t>(s.num_elements()) * size_of(t);
  void* p = resource.allocate(bytes, default_alignment, s_stream);
  return tensor(buffer::adopt(p, bytes, default_alignment, device, s_stream, &release_to_resource,
                              &resource),
                t, s);
}

tensor host_tensor(dtype t, const shape& s) {
  constexpr device_id cpu0{device_type::cpu, 0};
  return allocate_tensor(get_device_resource(cpu0), cpu0, t, s);
}

tensor contiguous_copy(const tensor& src, memory_resource& resource, device_id device) {
  tensor out = allocate_tensor(resource, device, src.type(), src.shape());
  copy_to_dense(src, out.raw_data());
  return out;
}

}  // namespace loom::memory
