// Gradients of the array ops (array_ops.cpp): shape ops reshape the gradient back;
// transpose transposes it by the inverse permutation; concat and split exchange roles;
// slice pads its gradient with zeros; gather scatters it (gather_grad). dynamic_reshape
// reshapes back to shape_of(x) and expand sums back (expand_grad), both at run time; tile
// sums the repeats; flip flips back; strided_slice writes into zeros (strided_slice_grad);
// cumsum sums the other way; topk and the gathers add dy at their indices into zeros
// (scatter_elements, scatter_nd with "add"); the scatters ("none", "add") gather dy for the
// updates.
#include <fmt/format.h>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;
using ints = std::vector<std::int64_t>;

grads reshape_back(const gradient_context& c) {
  grads g(c.num_inputs());
  g[0] = ops::reshape(c.grad(0), c.input_shape(0).to_vector());
  return g;
}

grads transpose_grad(const gradient_context& c) {
  const std::size_t rank = c.input_shape(0).rank();
  ints perm = c.attr<ints>("perm");
  if (perm.empty()) {
    for (std::size_t d = rank; d-- > 0;) perm.push_back(static_cast<std::int64_t>(d));
  }
  ints inverse(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const std::size_t p = c.input_shape(0).normalize_axis(perm[d]);
    inverse[p] = static_cast<std::int64_t>(d);
  }
  return {ops::transpose(c.grad(0), inverse)};
}

grads concat_grad(const gradient_context& c) {
  const std::size_t n = c.num_inputs();
  const std::size_t axis = c.output_shape(0).normalize_axis(c.attr<std::int64_t>("axis"));
  ints sizes;
  for (std::size_t i = 0; i < n; ++i) sizes.push_back(c.input_shape(i)[axis]);
  const auto parts = ops::split_sizes(c.grad(0), sizes, static_cast<std::int64_t>(axis));
  return grads(parts.begin(), parts.end());
}

grads split_grad(const gradient_context& c) {
  // Outputs the loss does not read contribute zeros (c.grad makes them).
  std::vector<output> parts;
  for (std::size_t k = 0; k < c.forward().outputs.size(); ++k) parts.push_back(c.grad(k));
  const std::size_t axis = c.input_shape(0).normalize_axis(c.attr<std::int64_t>("axis"));
  return {ops::concat(parts, static_cast<std::int64_t>(axis))};
}

grads slice_grad(const gradient_context& c) {
  // The block goes back where it came from, zeros around it.
  const shape& in = c.input_shape(0);
  const shape& out = c.output_shape(0);
  const auto begin = c.attr<ints>("begin");
  ints paddings;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    const std::int64_t b = d < begin.size() ? begin[d] : 0;
    paddings.push_back(b);
    paddings.push_back(in[d] - b - out[d]);
  }
  return {c.builder().add1("pad", {c.grad(0)}, {{"paddings", paddings}})};
}

grads gather_grad(const gradient_context& c) {
  const auto axis = c.attr<std::int64_t>("axis");
  output indices = c.input(1);
  if (c.attr<bool>("wrap_negative")) {
    // gather_grad takes indices in [0, n): the negative ones wrapped first.
    const shape& ps = c.input_shape(0);
    const dtype it = c.input_type(1);
    const output n = ops::scalar(c.builder(), static_cast<double>(ps[ps.normalize_axis(axis)]), it);
    indices =
        ops::where(ops::less(indices, ops::scalar(c.builder(), 0.0, it)), indices + n, indices);
  }
  return {c.builder().add1("gather_grad", {c.grad(0), indices},
                           {{"axis", axis}, {"params_shape", c.input_shape(0)}}),
          std::nullopt};
}

grads pad_grad(const gradient_context& c) {
  const auto paddings = c.attr<ints>("paddings");
  const shape& in = c.input_shape(0);
  ints begin;
  ints size;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    begin.push_back(paddings.at(2 * d));
    size.push_back(in[d]);
  }
  return {ops::slice(c.grad(0), begin, size)};
}

// g, shaped at run time like input 0, given input 0's static shape when that is known (a
// gradient has its input's type).
output with_input_shape(const gradient_context& c, output g) {
  const auto& t = c.input(0).type();
  if (!t.shape || !t.shape->is_fully_defined()) return g;
  return ops::reshape(g, t.shape->to_vector());
}

grads tile_grad(const gradient_context& c) {
  // dy as [m0, d0, m1, d1, ...], summed over the repeats.
  const shape& in = c.input_shape(0);
  const auto multiples = c.attr<ints>("multiples");
  ints split;
  ints axes;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    axes.push_back(static_cast<std::int64_t>(split.size()));
    split.push_back(multiples.at(d));
    split.push_back(in[d]);
  }
  output g = ops::reshape(c.grad(0), split);
  if (!axes.empty()) g = ops::reduce_sum(g, axes, false);
  return {ops::reshape(g, in.to_vector())};
}

grads strided_slice_grad(const gradient_context& c) {
  return {ops::strided_slice_grad(c.grad(0), c.input_shape(0), c.attr<ints>("starts"),
                                  c.attr<ints>("ends"), c.attr<ints>("axes"),
                                  c.attr<ints>("steps"))};
}

