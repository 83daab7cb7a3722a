// Array ops over shapes known at run time: shape_of, dynamic_reshape, expand, expand_grad
// (expand's gradient) and constant_of_shape, whose int64 shape tensors live on the host (CPU
// kernels only: placement puts them on the CPU). Also the layout ops tile, flip,
// strided_slice, strided_slice_grad (its gradient) and cumsum. Definitions with their
// inference, and the builder functions of loom/graph/ops/array.hpp. Shapes and checks that
// inference and the kernels share are the op rules (loom/graph/ops/array_rules.hpp). Kernels:
// src/backends/cpu/array_shape_kernels.cpp; tile, flip and strided_slice also on CUDA
// (src/backends/cuda/array_kernels.cpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/array_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {

void register_array_shape_ops(op_registry& r);

namespace {

using namespace op_helpers;
using ints = std::vector<std::int64_t>;

auto text_of(const tensor_type& t) {
  return [&t] { return to_string(t); };
}

// The length of a 1-D int64 shape input (-1 when unknown); fails unless it is 1-D.
std::int64_t shape_input_length(inference_context& c, std::size_t i) {
  const auto& s = c.input(i);
  if (!s.shape) return -1;
  if (s.shape->rank() != 1) {
    c.fail(fmt::format("the shape input must be 1-D, got {}", to_string(s)));
  }
  return (*s.shape)[0];
}

// A shape of `rank` unknown dimensions, or an unknown rank.
std::optional<shape> unknown_dims(std::int64_t rank) {
  if (rank < 0) return std::nullopt;
  return shape::filled(static_cast<std::size_t>(rank), -1);
}

void infer_shape_of(inference_context& c) {
  const auto& in = c.input(0);
  const std::int64_t rank = in.shape ? static_cast<std::int64_t>(in.shape->rank()) : -1;
  c.set_output(0, dtype::i64, shape{rank});
}

void infer_dynamic_reshape(inference_context& c) {
  c.set_output(0, c.input(0).type, unknown_dims(shape_input_length(c, 1)));
}

void infer_expand(inference_context& c) {
  const auto& in = c.input(0);
  const std::int64_t n = shape_input_length(c, 1);
  if (!in.shape || n < 0) return c.set_output(0, in.type, std::nullopt);
  // The target's values are known at run time only; a dimension of x above 1 stays (the
  // target's must be 1 or the same), the others are unknown.
  const shape& s = *in.shape;
  shape out = shape::filled(std::max(s.rank(), static_cast<std::size_t>(n)), -1);
  const std::size_t lead = out.rank() - s.rank();
  for (std::size_t d = 0; d < s.rank(); ++d) {
    if (s[d] > 1) out[lead + d] = s[d];
  }
  c.set_output(0, in.type, out);
}

void infer_expand_grad(inference_context& c) {
  c.set_output(0, c.input(0).type, unknown_dims(shape_input_length(c, 1)));
}

void infer_constant_of_shape(inference_context& c) {
  c.set_output(0, c.attr<dtype>("dtype"), unknown_dims(shape_input_length(c, 0)));
}

void infer_tile(inference_context& c) {
  const auto& in = c.input(0);
  const ints m = c.attr<ints>("multiples");
  if (!in.shape) return c.set_output(0, in.type, shape::filled(m.size(), -1));
  c.set_output(0, in.type, array_rules::tile_shape(*in.shape, m, text_of(in)));
}

void infer_flip(inference_context& c) {
  const auto& in = c.input(0);
  if (in.shape) (void)array_rules::flip_dims(in.shape->rank(), c.attr<ints>("axes"), text_of(in));
  c.set_output(0, in.type, in.shape);
}

array_rules::strided_slice_geometry slice_of(inference_context& c, const shape& in,
                                             const tensor_type& t) {
  return array_rules::strided_slice_shape(in, c.attr<ints>("starts"), c.attr<ints>("ends"),
                                          c.attr<ints>("axes"), c.attr<ints>("steps"), text_of(t));
}

void infer_strided_slice(inference_context& c) {
  const auto& in = c.input(0);
  if (!in.shape) return c.set_output(0, in.type, std::nullopt);
  c.set_output(0, in.type, slice_of(c, *in.shape, in).out);
}

void infer_strided_slice_grad(inference_context& c) {
  const auto& dy = c.input(0);
  const shape xs = c.attr<shape>("input_shape");
  const auto g = slice_of(c, xs, tensor_type{dy.type, xs});
  bool fits = !dy.shape || dy.shape->rank() == g.out.rank();
  for (std::size_t d = 0; fits && dy.shape && d < g.out.rank(); ++d) {
    const std::int64_t have = (*dy.shape)[d];
    fits = have < 0 || g.out[d] < 0 || have == g.out[d];
  }
  if (!fits) {
    c.fail(fmt::format("dy {} is not strided_slice's output {} for an input of shape {}",
                       to_string(dy), to_string(g.out), to_string(xs)));
  }
  c.set_output(0, dy.type, xs);
}

void infer_cumsum(inference_context& c) {
  const auto& in = c.input(0);
  if (in.shape) {
    if (in.shape->rank() == 0) c.fail(fmt::format("cumsum needs rank >= 1, got {}", to_string(in)));
    (void)array_rules::wrap_axis(c.attr<std::int64_t>("axis"), in.shape->rank(), text_of(in));
  }
  c.set_output(0, in.type, in.shape);
}

op_def unary_def(std::string name, std::string summary, std::vector<dtype> types = {}) {
  op_def d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.inputs = {typed("input")};
  d.outputs = {typed("output")};
  d.attrs = {type_attr("T", std::move(types))};
  return d;
}

// strided_slice's (and its gradient's) starts, ends, axes and steps.
void add_slice_attrs(op_def& d) {
  d.attrs.push_back(attr("starts", attr_type::ints));
  d.attrs.push_back(attr("ends", attr_type::ints));
  d.attrs.push_back(attr("axes", attr_type::ints, ints{}));
  d.attrs.push_back(attr("steps", attr_type::ints, ints{}));
}

const std::vector<dtype>& cumsum_types() {
  static const std::vector<dtype> t{dtype::f32,  dtype::f64, dtype::f16,
                                    dtype::bf16, dtype::i32, dtype::i64};
  return t;
}

}  // namespace

