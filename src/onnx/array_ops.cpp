// ONNX's shape and data-movement ops as loom ops. Shape computations are followed at import
// (known_ints): where the values they produce are known, the consumers (Reshape, Slice,
// Expand...) become loom's static forms; elsewhere loom's run-time forms (shape_of,
// dynamic_reshape, expand) take them.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "importer.hpp"
#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "model_file.hpp"

namespace loom::onnx::detail {
namespace {

// The known dimensions of input i (-1 where unknown); fails when the rank is unknown.
std::vector<std::int64_t> dims_of(const node_context& c, std::size_t i) {
  (void)c.rank(i);  // fails when unknown
  const shape& s = *c.type(i).shape;
  return {s.begin(), s.end()};
}

// Axes from the attribute (before `input_opset`) or from input `input` (from it on).
std::vector<std::int64_t> axes_of(const node_context& c, std::int64_t input_opset, std::size_t input) {
  if (c.opset() >= input_opset) return c.has(input) ? c.ints(input, "axes") : std::vector<std::int64_t>{};
  return c.attr_ints("axes");
}

// ONNX Slice's start/end for one axis of size `dim` with `step`, clamped as the spec says.
std::pair<std::int64_t, std::int64_t> clamp_slice(std::int64_t start, std::int64_t end,
                                                  std::int64_t step, std::int64_t dim) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<std::int64_t>(start, 0, dim);
    end = std::clamp<std::int64_t>(end, 0, dim);
  } else {
    start = std::clamp<std::int64_t>(start, 0, dim - 1);
    end = std::clamp<std::int64_t>(end, -1, dim - 1);
  }
  return {start, end};
}

void shape_lowering(node_context& c) {
  const auto dims = dims_of(c, 0);
  const auto rank = static_cast<std::int64_t>(dims.size());
  std::int64_t start = c.attr_int("start", 0);
  std::int64_t end = c.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<std::int64_t>(start, 0, rank);
  end = std::clamp<std::int64_t>(end, start, rank);
  known_ints k;
  for (std::int64_t i = start; i < end; ++i) {
    const auto d = dims[static_cast<std::size_t>(i)];
    k.values.push_back(d >= 0 ? std::optional<std::int64_t>(d) : std::nullopt);
  }
  if (c.set_ints(0, k)) return;
  const bool whole = start == 0 && end == rank;
  const output s = c.b().add1("shape_of", {c.in(0)}, {}, whole ? c.opts() : c.aux("all"));
  c.set(0, whole ? s : ops::slice(s, {start}, {end - start}, c.opts()));
}

void gather_lowering(node_context& c) {
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  const std::int64_t axis = normalize_axis(c, c.attr_int("axis", 0), rank);
  const auto data = c.elements(0);
  const auto idx = c.elements(1);
  if (data && !data->scalar && idx && idx->all_known()) {
    // Picking known elements of a shape vector.
    const auto n = static_cast<std::int64_t>(data->values.size());
    known_ints r;
    r.scalar = idx->scalar;
    for (std::int64_t i : idx->get()) {
      if (i < -n || i >= n) c.fail(fmt::format("index {} is out of range for {} elements", i, n));
      r.values.push_back(data->values[static_cast<std::size_t>(i < 0 ? i + n : i)]);
    }
    if (c.set_ints(0, r, c.type(0).type)) return;
  }
  // ONNX's indices may be negative, counting from the end: gather's wrap_negative.
  c.set(0, ops::gather(c.in(0), c.in(1), axis, true, c.opts()));
}

void unsqueeze_lowering(node_context& c) {
  auto axes = axes_of(c, 13, 1);
  const auto out_rank = static_cast<std::int64_t>(c.rank(0) + axes.size());
  for (auto& a : axes) a = normalize_axis(c, a, out_rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) c.fail("axes repeat an axis");
  if (auto k = c.elements(0); k && k->scalar && axes.size() == 1) {
    k->scalar = false;
    if (c.set_ints(0, *k, c.type(0).type)) return;
  }
  output x = c.in(0);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    x = ops::expand_dims(x, axes[i], i + 1 == axes.size() ? c.opts() : c.aux(fmt::format("{}", i)));
  }
  if (axes.empty()) x = ops::identity(x, c.opts());
  c.set(0, x);
}

