// matmul, bias_add, conv2d, max_pool2d, avg_pool2d: definitions, inference and builders.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/nn.hpp"
#include "nn_attrs.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

// ---- attribute validation ---------------------------------------------------------------

// A list of `lengths` (one of them) integers, each >= `min`.
std::function<void(const attr_value&)> int_list(std::vector<std::size_t> lengths,
                                                std::int64_t min) {
  return [lengths = std::move(lengths), min](const attr_value& v) {
    const auto list = v.as<std::vector<std::int64_t>>();
    if (std::find(lengths.begin(), lengths.end(), list.size()) == lengths.end()) {
      throw invalid_argument(
          fmt::format("expected {} values, got {}", fmt::join(lengths, " or "), list.size()));
    }
    for (const auto x : list) {
      if (x < min) throw invalid_argument(fmt::format("every value must be >= {}", min));
    }
  };
}

std::function<void(const attr_value&)> at_least(std::int64_t min) {
  return [min](const attr_value& v) {
    if (v.as<std::int64_t>() < min) throw invalid_argument(fmt::format("must be >= {}", min));
  };
}

attr_value ints(std::vector<std::int64_t> v) {
  return attr_value(std::move(v));
}

// ---- inference --------------------------------------------------------------------------

void infer_matmul(inference_context& c) {
  const tensor_type& a = c.input(0);
  const tensor_type& b = c.input(1);
  if (!a.shape || !b.shape) {
    c.set_output(0, a.type, std::nullopt);
    return;
  }
  const shape& sa = *a.shape;
  const shape& sb = *b.shape;
  if (sa.rank() < 2 || sb.rank() < 2) {
    c.fail(fmt::format("matmul needs inputs of rank >= 2, got a {} and b {}", to_string(sa),
                       to_string(sb)));
  }
  const bool ta = c.attr<bool>("transpose_a");
  const bool tb = c.attr<bool>("transpose_b");
  const std::size_t ra = sa.rank();
  const std::size_t rb = sb.rank();
  const std::int64_t m = ta ? sa[ra - 1] : sa[ra - 2];
  const std::int64_t ka = ta ? sa[ra - 2] : sa[ra - 1];
  const std::int64_t kb = tb ? sb[rb - 1] : sb[rb - 2];
  const std::int64_t n = tb ? sb[rb - 2] : sb[rb - 1];
  if (ka >= 0 && kb >= 0 && ka != kb) {
    c.fail(fmt::format("inner dimensions differ: a {}{} has K = {}, b {}{} has K = {}",
                       to_string(sa), ta ? " (transposed)" : "", ka, to_string(sb),
                       tb ? " (transposed)" : "", kb));
  }
  shape batch;
  try {
    batch = broadcast_shapes(shape(sa.dims().first(ra - 2)), shape(sb.dims().first(rb - 2)));
  } catch (const invalid_argument&) {
    c.fail(fmt::format("batch dimensions of a {} and b {} do not broadcast", to_string(sa),
                       to_string(sb)));
  }
  batch.push_back(m);
  batch.push_back(n);
  c.set_output(0, a.type, std::move(batch));
}

bool is_nchw(const std::string& format) {
  return format == "NCHW";
}

void infer_bias_add(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& bias = c.input(1);
  const std::string format = c.attr<std::string>("data_format");
  if (bias.shape && bias.shape->rank() != 1) {
    c.fail(fmt::format("bias must have rank 1, got {}", to_string(*bias.shape)));
  }
  if (x.shape) {
    const shape& s = *x.shape;
    if (s.rank() < 2) {
      c.fail(fmt::format("bias_add needs an input of rank >= 2, got {}", to_string(s)));
    }
    const std::int64_t channels = is_nchw(format) ? s[1] : s[s.rank() - 1];
    if (bias.shape && channels >= 0 && (*bias.shape)[0] >= 0 && channels != (*bias.shape)[0]) {
      c.fail(fmt::format("bias {} does not match the {} channels of input {} ({})",
                         to_string(*bias.shape), channels, to_string(s), format));
    }
  }
  c.set_output(0, x);
}

