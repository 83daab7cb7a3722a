// Array ops that select or place entries by index or by value: topk, gather_elements,
// scatter_elements, gather_nd and scatter_nd (ONNX TopK, GatherElements, ScatterElements,
// GatherND, ScatterND). Definitions with their inference, and the builder functions of
// loom/graph/ops/array.hpp (with sort and stack, which are built from other ops). Shapes and
// checks that inference and the kernels share are the op rules
// (loom/graph/ops/array_rules.hpp). Kernels: src/backends/cpu/array_select_kernels.cpp;
// gather_elements and gather_nd also on CUDA (src/backends/cuda/array_kernels.cpp).
#include <fmt/format.h>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/array_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {

void register_array_select_ops(op_registry& r);

namespace {

using namespace op_helpers;

// The description of input i for the rules' messages.
auto texts_of(const inference_context& c) {
  return [&c](std::size_t i) { return to_string(c.input(i)); };
}

bool all_known(const inference_context& c) {
  for (std::size_t i = 0; i < c.num_inputs(); ++i) {
    const auto& s = c.input(i).shape;
    if (!s || !s->is_fully_defined()) return false;
  }
  return true;
}

// The scatters' "reduction": none, add or mul.
attr_def reduction_attr() {
  attr_def a = attr("reduction", attr_type::string, std::string("none"));
  a.validate = [](const attr_value& v) {
    const auto s = v.as<std::string>();
    if (s != "none" && s != "add" && s != "mul") {
      throw invalid_argument(fmt::format("'{}' is not one of none, add, mul", s));
    }
  };
  return a;
}

void infer_topk(inference_context& c) {
  const auto& in = c.input(0);
  if (!in.shape) {
    c.set_output(0, in.type, std::nullopt);
    c.set_output(1, dtype::i64, std::nullopt);
    return;
  }
  const auto g =
      array_rules::topk_shape(*in.shape, c.attr<std::int64_t>("k"), c.attr<std::int64_t>("axis"),
                              [&] { return to_string(in); });
  c.set_output(0, in.type, g.out);
  c.set_output(1, dtype::i64, g.out);
}

void infer_gather_elements(inference_context& c) {
  const auto& data = c.input(0);
  const auto& indices = c.input(1);
  if (data.shape && indices.shape) {
    (void)array_rules::elements_axis(*data.shape, *indices.shape, nullptr,
                                     c.attr<std::int64_t>("axis"), texts_of(c));
  }
  c.set_output(0, data.type, indices.shape);
}

void infer_scatter_elements(inference_context& c) {
  const auto& data = c.input(0);
  if (data.shape && c.input(1).shape && c.input(2).shape) {
    (void)array_rules::elements_axis(*data.shape, *c.input(1).shape, &*c.input(2).shape,
                                     c.attr<std::int64_t>("axis"), texts_of(c));
  }
  c.set_output(0, data.type, data.shape);
}

void infer_gather_nd(inference_context& c) {
  const auto& data = c.input(0);
  if (!all_known(c)) return c.set_output(0, data.type, std::nullopt);
  const auto g = array_rules::nd_shape(*data.shape, *c.input(1).shape,
                                       c.attr<std::int64_t>("batch_dims"), texts_of(c));
  c.set_output(0, data.type, g.out);
}

void infer_scatter_nd(inference_context& c) {
  const auto& data = c.input(0);
  if (all_known(c)) {
    const auto g = array_rules::nd_shape(*data.shape, *c.input(1).shape,
                                         c.attr<std::int64_t>("batch_dims"), texts_of(c));
    array_rules::check_scatter_nd_updates(g, *c.input(2).shape, texts_of(c));
  }
  c.set_output(0, data.type, data.shape);
}

attr_def index_types() {
  return type_attr("Tindices", {dtype::i32, dtype::i64});
}

}  // namespace

