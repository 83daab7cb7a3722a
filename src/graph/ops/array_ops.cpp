// Array ops: reshape, transpose, concat, split, slice, gather, one_hot, squeeze,
// expand_dims, and pad, gather_grad, broadcast_to (the gradients of slice and gather, and
// the view that sums' gradients broadcast through). Definitions with their inference, and
// the builder functions of loom/graph/ops/array.hpp. Shapes and checks that inference and the
// kernels share are the op rules (loom/graph/ops/array_rules.hpp). Kernels:
// src/backends/cpu/array_kernels.cpp, array_index_kernels.cpp, array_grad_kernels.cpp;
// src/backends/cuda/array_kernels.cpp; the views squeeze, expand_dims and broadcast_to in
// src/kernel/common/neutral_kernels.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/array_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;
using ints = std::vector<std::int64_t>;

// Validators (attr_def::validate): throw loom::invalid_argument saying what is wrong.
void at_least_zero(const attr_value& v) {
  if (v.as<std::int64_t>() < 0) throw invalid_argument("must be >= 0");
}
void at_least_one(const attr_value& v) {
  if (v.as<std::int64_t>() < 1) throw invalid_argument("must be >= 1");
}
void dims_or_one_unknown(const attr_value& v) {
  int unknown = 0;
  for (auto d : v.as<ints>()) {
    if (d < -1) throw invalid_argument(fmt::format("dimension {} is below -1", d));
    unknown += d == -1 ? 1 : 0;
  }
  if (unknown > 1) throw invalid_argument("at most one dimension may be -1");
}
void is_permutation(const attr_value& v) {
  const auto perm = v.as<ints>();
  std::vector<bool> seen(perm.size(), false);
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(perm.size()) || seen[static_cast<std::size_t>(p)]) {
      throw invalid_argument(fmt::format("[{}] is not a permutation of 0..{}",
                                         fmt::join(perm, ", "), perm.size() - 1));
    }
    seen[static_cast<std::size_t>(p)] = true;
  }
}
void all_at_least(const attr_value& v, std::int64_t lo, const char* what) {
  for (auto d : v.as<ints>()) {
    if (d < lo) throw invalid_argument(fmt::format("{} {} is below {}", what, d, lo));
  }
}

attr_def validated(attr_def a, std::function<void(const attr_value&)> f) {
  a.validate = std::move(f);
  return a;
}

std::string shape_text(const tensor_type& t) {
  return to_string(t);
}

// The text callback of an op rule's message for input `t`: its type.
auto text_of(const tensor_type& t) {
  return [&t] { return to_string(t); };
}

// reshape: the target with its -1 resolved when the input's element count is known.
void infer_reshape(inference_context& c) {
  const auto& in = c.input(0);
  const ints target = c.attr<ints>("shape");
  shape out(target);
  if (!in.shape || !in.shape->is_fully_defined()) {
    c.set_output(0, in.type, out);
    return;
  }
  const std::int64_t n = in.shape->num_elements();
  const bool infers = std::find(target.begin(), target.end(), -1) != target.end();
  std::int64_t known = 1;
  for (auto d : target) known *= d == -1 ? 1 : d;
  if (infers && known == 0 && n == 0) {
    c.fail(fmt::format("cannot infer the -1 of [{}] for {}: the other dimensions hold 0 elements",
                       fmt::join(target, ", "), shape_text(in)));
  }
  out = array_rules::reshape_shape(target, n, text_of(in));
  c.set_output(0, in.type, out);
}

void infer_transpose(inference_context& c) {
  const auto& in = c.input(0);
  ints perm = c.attr<ints>("perm");
  if (!in.shape) {
    if (perm.empty()) return c.set_output(0, in.type, std::nullopt);
    return c.set_output(0, in.type, shape::filled(perm.size(), -1));
  }
  const std::size_t rank = in.shape->rank();
  perm = array_rules::transpose_perm(perm, rank, text_of(in));
  shape out = shape::filled(rank, 0);
  for (std::size_t i = 0; i < rank; ++i) out[i] = (*in.shape)[static_cast<std::size_t>(perm[i])];
  c.set_output(0, in.type, out);
}