void squeeze_lowering(node_context& c) {
  auto axes = axes_of(c, 13, 1);
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  for (auto& a : axes) a = normalize_axis(c, a, rank);
  if (auto k = c.elements(0); k && !k->scalar && k->values.size() == 1 && rank == 1) {
    k->scalar = true;
    if (c.set_ints(0, *k, c.type(0).type)) return;
  }
  c.set(0, ops::squeeze(c.in(0), axes, c.opts()));
}

void concat_lowering(node_context& c) {
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  const std::int64_t axis = normalize_axis(c, c.attr_int("axis", 0), rank);
  std::vector<output> inputs;
  known_ints all;
  bool ints = rank == 1;
  for (std::size_t i = 0; i < c.num_inputs(); ++i) {
    inputs.push_back(c.in(i));
    auto k = c.elements(i);
    ints = ints && k && !k->scalar;
    if (ints) all.values.insert(all.values.end(), k->values.begin(), k->values.end());
  }
  if (ints && c.set_ints(0, all, c.type(0).type)) return;
  c.set(0, inputs.size() == 1 ? ops::identity(inputs[0], c.opts()) : ops::concat(inputs, axis, c.opts()));
}

void reshape_lowering(node_context& c) {
  const output x = c.in(0);
  const bool allowzero = c.attr_int("allowzero", 0) != 0;
  const auto target = c.elements(1);
  if (target && target->all_known() && x.type().shape) {
    auto dims = target->get();
    const shape& in = *x.type().shape;
    int unknown = 0;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == 0 && !allowzero) {
        if (i >= in.rank()) c.fail(fmt::format("shape {} copies dimension {} of a rank-{} input",
                                               fmt::join(dims, ", "), i, in.rank()));
        dims[i] = in[i];  // -1 when unknown
      }
      if (dims[i] < 0) ++unknown;
    }
    if (unknown <= 1) {
      c.set(0, ops::reshape(x, dims, c.opts()));
      return;
    }
  }
  c.set(0, c.b().add1("dynamic_reshape", {x, c.in(1)}, {{"allowzero", allowzero}}, c.opts()));
}

void flatten_lowering(node_context& c) {
  const auto dims = dims_of(c, 0);
  const auto rank = static_cast<std::int64_t>(dims.size());
  std::int64_t axis = c.attr_int("axis", 1);
  if (axis < -rank || axis > rank) c.fail(fmt::format("axis {} is out of range for rank {}", axis, rank));
  if (axis < 0) axis += rank;
  auto product = [&](std::int64_t from, std::int64_t to) -> std::int64_t {
    std::int64_t p = 1;
    for (std::int64_t i = from; i < to; ++i) {
      if (dims[static_cast<std::size_t>(i)] < 0) return -1;
      p *= dims[static_cast<std::size_t>(i)];
    }
    return p;
  };
  const std::int64_t outer = product(0, axis);
  const std::int64_t inner = product(axis, rank);
  if (outer < 0 && inner < 0) {
    c.unsupported("flattening needs the dimensions on one side of the axis known at import");
  }
  c.set(0, ops::reshape(c.in(0), {outer, inner}, c.opts()));
}