void register_array_shape_ops(op_registry& r) {
  {
    op_def d = unary_def("shape_of", "the input's shape at run time, as int64");
    d.outputs = {fixed("output", dtype::i64)};
    d.infer = infer_shape_of;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("dynamic_reshape",
                         "the same elements under a shape given by a tensor (ONNX Reshape)");
    d.inputs.push_back(fixed("shape", dtype::i64));
    d.attrs.push_back(attr("allowzero", attr_type::boolean, false));
    d.infer = infer_dynamic_reshape;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("expand", "x broadcast with a shape tensor, both ways (ONNX Expand)");
    d.inputs.push_back(fixed("shape", dtype::i64));
    d.infer = infer_expand;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("expand_grad", "dy summed back to a shape (the gradient of expand)",
                         numeric_types());
    d.inputs.push_back(fixed("shape", dtype::i64));
    d.infer = infer_expand_grad;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "constant_of_shape";
    d.summary = "a tensor of a run-time shape filled with one value (ONNX ConstantOfShape)";
    d.inputs = {fixed("shape", dtype::i64)};
    d.outputs = {typed("output", "dtype")};
    attr_def out_type = type_attr("dtype", all_types());
    out_type.default_value = attr_value(dtype::f32);
    d.attrs = {std::move(out_type), attr("value", attr_type::real, 0.0)};
    d.infer = infer_constant_of_shape;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("tile", "x repeated along each dimension (numpy.tile)");
    d.attrs.push_back(attr("multiples", attr_type::ints));
    d.infer = infer_tile;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("flip", "x with the order of its entries reversed along axes");
    d.attrs.push_back(attr("axes", attr_type::ints, ints{}));
    d.infer = infer_flip;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("strided_slice", "every step-th entry of a range per axis (ONNX Slice)");
    add_slice_attrs(d);
    d.infer = infer_strided_slice;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("dynamic_slice", "strided_slice with starts and ends read at run time (ONNX Slice)");
    d.inputs.push_back(fixed("starts", dtype::i64));
    d.inputs.push_back(fixed("ends", dtype::i64));
    d.attrs.push_back(attr("axes", attr_type::ints, ints{}));
    d.attrs.push_back(attr("steps", attr_type::ints, ints{}));
    d.infer = [](inference_context& c) {
      // The rank stays; the sliced dimensions are known only at run time.
      const auto& in = c.input(0);
      if (!in.shape) return c.set_output(0, in.type, std::nullopt);
      shape out = *in.shape;
      const auto axes = c.attr<ints>("axes");
      const auto rank = static_cast<std::int64_t>(out.rank());
      for (std::size_t i = 0; i < (axes.empty() ? out.rank() : axes.size()); ++i) {
        const auto a = axes.empty() ? static_cast<std::int64_t>(i)
                                    : static_cast<std::int64_t>(array_rules::wrap_axis(axes[i], out.rank(), text_of(in)));
        if (a >= 0 && a < rank) out[static_cast<std::size_t>(a)] = -1;
      }
      c.set_output(0, in.type, out);
    };
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("strided_slice_grad",
                         "dy written where strided_slice read, zeros elsewhere (its gradient)",
                         numeric_types());
    d.inputs = {typed("dy")};
    add_slice_attrs(d);
    d.attrs.push_back(attr("input_shape", attr_type::shape));
    d.infer = infer_strided_slice_grad;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("cumsum", "running sums along an axis (ONNX CumSum)", cumsum_types());
    d.attrs.push_back(attr("axis", attr_type::integer, std::int64_t{0}));
    d.attrs.push_back(attr("exclusive", attr_type::boolean, false));
    d.attrs.push_back(attr("reverse", attr_type::boolean, false));
    d.infer = infer_cumsum;
    r.add(std::move(d));
  }
}