void infer_concat(inference_context& c) {
  const auto axis = c.attr<std::int64_t>("axis");
  std::ptrdiff_t ref = -1;
  for (std::size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.input(i).shape) {
      ref = static_cast<std::ptrdiff_t>(i);
      break;
    }
  }
  const dtype t = c.num_inputs() > 0 ? c.input(0).type : dtype::f32;
  if (ref < 0) return c.set_output(0, t, std::nullopt);
  const shape& first = *c.input(static_cast<std::size_t>(ref)).shape;
  if (first.rank() == 0) {
    c.fail(fmt::format("cannot concatenate scalars (input {} is {})", ref,
                       shape_text(c.input(static_cast<std::size_t>(ref)))));
  }
  const std::size_t ax = first.normalize_axis(axis);
  shape out = first;
  out[ax] = 0;
  for (std::size_t i = 0; i < c.num_inputs(); ++i) {
    const auto& s = c.input(i).shape;
    if (!s) {
      out[ax] = -1;
      continue;
    }
    if (s->rank() != first.rank()) {
      c.fail(fmt::format("input {} has shape {} but input {} has {}: ranks differ", i,
                         to_string(*s), ref, to_string(first)));
    }
    for (std::size_t d = 0; d < s->rank(); ++d) {
      const auto have = (*s)[d];
      if (d == ax) {
        out[ax] = out[ax] < 0 || have < 0 ? -1 : out[ax] + have;
      } else if (have >= 0 && out[d] >= 0 && have != out[d]) {
        c.fail(
            fmt::format("input {} has shape {} but input {} has {}: dimension {} differs (concat "
                        "along axis {})",
                        i, to_string(*s), ref, to_string(first), d, ax));
      } else if (out[d] < 0) {
        out[d] = have;
      }
    }
  }
  c.set_output(0, t, out);
}

void infer_split(inference_context& c) {
  const auto& in = c.input(0);
  const auto n = c.attr<std::int64_t>("num_splits");
  const ints sizes = c.attr<ints>("sizes");
  if (!sizes.empty() && static_cast<std::int64_t>(sizes.size()) != n) {
    c.fail(fmt::format("sizes [{}] has {} entries but num_splits is {}", fmt::join(sizes, ", "),
                       sizes.size(), n));
  }
  if (!in.shape) return;
  const shape& s = *in.shape;
  if (s.rank() == 0) c.fail(fmt::format("cannot split a scalar ({})", shape_text(in)));
  const std::size_t ax = s.normalize_axis(c.attr<std::int64_t>("axis"));
  const std::int64_t dim = s[ax];
  std::vector<std::int64_t> pieces(static_cast<std::size_t>(n), -1);
  if (dim >= 0) {
    pieces = array_rules::split_sizes(dim, ax, n, sizes, text_of(in));
  } else if (!sizes.empty()) {
    pieces = sizes;
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    shape out = s;
    out[ax] = pieces[i];
    c.set_output(i, in.type, out);
  }
}

void infer_slice(inference_context& c) {
  const auto& in = c.input(0);
  const ints begin = c.attr<ints>("begin");
  const ints size = c.attr<ints>("size");
  if (begin.size() != size.size()) {
    c.fail(fmt::format("begin [{}] and size [{}] differ in length", fmt::join(begin, ", "),
                       fmt::join(size, ", ")));
  }
  if (!in.shape) {
    shape out(size);
    return c.set_output(0, in.type, out);
  }
  const shape& s = *in.shape;
  if (s.rank() != begin.size()) {
    c.fail(fmt::format("begin [{}] has {} entries for the rank-{} input {}", fmt::join(begin, ", "),
                       begin.size(), s.rank(), shape_text(in)));
  }
  c.set_output(0, in.type, array_rules::slice_shape(begin, size, s, text_of(in)));
}

void infer_gather(inference_context& c) {
  const auto& params = c.input(0);
  const auto& indices = c.input(1);
  if (!params.shape) return c.set_output(0, params.type, std::nullopt);
  if (params.shape->rank() == 0) {
    c.fail(fmt::format("params must have rank >= 1, got {}", shape_text(params)));
  }
  const std::size_t ax = params.shape->normalize_axis(c.attr<std::int64_t>("axis"));
  if (!indices.shape) return c.set_output(0, params.type, std::nullopt);
  shape out;
  for (std::size_t d = 0; d < ax; ++d) out.push_back((*params.shape)[d]);
  for (auto d : indices.shape->dims()) out.push_back(d);
  for (std::size_t d = ax + 1; d < params.shape->rank(); ++d) out.push_back((*params.shape)[d]);
  c.set_output(0, params.type, out);
}

void infer_one_hot(inference_context& c) {
  const auto& indices = c.input(0);
  const dtype t = c.attr<dtype>("dtype");
  if (!indices.shape) return c.set_output(0, t, std::nullopt);
  const auto g = array_rules::one_hot_shape(*indices.shape, c.attr<std::int64_t>("depth"),
                                            c.attr<std::int64_t>("axis"), text_of(indices));
  c.set_output(0, t, g.out);
}