void infer_conv2d(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& w = c.input(1);
  if (x.shape && x.shape->rank() != 4) {
    c.fail(fmt::format("conv2d needs an NCHW input of rank 4, got {}", to_string(*x.shape)));
  }
  if (w.shape && w.shape->rank() != 4) {
    c.fail(fmt::format("conv2d needs an OIHW filter of rank 4, got {}", to_string(*w.shape)));
  }
  if (!x.shape || !w.shape) {
    // The output is NCHW whatever the ranks not known yet: N from x, channels from w.
    c.set_output(0, x.type,
                 shape{x.shape ? (*x.shape)[0] : -1, w.shape ? (*w.shape)[0] : -1, -1, -1});
    return;
  }
  const shape& sx = *x.shape;
  const shape& sw = *w.shape;
  const auto groups = c.attr<std::int64_t>("groups");
  const auto strides = c.attr<std::vector<std::int64_t>>("strides");
  const auto dilations = c.attr<std::vector<std::int64_t>>("dilations");
  const auto pad = nn_attrs::padding4(c.attr<std::vector<std::int64_t>>("padding"));
  const auto describe = [&] {
    return fmt::format("input {}, filter {}, groups {}", to_string(sx), to_string(sw), groups);
  };
  if (sx[1] >= 0 && sx[1] % groups != 0) {
    c.fail(fmt::format("input channels {} do not divide into {} groups ({})", sx[1], groups,
                       describe()));
  }
  if (sw[0] >= 0 && sw[0] % groups != 0) {
    c.fail(fmt::format("output channels {} do not divide into {} groups ({})", sw[0], groups,
                       describe()));
  }
  if (sx[1] >= 0 && sw[1] >= 0 && sw[1] * groups != sx[1]) {
    c.fail(
        fmt::format("the filter takes {} input channels per group but the input has {} "
                    "channels in {} groups ({})",
                    sw[1], sx[1], groups, describe()));
  }
  if (sw[2] == 0 || sw[3] == 0) c.fail(fmt::format("empty filter window ({})", describe()));
  shape out{sx[0], sw[0], -1, -1};
  for (std::size_t d = 0; d < 2; ++d) {
    const std::int64_t size = nn_attrs::window_out_size(sx[2 + d], sw[2 + d], strides[d],
                                                        dilations[d], pad[2 * d], pad[2 * d + 1]);
    if (size == -2) {
      c.fail(fmt::format("the filter (dilated) is larger than the padded input ({}, padding {})",
                         describe(), fmt::join(pad, ", ")));
    }
    out[2 + d] = size;
  }
  c.set_output(0, x.type, std::move(out));
}

void infer_pool(inference_context& c) {
  const tensor_type& x = c.input(0);
  if (!x.shape) {
    c.set_output(0, x.type, std::nullopt);
    return;
  }
  const shape& s = *x.shape;
  if (s.rank() != 4) {
    c.fail(fmt::format("{} needs an NCHW input of rank 4, got {}", c.def().name, to_string(s)));
  }
  const auto kernel = c.attr<std::vector<std::int64_t>>("kernel");
  auto strides = c.attr<std::vector<std::int64_t>>("strides");
  if (strides.empty()) strides = kernel;
  const auto pad = nn_attrs::padding4(c.attr<std::vector<std::int64_t>>("padding"));
  if (pad[0] >= kernel[0] || pad[1] >= kernel[0] || pad[2] >= kernel[1] || pad[3] >= kernel[1]) {
    c.fail(fmt::format("padding [{}] must be smaller than the window [{}]", fmt::join(pad, ", "),
                       fmt::join(kernel, ", ")));
  }
  if (s[2] == 0 || s[3] == 0) c.fail(fmt::format("pooling over an empty image {}", to_string(s)));
  shape out{s[0], s[1], -1, -1};
  for (std::size_t d = 0; d < 2; ++d) {
    const std::int64_t size =
        nn_attrs::window_out_size(s[2 + d], kernel[d], strides[d], 1, pad[2 * d], pad[2 * d + 1]);
    if (size == -2) {
      c.fail(fmt::format("the window [{}] is larger than the padded input {} (padding [{}])",
                         fmt::join(kernel, ", "), to_string(s), fmt::join(pad, ", ")));
    }
    out[2 + d] = size;
  }
  c.set_output(0, x.type, std::move(out));
}

}  // namespace