void slice_lowering(node_context& c) {
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  std::vector<std::int64_t> axes;
  std::vector<std::int64_t> steps;
  if (c.has(3)) axes = c.ints(3, "axes");
  if (c.has(4)) steps = c.ints(4, "steps");
  const auto known_starts = c.elements(1);
  const auto known_ends = c.elements(2);
  if (!(known_starts && known_starts->all_known() && known_ends && known_ends->all_known()) && !c.elements(0)) {
    // Bounds computed at run time (a split in half of a dimension inference does not
    // know): dynamic_slice reads them.
    auto as_i64 = [&](std::size_t i, std::string_view name) {
      const output v = c.in(i);
      return v.dtype_of() == dtype::i64 ? v : ops::cast(v, dtype::i64, c.aux(name));
    };
    for (auto& a : axes) a = normalize_axis(c, a, rank);
    c.set(0, ops::dynamic_slice(c.in(0), as_i64(1, "starts"), as_i64(2, "ends"), axes, steps, c.opts()));
    return;
  }
  const auto starts = c.ints(1, "starts");
  const auto ends = c.ints(2, "ends");
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    c.fail("starts, ends, axes and steps differ in length");
  }
  for (auto& a : axes) a = normalize_axis(c, a, rank);
  for (auto s : steps) {
    if (s == 0) c.fail("a step is 0");
  }
  // A known shape vector sliced.
  if (auto k = c.elements(0); k && !k->scalar) {
    const auto n = static_cast<std::int64_t>(k->values.size());
    auto [b, e] = clamp_slice(starts[0], ends[0], steps[0], n);
    known_ints r;
    for (std::int64_t i = b; steps[0] > 0 ? i < e : i > e; i += steps[0]) {
      r.values.push_back(k->values[static_cast<std::size_t>(i)]);
    }
    if (c.set_ints(0, r, c.type(0).type)) return;
  }
  // Unit steps over known dimensions: loom's slice.
  const auto dims = dims_of(c, 0);
  std::vector<std::int64_t> begin(static_cast<std::size_t>(rank), 0);
  std::vector<std::int64_t> size(static_cast<std::size_t>(rank), -1);
  bool plain = true;
  for (std::size_t j = 0; j < axes.size() && plain; ++j) {
    const auto a = static_cast<std::size_t>(axes[j]);
    if (steps[j] != 1 || dims[a] < 0) {
      plain = steps[j] == 1 && starts[j] >= 0 && ends[j] >= std::numeric_limits<std::int32_t>::max();
      begin[a] = starts[j];  // to the end of an unknown dimension
      continue;
    }
    auto [b, e] = clamp_slice(starts[j], ends[j], 1, dims[a]);
    begin[a] = b;
    size[a] = std::max<std::int64_t>(e - b, 0);
  }
  if (plain) {
    c.set(0, ops::slice(c.in(0), begin, size, c.opts()));
    return;
  }
  c.set(0, c.b().add1("strided_slice", {c.in(0)},
                      {{"starts", starts}, {"ends", ends}, {"axes", axes}, {"steps", steps}}, c.opts()));
}

void split_lowering(node_context& c) {
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  const std::int64_t axis = normalize_axis(c, c.attr_int("axis", 0), rank);
  std::vector<std::int64_t> sizes = c.opset() >= 13 ? (c.has(1) ? c.ints(1, "split") : std::vector<std::int64_t>{})
                                                      : c.attr_ints("split");
  std::vector<output> parts;
  const auto n = static_cast<std::int64_t>(c.num_outputs());
  if (sizes.empty()) {
    parts = n == 1 ? std::vector<output>{ops::identity(c.in(0), c.opts())} : ops::split(c.in(0), n, axis, c.opts());
  } else {
    if (static_cast<std::int64_t>(sizes.size()) != n) {
      c.fail(fmt::format("{} split sizes for {} outputs", sizes.size(), n));
    }
    parts = n == 1 ? std::vector<output>{ops::identity(c.in(0), c.opts())}
                   : ops::split_sizes(c.in(0), sizes, axis, c.opts());
  }
  for (std::size_t i = 0; i < parts.size(); ++i) c.set(i, parts[i]);
}

void expand_lowering(node_context& c) {
  const output x = c.in(0);
  const auto target = c.elements(1);
  if (target && target->all_known() && x.type().shape && x.type().shape->is_fully_defined()) {
    const auto t = target->get();
    const shape& s = *x.type().shape;
    const std::size_t rank = std::max(t.size(), s.rank());
    shape out = shape::filled(rank, 1);
    for (std::size_t i = 0; i < rank; ++i) {
      const std::int64_t a = i + s.rank() >= rank ? s[i + s.rank() - rank] : 1;
      const std::int64_t b = i + t.size() >= rank ? t[i + t.size() - rank] : 1;
      if (a != b && a != 1 && b != 1) {
        c.fail(fmt::format("input shape {} does not broadcast with [{}]", to_string(s), fmt::join(t, ", ")));
      }
      out[i] = a == 1 ? b : a;
    }
    c.set(0, ops::broadcast_to(x, out, c.opts()));
    return;
  }
  c.set(0, c.b().add1("expand", {x, c.in(1)}, {}, c.opts()));
}

void constant_of_shape_lowering(node_context& c) {
  dtype t = dtype::f32;
  double v = 0;
  if (const auto* a = c.attribute("value")) {
    const tensor value = tensor_of(a->t(), {});
    if (value.num_elements() != 1) c.fail("value must hold one element");
    t = value.type();
    const auto number = element_as_double(value, 0);
    if (!number) c.unsupported("a half-precision value");
    v = *number;
  }
  if (auto k = c.elements(0); k && k->all_known()) {
    c.set(0, ops::fill(c.b(), t, shape(k->get()), v, c.opts()));
    return;
  }
  c.set(0, c.b().add1("constant_of_shape", {c.in(0)}, {{"dtype", t}, {"value", v}}, c.opts()));
}

