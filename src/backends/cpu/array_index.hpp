// What the CPU's index kernels (gather, gather_grad in array_index_kernels.cpp and
// array_grad_kernels.cpp; the selects of array_select_kernels.cpp) share: the visit of an
// index dtype, the position of an index in their out-of-range messages, and elements as
// doubles.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/half.hpp"
#include "loom/core/shape.hpp"

namespace loom::cpu {

/// "[5]" or "[1, 2]": the position of flat element `flat` in a tensor of shape `s`.
inline std::string position(const shape& s, std::int64_t flat) {
  std::vector<std::int64_t> idx(s.rank(), 0);
  for (std::size_t k = s.rank(); k-- > 0;) {
    idx[k] = flat % s[k];
    flat /= s[k];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

/// Element v of any dtype but bool as a double (16-bit floats through float).
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

/// Calls f(I{}) with I the C++ type of an index dtype (int32 or int64).
template <class F>
void visit_index(dtype t, F&& f) {
  if (t == dtype::i32)
    f(std::int32_t{});
  else
    f(std::int64_t{});
}

}  // namespace loom::cpu