void register_nn_ops(op_registry& r) {
  {
    op_def d;
    d.name = "matmul";
    d.summary = "matrix product, batched over broadcast leading dimensions";
    d.inputs = {typed("a"), typed("b")};
    d.outputs = {typed("product")};
    d.attrs = {type_attr("T", float_types()), attr("transpose_a", attr_type::boolean, false),
               attr("transpose_b", attr_type::boolean, false)};
    d.infer = infer_matmul;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "bias_add";
    d.summary = "adds a bias along the channel dimension";
    d.inputs = {typed("input"), typed("bias")};
    d.outputs = {typed("output")};
    auto format = attr("data_format", attr_type::string, "NHWC");
    format.validate = [](const attr_value& v) {
      const auto s = v.as<std::string>();
      if (s != "NHWC" && s != "NCHW") throw invalid_argument("must be \"NHWC\" or \"NCHW\"");
    };
    d.attrs = {type_attr("T", numeric_types()), std::move(format)};
    d.infer = infer_bias_add;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "conv2d";
    d.summary = "2-D convolution, NCHW input, OIHW filter";
    d.inputs = {typed("input"), typed("filter")};
    d.outputs = {typed("output")};
    auto strides = attr("strides", attr_type::ints, ints({1, 1}));
    strides.validate = int_list({2}, 1);
    auto padding = attr("padding", attr_type::ints, ints({0, 0, 0, 0}));
    padding.validate = int_list({2, 4}, 0);
    auto dilations = attr("dilations", attr_type::ints, ints({1, 1}));
    dilations.validate = int_list({2}, 1);
    auto groups = attr("groups", attr_type::integer, std::int64_t{1});
    groups.validate = at_least(1);
    d.attrs = {type_attr("T", float_types()), std::move(strides), std::move(padding),
               std::move(dilations), std::move(groups)};
    d.infer = infer_conv2d;
    r.add(std::move(d));
  }
  for (const char* name : {"max_pool2d", "avg_pool2d"}) {
    op_def d;
    d.name = name;
    d.summary = std::string_view(name) == "max_pool2d" ? "maximum over 2-D windows, NCHW"
                                                       : "mean over 2-D windows, NCHW";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    auto kernel = attr("kernel", attr_type::ints);
    kernel.validate = int_list({2}, 1);
    auto strides = attr("strides", attr_type::ints, ints({}));
    strides.validate = int_list({0, 2}, 1);
    auto padding = attr("padding", attr_type::ints, ints({0, 0, 0, 0}));
    padding.validate = int_list({2, 4}, 0);
    d.attrs = {type_attr("T", float_types()), std::move(kernel), std::move(strides),
               std::move(padding)};
    if (std::string_view(name) == "avg_pool2d") {
      d.attrs.push_back(attr("count_include_pad", attr_type::boolean, false));
    }
    d.infer = infer_pool;
    r.add(std::move(d));
  }
}

namespace ops {

output matmul(output a, output b, bool transpose_a, bool transpose_b, const node_options& o) {
  return a.builder().add1("matmul", {a, b},
                          {{"transpose_a", transpose_a}, {"transpose_b", transpose_b}}, o);
}

output bias_add(output x, output bias, const std::string& data_format, const node_options& o) {
  return x.builder().add1("bias_add", {x, bias}, {{"data_format", data_format}}, o);
}

output conv2d(output x, output w, const conv2d_options& options, const node_options& o) {
  return x.builder().add1("conv2d", {x, w},
                          {{"strides", options.strides},
                           {"padding", options.padding},
                           {"dilations", options.dilations},
                           {"groups", options.groups}},
                          o);
}

namespace {
attr_map pool_attrs(const pool_options& options) {
  return {{"kernel", options.kernel}, {"strides", options.strides}, {"padding", options.padding}};
}
}  // namespace

output max_pool2d(output x, const pool_options& options, const node_options& o) {
  return x.builder().add1("max_pool2d", {x}, pool_attrs(options), o);
}

output avg_pool2d(output x, const pool_options& options, const node_options& o) {
  attr_map attrs = pool_attrs(options);
  attrs.emplace("count_include_pad", options.count_include_pad);
  return x.builder().add1("avg_pool2d", {x}, std::move(attrs), o);
}

}  // namespace ops
}  // namespace loom