// Pads `x` along `axis` by copies of its edge (mode "edge") or by its mirror image without
// the edge (mode "reflect"), `before` and `after` elements.
output pad_mirror(const node_context& c, output x, std::int64_t axis, std::int64_t before, std::int64_t after,
                  bool reflect) {
  const shape& s = *x.type().shape;
  const std::int64_t n = s[static_cast<std::size_t>(axis)];
  if (n < 0) c.unsupported("mode edge / reflect needs the padded dimensions known at import");
  if (reflect ? (before >= n || after >= n) : n == 0) {
    c.fail(fmt::format("pads {} and {} do not fit a dimension of {} in mode {}", before, after, n,
                       reflect ? "reflect" : "edge"));
  }
  const std::size_t rank = s.rank();
  auto part = [&](std::int64_t from, std::int64_t count, std::string_view name) {
    std::vector<std::int64_t> begin(rank, 0);
    std::vector<std::int64_t> size(rank, -1);
    begin[static_cast<std::size_t>(axis)] = from;
    size[static_cast<std::size_t>(axis)] = count;
    return ops::slice(x, begin, size, c.aux(fmt::format("{}{}", name, axis)));
  };
  auto copies = [&](output edge, std::int64_t count, std::string_view name) {
    std::vector<std::int64_t> m(rank, 1);
    m[static_cast<std::size_t>(axis)] = count;
    return ops::tile(edge, m, c.aux(fmt::format("{}{}", name, axis)));
  };
  std::vector<output> pieces;
  if (before > 0) {
    pieces.push_back(reflect ? ops::flip(part(1, before, "left"), {axis}, c.aux(fmt::format("left_flip{}", axis)))
                             : copies(part(0, 1, "left_edge"), before, "left"));
  }
  pieces.push_back(x);
  if (after > 0) {
    pieces.push_back(reflect ? ops::flip(part(n - 1 - after, after, "right"), {axis},
                                         c.aux(fmt::format("right_flip{}", axis)))
                             : copies(part(n - 1, 1, "right_edge"), after, "right"));
  }
  return pieces.size() == 1 ? x : ops::concat(pieces, axis, c.aux(fmt::format("padded{}", axis)));
}

void pad_lowering(node_context& c) {
  const std::string mode = c.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") {
    c.fail(fmt::format("mode '{}' is not constant, reflect or edge", mode));
  }
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  const auto pads = c.ints(1, "pads");
  if (static_cast<std::int64_t>(pads.size()) != 2 * rank) {
    c.fail(fmt::format("{} pads for a rank-{} input (2 per dimension)", pads.size(), rank));
  }
  const double value = c.has(2) ? c.number(2, "constant_value") : 0.0;
  std::vector<std::int64_t> paddings;
  for (std::int64_t i = 0; i < rank; ++i) {
    const auto before = pads[static_cast<std::size_t>(i)];
    const auto after = pads[static_cast<std::size_t>(i + rank)];
    if (before < 0 || after < 0) c.unsupported("negative pads (cropping)");
    paddings.push_back(before);
    paddings.push_back(after);
  }
  if (mode == "constant") {
    c.set(0, ops::pad(c.in(0), paddings, value, c.opts()));
    return;
  }
  output x = c.in(0);
  for (std::int64_t i = 0; i < rank; ++i) {
    const auto before = paddings[static_cast<std::size_t>(2 * i)];
    const auto after = paddings[static_cast<std::size_t>(2 * i + 1)];
    if (before > 0 || after > 0) x = pad_mirror(c, x, i, before, after, mode == "reflect");
  }
  c.set(0, ops::identity(x, c.opts()));
}

// Bounds known at import: a range of known length; else dynamic_range reads them on each run.
void range_lowering(node_context& c) {
  const dtype t = c.type(0).type;
  const auto known = [&](std::size_t i) {
    const tensor* v = c.constant(i);
    return v != nullptr && v->num_elements() == 1 && element_as_double(*v, 0).has_value();
  };
  if (known(0) && known(1) && known(2)) {
    c.set(0, ops::range(c.b(), c.number(0, "start"), c.number(1, "limit"), c.number(2, "delta"), t,
                        c.opts()));
    return;
  }
  c.set(0, ops::dynamic_range(c.in(0), c.in(1), c.in(2), c.opts()));
}

