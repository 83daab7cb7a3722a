// Tensors whose buffers come from a memory resource.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// A contiguous tensor of `t` and `s` (fully defined) whose buffer comes from `resource` on
/// `s_stream` and goes back to it when the last view is gone. `resource` must outlive the
/// buffer. Throws loom::out_of_memory as the resource does, loom::invalid_argument for a
/// shape with unknown or negative dimensions.
tensor allocate_tensor(memory_resource& resource, device_id device, dtype t, const shape& s,
                       stream s_stream = {});

/// A host tensor (cpu:0's resource, from memory::get_device_resource) of `t` and `s`.
tensor host_tensor(dtype t, const shape& s);

/// A host tensor holding `values` (row-major). Throws loom::invalid_argument when the count
/// does not match the shape.
template <class T>
tensor host_tensor(const shape& s, std::span<const T> values) {
  tensor out = host_tensor(dtype_v<T>, s);
  if (static_cast<std::int64_t>(values.size()) != out.num_elements()) {
    throw invalid_argument("host_tensor: " + std::to_string(values.size()) +
                           " values for shape " + to_string(s));
  }
  if (!values.empty()) std::memcpy(out.raw_data(), values.data(), values.size_bytes());
  return out;
}
template <class T>
tensor host_tensor(const shape& s, const std::vector<T>& values) {
  return host_tensor<T>(s, std::span<const T>(values.data(), values.size()));
}
inline tensor host_tensor(const shape& s, std::initializer_list<float> values) {
  return host_tensor<float>(s, std::span<const float>(values.begin(), values.size()));
}

/// A dense copy of `src` (any strides) in a new buffer from `resource` (host memory).
tensor contiguous_copy(const tensor& src, memory_resource& resource, device_id device);

}  // namespace loom::memory