void register_array_select_ops(op_registry& r) {
  {
    op_def d;
    d.name = "topk";
    d.summary = "the k largest (or smallest) entries along an axis and their indices (ONNX TopK)";
    d.inputs = {typed("input")};
    d.outputs = {typed("values"), fixed("indices", dtype::i64)};
    d.attrs = {type_attr("T", numeric_types()), attr("k", attr_type::integer),
               attr("axis", attr_type::integer, std::int64_t{-1}),
               attr("largest", attr_type::boolean, true), attr("sorted", attr_type::boolean, true)};
    d.infer = infer_topk;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "gather_elements";
    d.summary =
        "data's entries at indices along an axis, position by position (ONNX GatherElements)";
    d.inputs = {typed("data"), typed("indices", "Tindices")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), index_types(), attr("axis", attr_type::integer, std::int64_t{0})};
    d.infer = infer_gather_elements;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "scatter_elements";
    d.summary =
        "data with updates written (or added, multiplied) at indices along an axis "
        "(ONNX ScatterElements)";
    d.inputs = {typed("data"), typed("indices", "Tindices"), typed("updates")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), index_types(), attr("axis", attr_type::integer, std::int64_t{0}),
               reduction_attr()};
    d.infer = infer_scatter_elements;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "gather_nd";
    d.summary = "slices of data picked by index tuples (ONNX GatherND)";
    d.inputs = {typed("data"), typed("indices", "Tindices")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), index_types(),
               attr("batch_dims", attr_type::integer, std::int64_t{0})};
    d.infer = infer_gather_nd;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "scatter_nd";
    d.summary = "data with slices written (or added, multiplied) at index tuples (ONNX ScatterND)";
    d.inputs = {typed("data"), typed("indices", "Tindices"), typed("updates")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), index_types(), reduction_attr(),
               attr("batch_dims", attr_type::integer, std::int64_t{0})};
    d.infer = infer_scatter_nd;
    r.add(std::move(d));
  }
}

namespace ops {

std::vector<output> topk(output x, std::int64_t k, std::int64_t axis, bool largest, bool sorted,
                         const node_options& o) {
  return x.builder().add("topk", {x},
                         {{"k", k}, {"axis", axis}, {"largest", largest}, {"sorted", sorted}}, o);
}

std::vector<output> sort(output x, std::int64_t axis, bool descending, const node_options& o) {
  const auto& s = x.type().shape;
  if (!s || s->rank() == 0) {
    throw invalid_argument(fmt::format("sort{}: x must have a known rank >= 1, got {}",
                                       o.name.empty() ? "" : " '" + o.name + "'",
                                       to_string(x.type())));
  }
  const std::size_t ax = s->normalize_axis(axis);
  if ((*s)[ax] < 0) {
    throw invalid_argument(fmt::format("sort{}: dimension {} of {} must be known",
                                       o.name.empty() ? "" : " '" + o.name + "'", ax,
                                       to_string(x.type())));
  }
  return topk(x, (*s)[ax], axis, descending, true, o);
}

output gather_elements(output data, output indices, std::int64_t axis, const node_options& o) {
  return data.builder().add1("gather_elements", {data, indices}, {{"axis", axis}}, o);
}

output scatter_elements(output data, output indices, output updates, std::int64_t axis,
                        const std::string& reduction, const node_options& o) {
  return data.builder().add1("scatter_elements", {data, indices, updates},
                             {{"axis", axis}, {"reduction", reduction}}, o);
}

output gather_nd(output data, output indices, std::int64_t batch_dims, const node_options& o) {
  return data.builder().add1("gather_nd", {data, indices}, {{"batch_dims", batch_dims}}, o);
}

output scatter_nd(output data, output indices, output updates, const std::string& reduction,
                  std::int64_t batch_dims, const node_options& o) {
  return data.builder().add1("scatter_nd", {data, indices, updates},
                             {{"reduction", reduction}, {"batch_dims", batch_dims}}, o);
}

output stack(const std::vector<output>& values, std::int64_t axis, const node_options& o) {
  if (values.empty()) {
    throw invalid_argument(fmt::format("stack{}: needs at least one input",
                                       o.name.empty() ? "" : " '" + o.name + "'"));
  }
  // The new axis counts in the output's rank, as expand_dims's and then concat's do.
  std::vector<output> parts;
  for (const output& v : values) parts.push_back(expand_dims(v, axis));
  return concat(parts, axis, o);
}

}  // namespace ops
}  // namespace loom
