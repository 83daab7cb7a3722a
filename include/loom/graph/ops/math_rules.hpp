// The rules of the element-wise ops (math.hpp) over shapes and attribute values: the broadcast
// output shape, the generators' shape and range's length. Shape inference
// (src/graph/ops/elementwise_ops.cpp, fused_ops.cpp) calls them when shapes are known, and
// every backend's element-wise kernels call the same functions at run time, so a bad node
// fails with the same message wherever it is checked.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>

#include "loom/core/shape.hpp"

namespace loom::math_rules {

/// The shape `shapes` broadcast to together (NumPy's rules, folded left to right from the
/// scalar shape with broadcast_shapes). Throws loom::invalid_argument naming the two shapes
/// that do not broadcast: the shapes before it broadcast together, and the next one.
shape broadcast_shape(std::span<const shape* const> shapes);
inline shape broadcast_shape(std::initializer_list<const shape*> shapes) {
  return broadcast_shape(std::span<const shape* const>(shapes.begin(), shapes.size()));
}

/// The broadcast shape of shapes that may be unknown (inference): unknown when any is, though
/// the known ones before the first unknown must still broadcast together (else throws as
/// above).
std::optional<shape> broadcast_shape(std::span<const std::optional<shape>* const> shapes);

/// Throws loom::invalid_argument ("shape [2, ?] must be fully defined") unless every
/// dimension of a generator's `shape` attribute is known.
void check_defined_shape(const shape& s);

/// The number of elements of range(start, limit, delta): ceil((limit - start) / delta), at
/// least 0. Throws loom::invalid_argument for delta = 0, a non-finite count or one too large
/// to allocate.
std::int64_t range_length(double start, double limit, double delta);

}  // namespace loom::math_rules
