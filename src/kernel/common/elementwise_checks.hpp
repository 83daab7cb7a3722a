// Argument checks and outputs shared by every backend's element-wise kernels: the broadcast
// output shape (math_rules::broadcast_shape, failing the node), buffer forwarding, the
// generators' output shape, and fused_elementwise's expression and output shape. Each runs
// once per kernel construction or call, never per element.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/fused_expr.hpp"
#include "loom/graph/ops/math_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::ew {

/// The broadcast shape of `shapes` (math_rules::broadcast_shape); fails the node
/// (loom::node_error) when they do not broadcast, as fed placeholders with unknown
/// dimensions can at run time.
inline shape broadcast_shape_of(const kernel_context& ctx,
                                std::initializer_list<const shape*> shapes) {
  try {
    return math_rules::broadcast_shape(shapes);
  } catch (const invalid_argument& e) {
    ctx.fail("inputs do not broadcast: {}", e.what());
  }
}

/// Output 0 for an element-wise result of shape `s`: written in place into the first of
/// `candidates` (input indices) that has shape `s` and whose buffer the node alone holds
/// (kernel_context::forward_input), else a new tensor.
inline tensor& forward_or_allocate(kernel_context& ctx, const shape& s,
                                   std::initializer_list<std::size_t> candidates) {
  for (std::size_t i : candidates) {
    // The element-wise kernels need the same shape, not only the same element count.
    if (ctx.input(i).defined() && ctx.input(i).shape() == s) {
      if (tensor* out = ctx.forward_input(i, 0, s)) return *out;
    }
  }
  return ctx.allocate_output(0, s);
}

/// A generator's output shape (fill, zeros, ones, range, random_*): the node's, fully
/// defined since inference checked the shape attribute (math_rules::check_defined_shape).
inline shape generator_shape(const kernel_construction& c) {
  const auto& s = c.node().outputs.at(0).shape;
  if (!s || !s->is_fully_defined()) c.fail("the output shape must be fully defined");
  return *s;
}

/// fused_elementwise's expression, parsed from the node's attributes; fails the construction
/// with the parser's message when it is malformed.
inline fused_expr fused_expr_of(const kernel_construction& c) {
  try {
    return fused_expr::parse(c.attr<std::string>("expr"),
                             static_cast<std::int32_t>(c.attr<std::int64_t>("N")),
                             c.attr<std::vector<std::int64_t>>("results"));
  } catch (const invalid_argument& e) {
    c.fail(e.what());
  }
}

/// fused_elementwise's output shape: all the inputs broadcast. Fails the node when its
/// inputs and outputs do not match `expr`'s, or when the inputs do not broadcast.
inline shape fused_shape_of(const kernel_context& ctx, const fused_expr& expr) {
  const auto n_in = static_cast<std::size_t>(expr.num_inputs);
  const std::size_t n_out = expr.results.size();
  if (ctx.num_inputs() != n_in || ctx.num_outputs() != n_out) {
    ctx.fail("the node has {} inputs and {} outputs, its expression {} and {}", ctx.num_inputs(),
             ctx.num_outputs(), n_in, n_out);
  }
  std::vector<const shape*> shapes(n_in);
  for (std::size_t i = 0; i < n_in; ++i) shapes[i] = &ctx.input(i).shape();
  try {
    return math_rules::broadcast_shape(shapes);
  } catch (const invalid_argument& e) {
    std::vector<std::string> names;
    for (const shape* s : shapes) names.push_back(to_string(*s));
    ctx.fail("inputs of shapes {} do not broadcast: {}", fmt::join(names, ", "), e.what());
  }
}

}  // namespace loom::ew
