// Argument checks and outputs shared by every backend's element-wise kernels
// (elementwise_checks.hpp).
#include "kernel/common/elementwise_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "loom/graph/ops/math_rules.hpp"

namespace loom::ew {

shape broadcast_shape_of(const kernel_context& ctx, std::initializer_list<const shape*> shapes) {
  try {
    return math_rules::broadcast_shape(shapes);
  } catch (const invalid_argument& e) {
    ctx.fail("inputs do not broadcast: {}", e.what());
  }
}

tensor& forward_or_allocate(kernel_context& ctx, const shape& s,
                            std::initializer_list<std::size_t> candidates) {
  for (std::size_t i : candidates) {
    // The element-wise kernels need the same shape, not only the same element count.
    if (ctx.input(i).defined() && ctx.input(i).shape() == s) {
      if (tensor* out = ctx.forward_input(i, 0, s)) return *out;
    }
  }
  return ctx.allocate_output(0, s);
}

shape generator_shape(const kernel_construction& c) {
  const auto& s = c.node().outputs.at(0).shape;
  if (!s || !s->is_fully_defined()) c.fail("the output shape must be fully defined");
  return *s;
}

fused_expr fused_expr_of(const kernel_construction& c) {
  try {
    return fused_expr::parse(c.attr<std::string>("expr"),
                             static_cast<std::int32_t>(c.attr<std::int64_t>("N")),
                             c.attr<std::vector<std::int64_t>>("results"));
  } catch (const invalid_argument& e) {
    c.fail(e.what());
  }
}

shape fused_shape_of(const kernel_context& ctx, const fused_expr& expr) {
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

std::uint64_t element_bits(dtype t, double v) {
  std::uint64_t bits = 0;
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T e = from_double<T>(v);
    std::memcpy(&bits, &e, sizeof(T));
  });
  return bits;
}

}  // namespace loom::ew