void infer_squeeze(inference_context& c) {
  const auto& in = c.input(0);
  if (!in.shape) return c.set_output(0, in.type, std::nullopt);
  const shape& s = *in.shape;
  const ints axes = c.attr<ints>("axes");
  std::vector<bool> drop(s.rank(), false);
  if (axes.empty()) {
    for (std::size_t d = 0; d < s.rank(); ++d) {
      // An unknown dimension may or may not be 1: the rank is not known either.
      if (s[d] < 0) return c.set_output(0, in.type, std::nullopt);
      drop[d] = s[d] == 1;
    }
  }
  for (auto a : axes) {
    const std::size_t d = s.normalize_axis(a);
    if (s[d] >= 0 && s[d] != 1) {
      c.fail(fmt::format("cannot squeeze dimension {} of {}: its size is {}, not 1", d,
                         shape_text(in), s[d]));
    }
    drop[d] = true;
  }
  shape out;
  for (std::size_t d = 0; d < s.rank(); ++d) {
    if (!drop[d]) out.push_back(s[d]);
  }
  c.set_output(0, in.type, out);
}

void infer_expand_dims(inference_context& c) {
  const auto& in = c.input(0);
  if (!in.shape) return c.set_output(0, in.type, std::nullopt);
  const std::size_t at = array_rules::expand_dims_position(c.attr<std::int64_t>("axis"),
                                                           in.shape->rank(), text_of(in));
  shape out;
  for (std::size_t d = 0; d <= in.shape->rank(); ++d) {
    if (d == at) out.push_back(1);
    if (d < in.shape->rank()) out.push_back((*in.shape)[d]);
  }
  c.set_output(0, in.type, out);
}

void infer_pad(inference_context& c) {
  const auto& in = c.input(0);
  const ints p = c.attr<ints>("paddings");
  const std::size_t rank = p.size() / 2;
  if (!in.shape) return c.set_output(0, in.type, shape::filled(rank, -1));
  c.set_output(0, in.type, array_rules::pad_shape(*in.shape, p, text_of(in)));
}

// gather_grad(dy, indices): d_params of params_shape. dy has gather's output shape,
// params_shape[:axis] + indices.shape + params_shape[axis+1:]; unknown (-1) dimensions of
// params_shape other than the axis are taken from dy.
void infer_gather_grad(inference_context& c) {
  const auto& dy = c.input(0);
  const auto& indices = c.input(1);
  shape ps = c.attr<shape>("params_shape");
  const std::size_t ax = ps.normalize_axis(c.attr<std::int64_t>("axis"));
  if (dy.shape && indices.shape) {
    const shape& s = *dy.shape;
    const std::size_t k = indices.shape->rank();
    if (s.rank() != ps.rank() - 1 + k) {
      c.fail(
          fmt::format("dy {} must have rank {}: params_shape {} with axis {} replaced by the "
                      "indices' shape {}",
                      shape_text(dy), ps.rank() - 1 + k, to_string(ps), ax, shape_text(indices)));
    }
    // Position in dy of params dimension d (d != ax), and of indices dimension j.
    const auto dy_dim = [&](std::size_t d) { return d < ax ? d : d - 1 + k; };
    for (std::size_t d = 0; d < ps.rank(); ++d) {
      if (d == ax) continue;
      const std::int64_t have = s[dy_dim(d)];
      if (ps[d] < 0) {
        ps[d] = have;
      } else if (have >= 0 && have != ps[d]) {
        c.fail(
            fmt::format("dy {} does not match params_shape {} in dimension {} (gather along "
                        "axis {} with indices {})",
                        shape_text(dy), to_string(ps), dy_dim(d), ax, shape_text(indices)));
      }
    }
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t have = s[ax + j];
      const std::int64_t want = (*indices.shape)[j];
      if (have >= 0 && want >= 0 && have != want) {
        c.fail(
            fmt::format("dy {} does not match the indices {} in dimension {} (gather along "
                        "axis {} of params_shape {})",
                        shape_text(dy), shape_text(indices), ax + j, ax, to_string(ps)));
      }
    }
  }
  c.set_output(0, dy.type, ps);
}

void infer_broadcast_to(inference_context& c) {
  const auto& in = c.input(0);
  const shape target = c.attr<shape>("shape");
  if (in.shape) array_rules::check_broadcast(*in.shape, target, text_of(in));
  c.set_output(0, in.type, target);
}