// A constant [rows, cols] bool mask: true where keep(i, j).
template <class F>
tensor mask_of(std::int64_t rows, std::int64_t cols, F keep) {
  tensor m = memory::host_tensor(dtype::boolean, shape{rows, cols});
  auto* p = static_cast<std::uint8_t*>(m.raw_data());
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) p[i * cols + j] = keep(i, j) ? 1 : 0;
  }
  return m;
}

void one_hot_lowering(node_context& c) {
  const auto depth = static_cast<std::int64_t>(c.number(1, "depth"));
  const tensor* values = c.constant(2);
  if (values == nullptr) c.require_value(2, "values");
  if (values == nullptr || values->num_elements() != 2) c.unsupported("values must be two numbers known at import");
  const dtype t = values->type();
  if (t != dtype::f32 && t != dtype::f64 && t != dtype::i64 && t != dtype::i32) {
    c.unsupported(fmt::format("values of dtype {}", to_string(t)));
  }
  const double off = *element_as_double(*values, 0);
  const double on = *element_as_double(*values, 1);
  // Indices of any numeric type are read as int64; -depth..-1 count from the end.
  output idx = c.in(0);
  if (idx.dtype_of() != dtype::i64) idx = ops::cast(idx, dtype::i64, c.aux("indices"));
  const output negative = ops::less(idx, c.scalar(0, dtype::i64, "zero"), c.aux("negative"));
  idx = ops::where(negative, ops::add(idx, c.scalar(static_cast<double>(depth), dtype::i64, "depth"), c.aux("wrapped")),
                   idx, c.aux("index"));
  // ONNX's axis counts in the output (rank + 1 dimensions); loom's -1 is the last.
  std::int64_t axis = c.attr_int("axis", -1);
  if (axis < -1) axis = normalize_axis(c, axis, static_cast<std::int64_t>(c.rank(0)) + 1);
  c.set(0, ops::one_hot(idx, depth, t, on, off, axis, c.opts()));
}

void trilu_lowering(node_context& c) {
  const auto dims = dims_of(c, 0);
  if (dims.size() < 2) c.fail("input has rank below 2");
  const std::int64_t rows = dims[dims.size() - 2];
  const std::int64_t cols = dims[dims.size() - 1];
  if (rows < 0 || cols < 0) c.unsupported("Trilu needs the last two dimensions known at import");
  const std::int64_t k = c.has(1) ? static_cast<std::int64_t>(c.number(1, "k")) : 0;
  const bool upper = c.attr_int("upper", 1) != 0;
  const tensor mask = mask_of(rows, cols, [&](std::int64_t i, std::int64_t j) { return upper ? j - i >= k : j - i <= k; });
  c.set(0, ops::where(c.constant_node(mask, "mask"), c.in(0), c.scalar(0, c.type(0).type, "zero"), c.opts()));
}

void eye_like_lowering(node_context& c) {
  const auto dims = dims_of(c, 0);
  if (dims.size() != 2 || dims[0] < 0 || dims[1] < 0) c.unsupported("EyeLike needs a 2-D input of known shape");
  const dtype t = c.has_attr("dtype") ? dtype_of(static_cast<std::int32_t>(c.attr_int("dtype", 1)), "EyeLike's dtype")
                                      : c.type(0).type;
  const std::int64_t k = c.attr_int("k", 0);
  const tensor mask = mask_of(dims[0], dims[1], [&](std::int64_t i, std::int64_t j) { return j - i == k; });
  c.set(0, ops::cast(c.constant_node(mask, "mask"), t, c.opts()));
}

}  // namespace