grads strided_slice_grad_grad(const gradient_context& c) {
  return {ops::strided_slice(c.grad(0), c.attr<ints>("starts"), c.attr<ints>("ends"),
                             c.attr<ints>("axes"), c.attr<ints>("steps"))};
}

// topk: dy of the values added at their indices into zeros of x's shape.
grads topk_grad(const gradient_context& c) {
  const output zeros = ops::zeros(c.builder(), c.input_type(0), c.input_shape(0));
  return {
      ops::scatter_elements(zeros, c.output_of(1), c.grad(0), c.attr<std::int64_t>("axis"), "add")};
}

grads gather_elements_grad(const gradient_context& c) {
  const output zeros = ops::zeros(c.builder(), c.input_type(0), c.input_shape(0));
  return {ops::scatter_elements(zeros, c.input(1), c.grad(0), c.attr<std::int64_t>("axis"), "add"),
          std::nullopt};
}

grads gather_nd_grad(const gradient_context& c) {
  const output zeros = ops::zeros(c.builder(), c.input_type(0), c.input_shape(0));
  return {ops::scatter_nd(zeros, c.input(1), c.grad(0), "add", c.attr<std::int64_t>("batch_dims")),
          std::nullopt};
}

// The scatters: data takes dy ("add"), or dy with the written positions zeroed ("none": zeros
// scattered into dy); the updates take dy gathered at the indices. "mul" has no gradient.
// scatter(data, indices, updates, reduction) and gather(data, indices) are the op's pair.
template <class Scatter, class Gather>
grads scatter_grad(const gradient_context& c, const Scatter& scatter, const Gather& gather) {
  const auto reduction = c.attr<std::string>("reduction");
  if (reduction == "mul")
    c.fail(fmt::format("{} with reduction mul has no gradient", c.forward().op()));
  const output dy = c.grad(0);
  output d_data = dy;
  if (reduction == "none") {
    d_data = scatter(dy, c.input(1), ops::zeros(c.builder(), c.input_type(2), c.input_shape(2)));
  }
  return {d_data, std::nullopt, gather(dy, c.input(1))};
}

grads scatter_elements_grad(const gradient_context& c) {
  const auto axis = c.attr<std::int64_t>("axis");
  return scatter_grad(
      c, [&](output d, output i, output u) { return ops::scatter_elements(d, i, u, axis, "none"); },
      [&](output d, output i) { return ops::gather_elements(d, i, axis); });
}

grads scatter_nd_grad(const gradient_context& c) {
  const auto b = c.attr<std::int64_t>("batch_dims");
  return scatter_grad(
      c, [&](output d, output i, output u) { return ops::scatter_nd(d, i, u, "none", b); },
      [&](output d, output i) { return ops::gather_nd(d, i, b); });
}

grads cumsum_grad(const gradient_context& c) {
  return {ops::cumsum(c.grad(0), c.attr<std::int64_t>("axis"), c.attr<bool>("exclusive"),
                      !c.attr<bool>("reverse"))};
}

}  // namespace

void register_array_gradients(gradient_registry& r) {
  r.add("reshape", reshape_back);
  r.add("squeeze", reshape_back);
  r.add("expand_dims", reshape_back);
  r.add("transpose", transpose_grad);
  r.add("concat", concat_grad);
  r.add("split", split_grad);
  r.add("slice", slice_grad);
  r.add("gather", gather_grad);
  r.add("pad", pad_grad);
  r.add("broadcast_to", [](const gradient_context& c) -> grads {
    return {c.unbroadcast(c.grad(0), 0)};
  });
  r.add_none("one_hot");
  r.add_none("shape_of");
  r.add_none("constant_of_shape");
  // dynamic_slice: differentiable in principle, but its bounds are run-time values and no
  // backward op takes them yet; asking is an error (strided_slice, bounds known, has one).
  r.add("dynamic_slice", [](const gradient_context& c) -> grads {
    c.fail("dynamic_slice has no gradient (its bounds are run-time values; strided_slice has one)");
  });
  r.add("dynamic_reshape", [](const gradient_context& c) -> grads {
    return {with_input_shape(c, ops::dynamic_reshape(c.grad(0), ops::shape_of(c.input(0)))),
            std::nullopt};
  });
  r.add("expand", [](const gradient_context& c) -> grads {
    return {with_input_shape(c, ops::expand_grad(c.grad(0), ops::shape_of(c.input(0)))),
            std::nullopt};
  });
  r.add("expand_grad", [](const gradient_context& c) -> grads {
    return {with_input_shape(c, ops::expand(c.grad(0), ops::shape_of(c.input(0)))), std::nullopt};
  });
  r.add("tile", tile_grad);
  r.add("flip", [](const gradient_context& c) -> grads {
    return {ops::flip(c.grad(0), c.attr<ints>("axes"))};
  });
  r.add("strided_slice", strided_slice_grad);
  r.add("strided_slice_grad", strided_slice_grad_grad);
  r.add("cumsum", cumsum_grad);
  r.add("topk", topk_grad);
  r.add("gather_elements", gather_elements_grad);
  r.add("scatter_elements", scatter_elements_grad);
  r.add("gather_nd", gather_nd_grad);
  r.add("scatter_nd", scatter_nd_grad);
}

}  // namespace loom