op_def unary_def(std::string name, std::string summary) {
  op_def d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.inputs = {typed("input")};
  d.outputs = {typed("output")};
  d.attrs = {type_attr("T")};
  return d;
}

}  // namespace

// Defined in array_shape_ops.cpp: shape_of, dynamic_reshape, expand, constant_of_shape, tile,
// flip, strided_slice, cumsum and their gradient ops.
void register_array_shape_ops(op_registry& r);
// Defined in array_select_ops.cpp: topk, gather_elements, scatter_elements, gather_nd,
// scatter_nd.
void register_array_select_ops(op_registry& r);

void register_array_ops(op_registry& r) {
  register_array_shape_ops(r);
  register_array_select_ops(r);
  {
    op_def d = unary_def("reshape", "the same elements under another shape (a view when dense)");
    d.attrs.push_back(validated(attr("shape", attr_type::ints), dims_or_one_unknown));
    d.infer = infer_reshape;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("transpose", "dimensions permuted (a dense copy)");
    d.attrs.push_back(validated(attr("perm", attr_type::ints, ints{}), is_permutation));
    d.infer = infer_transpose;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "concat";
    d.summary = "tensors joined along an axis";
    d.inputs = {typed_list("values", "N")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), validated(attr("N", attr_type::integer), at_least_one),
               attr("axis", attr_type::integer, std::int64_t{0})};
    d.infer = infer_concat;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "split";
    d.summary = "a tensor cut along an axis into equal pieces, or pieces of given sizes";
    d.inputs = {typed("input")};
    d.outputs = {typed_list("output", "num_splits")};
    d.attrs = {type_attr("T"), validated(attr("num_splits", attr_type::integer), at_least_one),
               attr("axis", attr_type::integer, std::int64_t{0}),
               validated(attr("sizes", attr_type::ints, ints{}), dims_or_one_unknown)};
    // With sizes, the number of pieces is theirs: num_splits may be left out.
    d.derive_attrs = [](attr_map& a) {
      const auto sizes = a.find("sizes");
      if (a.contains("num_splits") || sizes == a.end()) return;
      if (sizes->second.type() != attr_type::ints) return;  // validation names it
      const auto n = sizes->second.as<ints>().size();
      if (n > 0) a.emplace("num_splits", static_cast<std::int64_t>(n));
    };
    d.infer = infer_split;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("slice", "a block of a tensor (a dense copy)");
    d.attrs.push_back(validated(attr("begin", attr_type::ints),
                                [](const attr_value& v) { all_at_least(v, 0, "begin"); }));
    d.attrs.push_back(validated(attr("size", attr_type::ints),
                                [](const attr_value& v) { all_at_least(v, -1, "size"); }));
    d.infer = infer_slice;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "gather";
    d.summary = "entries of params along an axis, picked by indices (NumPy take)";
    d.inputs = {typed("params"), typed("indices", "Tindices")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), type_attr("Tindices", {dtype::i32, dtype::i64}),
               attr("axis", attr_type::integer, std::int64_t{0}),
               attr("wrap_negative", attr_type::boolean, false)};
    d.infer = infer_gather;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "one_hot";
    d.summary = "one-hot encoding of integer indices";
    d.inputs = {typed("indices", "Tindices")};
    d.outputs = {typed("output", "dtype")};
    attr_def out_type = type_attr("dtype", all_types());
    out_type.default_value = attr_value(dtype::f32);
    d.attrs = {type_attr("Tindices", {dtype::i32, dtype::i64}),
               std::move(out_type),
               validated(attr("depth", attr_type::integer), at_least_zero),
               attr("on_value", attr_type::real, 1.0),
               attr("off_value", attr_type::real, 0.0),
               attr("axis", attr_type::integer, std::int64_t{-1})};
    d.infer = infer_one_hot;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("pad", "a tensor surrounded by a constant (the gradient of slice)");
    d.attrs.push_back(validated(attr("paddings", attr_type::ints), [](const attr_value& v) {
      const ints p = v.as<ints>();
      if (p.size() % 2 != 0) {
        throw invalid_argument(
            fmt::format("[{}] has {} entries: it needs 2 per dimension (before, after)",
                        fmt::join(p, ", "), p.size()));
      }
      all_at_least(v, 0, "padding");
    }));
    d.attrs.push_back(attr("constant_value", attr_type::real, 0.0));
    d.infer = infer_pad;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "gather_grad";
    d.summary = "dy's slices added at indices along an axis of zeros (the gradient of gather)";
    d.inputs = {typed("dy"), typed("indices", "Tindices")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", numeric_types()), type_attr("Tindices", {dtype::i32, dtype::i64}),
               attr("axis", attr_type::integer, std::int64_t{0}),
               validated(attr("params_shape", attr_type::shape), [](const attr_value& v) {
                 const shape s = v.as<shape>();
                 // Dimensions >= -1: graph::add_node's check_shape_attr.
                 if (s.rank() == 0) throw invalid_argument("params must have rank >= 1, got []");
               })};
    d.infer = infer_gather_grad;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("broadcast_to", "x broadcast to a shape, NumPy-style (a view)");
    d.attrs.push_back(validated(attr("shape", attr_type::shape),
                                [](const attr_value& v) { all_at_least(v, 0, "dimension"); }));
    d.infer = infer_broadcast_to;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("squeeze", "dimensions of size 1 removed (a view)");
    d.attrs.push_back(attr("axes", attr_type::ints, ints{}));
    d.infer = infer_squeeze;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d = unary_def("expand_dims", "a dimension of size 1 inserted (a view)");
    d.attrs.push_back(attr("axis", attr_type::integer));
    d.infer = infer_expand_dims;
    d.is_cheap = true;
    r.add(std::move(d));
  }
}