namespace ops {

output shape_of(output x, const node_options& o) {
  return x.builder().add1("shape_of", {x}, {}, o);
}

output dynamic_reshape(output x, output shape, bool allowzero, const node_options& o) {
  return x.builder().add1("dynamic_reshape", {x, shape}, {{"allowzero", allowzero}}, o);
}

output expand(output x, output shape, const node_options& o) {
  return x.builder().add1("expand", {x, shape}, {}, o);
}

output expand_grad(output dy, output shape, const node_options& o) {
  return dy.builder().add1("expand_grad", {dy, shape}, {}, o);
}

output constant_of_shape(output shape, dtype t, double value, const node_options& o) {
  return shape.builder().add1("constant_of_shape", {shape}, {{"dtype", t}, {"value", value}}, o);
}

output tile(output x, const std::vector<std::int64_t>& multiples, const node_options& o) {
  return x.builder().add1("tile", {x}, {{"multiples", multiples}}, o);
}

output flip(output x, const std::vector<std::int64_t>& axes, const node_options& o) {
  return x.builder().add1("flip", {x}, {{"axes", axes}}, o);
}

output strided_slice(output x, const std::vector<std::int64_t>& starts,
                     const std::vector<std::int64_t>& ends, const std::vector<std::int64_t>& axes,
                     const std::vector<std::int64_t>& steps, const node_options& o) {
  return x.builder().add1("strided_slice", {x},
                          {{"starts", starts}, {"ends", ends}, {"axes", axes}, {"steps", steps}},
                          o);
}

output dynamic_slice(output x, output starts, output ends, const std::vector<std::int64_t>& axes,
                     const std::vector<std::int64_t>& steps, const node_options& o) {
  return x.builder().add1("dynamic_slice", {x, starts, ends}, {{"axes", axes}, {"steps", steps}}, o);
}

output strided_slice_grad(output dy, shape input_shape, const std::vector<std::int64_t>& starts,
                          const std::vector<std::int64_t>& ends,
                          const std::vector<std::int64_t>& axes,
                          const std::vector<std::int64_t>& steps, const node_options& o) {
  return dy.builder().add1("strided_slice_grad", {dy},
                           {{"starts", starts},
                            {"ends", ends},
                            {"axes", axes},
                            {"steps", steps},
                            {"input_shape", std::move(input_shape)}},
                           o);
}

output cumsum(output x, std::int64_t axis, bool exclusive, bool reverse, const node_options& o) {
  return x.builder().add1("cumsum", {x},
                          {{"axis", axis}, {"exclusive", exclusive}, {"reverse", reverse}}, o);
}

}  // namespace ops
}  // namespace loom
