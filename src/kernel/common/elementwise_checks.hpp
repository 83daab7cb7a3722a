// Argument checks and outputs shared by every backend's element-wise kernels: the broadcast
// output shape (math_rules::broadcast_shape, failing the node), buffer forwarding, the
// generators' output shape, and fused_elementwise's expression and output shape. Each runs
// once per kernel construction or call, never per element.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/fused_expr.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::ew {

/// The broadcast shape of `shapes` (math_rules::broadcast_shape); fails the node
/// (loom::node_error) when they do not broadcast, as fed placeholders with unknown
/// dimensions can at run time.
shape broadcast_shape_of(const kernel_context& ctx, std::initializer_list<const shape*> shapes);

/// Output 0 for an element-wise result of shape `s`: written in place into the first of
/// `candidates` (input indices) that has shape `s` and whose buffer the node alone holds
/// (kernel_context::forward_input), else a new tensor.
tensor& forward_or_allocate(kernel_context& ctx, const shape& s,
                            std::initializer_list<std::size_t> candidates);

/// The bits of `v` as one element of dtype t (from_double: as fill, zeros and ones make their
/// elements), in the low bytes: the value a device fill kernel writes. Made once per kernel
/// or call, on the host.
std::uint64_t element_bits(dtype t, double v);

/// A generator's output shape (fill, zeros, ones, range, random_*): the node's, fully
/// defined since inference checked the shape attribute (math_rules::check_defined_shape).
shape generator_shape(const kernel_construction& c);

/// fused_elementwise's expression, parsed from the node's attributes; fails the construction
/// with the parser's message when it is malformed.
fused_expr fused_expr_of(const kernel_construction& c);

/// fused_elementwise's output shape: all the inputs broadcast. Fails the node when its
/// inputs and outputs do not match `expr`'s, or when the inputs do not broadcast.
shape fused_shape_of(const kernel_context& ctx, const fused_expr& expr);

}  // namespace loom::ew