namespace ops {

output reshape(output x, const std::vector<std::int64_t>& shape, const node_options& o) {
  return x.builder().add1("reshape", {x}, {{"shape", shape}}, o);
}

output transpose(output x, const std::vector<std::int64_t>& perm, const node_options& o) {
  return x.builder().add1("transpose", {x}, {{"perm", perm}}, o);
}

output concat(const std::vector<output>& values, std::int64_t axis, const node_options& o) {
  if (values.empty()) {
    throw invalid_argument(fmt::format("concat{}: needs at least one input",
                                       o.name.empty() ? "" : " '" + o.name + "'"));
  }
  return values.front().builder().add1("concat", values, {{"axis", axis}}, o);
}

std::vector<output> split(output x, std::int64_t num_splits, std::int64_t axis,
                          const node_options& o) {
  return x.builder().add("split", {x}, {{"num_splits", num_splits}, {"axis", axis}}, o);
}

std::vector<output> split_sizes(output x, const std::vector<std::int64_t>& sizes, std::int64_t axis,
                                const node_options& o) {
  return x.builder().add(
      "split", {x},
      {{"num_splits", static_cast<std::int64_t>(sizes.size())}, {"sizes", sizes}, {"axis", axis}},
      o);
}

output slice(output x, const std::vector<std::int64_t>& begin,
             const std::vector<std::int64_t>& size, const node_options& o) {
  return x.builder().add1("slice", {x}, {{"begin", begin}, {"size", size}}, o);
}

output gather(output params, output indices, std::int64_t axis, const node_options& o) {
  return params.builder().add1("gather", {params, indices}, {{"axis", axis}}, o);
}

output gather(output params, output indices, std::int64_t axis, bool wrap_negative,
              const node_options& o) {
  return params.builder().add1("gather", {params, indices},
                               {{"axis", axis}, {"wrap_negative", wrap_negative}}, o);
}

output one_hot(output indices, std::int64_t depth, dtype t, double on, double off,
               std::int64_t axis, const node_options& o) {
  return indices.builder().add1(
      "one_hot", {indices},
      {{"depth", depth}, {"dtype", t}, {"on_value", on}, {"off_value", off}, {"axis", axis}}, o);
}

output squeeze(output x, const std::vector<std::int64_t>& axes, const node_options& o) {
  return x.builder().add1("squeeze", {x}, {{"axes", axes}}, o);
}

output expand_dims(output x, std::int64_t axis, const node_options& o) {
  return x.builder().add1("expand_dims", {x}, {{"axis", axis}}, o);
}

output pad(output x, const std::vector<std::int64_t>& paddings, double constant_value,
           const node_options& o) {
  return x.builder().add1("pad", {x}, {{"paddings", paddings}, {"constant_value", constant_value}},
                          o);
}

output gather_grad(output dy, output indices, shape params_shape, std::int64_t axis,
                   const node_options& o) {
  return dy.builder().add1("gather_grad", {dy, indices},
                           {{"params_shape", std::move(params_shape)}, {"axis", axis}}, o);
}

output broadcast_to(output x, shape s, const node_options& o) {
  return x.builder().add1("broadcast_to", {x}, {{"shape", std::move(s)}}, o);
}

}  // namespace ops
}  // namespace loom