void add_array_ops(op_table& t) {
  t["OneHot"] = {one_hot_lowering, {"one_hot"}};
  t["Trilu"] = {trilu_lowering, {"where"}};
  t["EyeLike"] = {eye_like_lowering, {"cast"}};
  t["Shape"] = {shape_lowering, {"shape_of"}};
  t["Size"] = {[](node_context& c) {
                 const auto dims = dims_of(c, 0);
                 known_ints k;
                 k.scalar = true;
                 std::int64_t n = 1;
                 bool known = true;
                 for (auto d : dims) {
                   known = known && d >= 0;
                   n *= d;
                 }
                 k.values.push_back(known ? std::optional<std::int64_t>(n) : std::nullopt);
                 if (c.set_ints(0, k)) return;
                 const output s = c.b().add1("shape_of", {c.in(0)}, {}, c.aux("shape"));
                 c.set(0, ops::reduce_prod(s, {}, false, c.opts()));
               },
               {"shape_of"}};
  t["Gather"] = {gather_lowering, {"gather"}};
  t["Unsqueeze"] = {unsqueeze_lowering, {"expand_dims"}};
  t["Squeeze"] = {squeeze_lowering, {"squeeze"}};
  t["Concat"] = {concat_lowering, {"concat"}};
  t["Reshape"] = {reshape_lowering, {"reshape"}};
  t["Flatten"] = {flatten_lowering, {"reshape"}};
  t["Transpose"] = {[](node_context& c) {
                      c.set(0, ops::transpose(c.in(0), c.attr_ints("perm"), c.opts()));
                    },
                    {"transpose"}};
  t["Slice"] = {slice_lowering, {"slice", "strided_slice", "dynamic_slice"}};
  t["Split"] = {split_lowering, {"split"}};
  t["Expand"] = {expand_lowering, {"broadcast_to"}};
  t["ConstantOfShape"] = {constant_of_shape_lowering, {"fill"}};
  t["Pad"] = {pad_lowering, {"pad"}};
  t["Range"] = {range_lowering, {"range", "dynamic_range"}};
  t["Tile"] = {[](node_context& c) {
                 c.set(0, c.b().add1("tile", {c.in(0)}, {{"multiples", c.ints(1, "repeats")}}, c.opts()));
               },
               {"tile"}};
  t["CumSum"] = {[](node_context& c) {
                   c.set(0, c.b().add1("cumsum", {c.in(0)},
                                       {{"axis", static_cast<std::int64_t>(c.number(1, "axis"))},
                                        {"exclusive", c.attr_int("exclusive", 0) != 0},
                                        {"reverse", c.attr_int("reverse", 0) != 0}},
                                       c.opts()));
                 },
                 {"cumsum"}};
  t["TopK"] = {[](node_context& c) {
                 const auto k = c.ints(1, "k");
                 if (k.size() != 1) c.fail("k must hold one value");
                 auto outs = c.b().add("topk", {c.in(0)},
                                       {{"k", k[0]},
                                        {"axis", c.attr_int("axis", -1)},
                                        {"largest", c.attr_int("largest", 1) != 0},
                                        {"sorted", c.attr_int("sorted", 1) != 0}},
                                       c.opts());
                 c.set(0, outs.at(0));
                 c.set(1, outs.at(1));
               },
               {"topk"}};
  t["Einsum"] = {[](node_context& c) {
                   std::vector<output> inputs;
                   for (std::size_t i = 0; i < c.num_inputs(); ++i) inputs.push_back(c.in(i));
                   c.set(0, ops::einsum(c.attr_string("equation", ""), inputs, c.opts()));
                 },
                 {"matmul", "reduce_sum", "transpose"}};
  t["GatherElements"] = {[](node_context& c) {
                           c.set(0, c.b().add1("gather_elements", {c.in(0), c.in(1)},
                                               {{"axis", c.attr_int("axis", 0)}}, c.opts()));
                         },
                         {"gather_elements"}};
  t["GatherND"] = {[](node_context& c) {
                     c.set(0, c.b().add1("gather_nd", {c.in(0), c.in(1)},
                                         {{"batch_dims", c.attr_int("batch_dims", 0)}}, c.opts()));
                   },
                   {"gather_nd"}};
  t["ScatterElements"] = {[](node_context& c) {
                            c.set(0, c.b().add1("scatter_elements", {c.in(0), c.in(1), c.in(2)},
                                                {{"axis", c.attr_int("axis", 0)},
                                                 {"reduction", c.attr_string("reduction", "none")}},
                                                c.opts()));
                          },
                          {"scatter_elements"}};
  t["ScatterND"] = {[](node_context& c) {
                      c.set(0, c.b().add1("scatter_nd", {c.in(0), c.in(1), c.in(2)},
                                          {{"reduction", c.attr_string("reduction", "none")}}, c.opts()));
                    },
                    {"scatter_nd"}};
}

}  // namespace loom::onnx::detail
