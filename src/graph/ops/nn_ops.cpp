// matmul, bias_add, conv2d, conv_transpose2d, max_pool2d, max_pool2d_with_indices,
// avg_pool2d and the gradients conv2d_backprop_input, conv2d_backprop_filter,
// max_pool2d_grad, avg_pool2d_grad:
// definitions, inference and builders (resize: nn_resize_ops.cpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
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
  c.set_output(0, a.type,
               nn_rules::matmul_dims_of(*a.shape, *b.shape, c.attr<bool>("transpose_a"),
                                        c.attr<bool>("transpose_b"))
                   .out);
}

using nn_rules::is_nchw;

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
    const std::int64_t channels = s[nn_rules::channel_axis(s.rank(), is_nchw(format))];
    if (bias.shape && channels >= 0 && (*bias.shape)[0] >= 0 && channels != (*bias.shape)[0]) {
      c.fail(fmt::format("bias {} does not match the {} channels of input {} ({})",
                         to_string(*bias.shape), channels, to_string(s), format));
    }
  }
  c.set_output(0, x);
}

using nn_rules::conv_window;

// The window attributes conv2d and its gradients share.
conv_window read_conv_attrs(const inference_context& c) {
  return nn_rules::conv_window_of(
      c.attr<std::int64_t>("groups"), c.attr<std::vector<std::int64_t>>("strides"),
      c.attr<std::vector<std::int64_t>>("dilations"), c.attr<std::vector<std::int64_t>>("padding"));
}

// conv2d's output shape for an input `sx` and a filter `sw` of rank 4 (dimensions may be
// unknown, -1); fails when the channels do not fit the groups or the filter does not fit
// the padded input. `x_name` names sx in messages ("input", "input_shape").
shape conv_forward_shape(const inference_context& c, const shape& sx, const shape& sw,
                         const conv_window& a, std::string_view x_name) {
  const std::int64_t groups = a.groups;
  const auto describe = [&] {
    return fmt::format("{} {}, filter {}, groups {}", x_name, to_string(sx), to_string(sw), groups);
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
  const nn_rules::conv_geometry g = nn_rules::conv2d_geometry(sx, sw, a);
  if (!g.window_fits()) {
    c.fail(fmt::format("the filter (dilated) is larger than the padded input ({}, padding {})",
                       describe(), fmt::join(a.pad, ", ")));
  }
  return g.output_shape();
}

void infer_conv2d(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& w = c.input(1);
  const std::string format = c.attr<std::string>("data_format");
  if (w.shape && w.shape->rank() != 4) {
    c.fail(fmt::format("conv2d needs an OIHW filter of rank 4, got {}", to_string(*w.shape)));
  }
  shape view;
  if (x.shape) {
    try {
      view = nn_rules::conv_input_view(*x.shape, w.shape ? *w.shape : shape{-1, -1, -1, -1},
                                       c.attr<std::int64_t>("groups"), format);
    } catch (const invalid_argument& e) {
      c.fail(e.what());
    }
  }
  if (!x.shape || !w.shape) {
    // The rank the format has whatever is not known yet: N from x, channels from w.
    const shape out{x.shape ? (*x.shape)[0] : -1, w.shape ? (*w.shape)[0] : -1, -1, -1};
    c.set_output(0, x.type, nn_rules::conv_output_in(out, format));
    return;
  }
  const bool as_is = x.shape->rank() == 4 && format != "NHWC";
  const std::string x_name =
      as_is ? "input" : fmt::format("input (the NCHW view of the {} {})", format, to_string(*x.shape));
  const shape out = conv_forward_shape(c, view, *w.shape, read_conv_attrs(c), x_name);
  c.set_output(0, x.type, nn_rules::conv_output_in(out, format));
}

// to_channel_blocks(x): [n, c, h, w] (or NHWC [n, h, w, c]) -> [n, ceil(c / 16), h, w, 16]
// (Note [channel blocks]).
void infer_to_channel_blocks(inference_context& c) {
  const tensor_type& x = c.input(0);
  const bool nhwc = c.attr<std::string>("data_format") == "NHWC";
  if (x.shape && x.shape->rank() != 4) {
    c.fail(fmt::format("to_channel_blocks needs an {} input of rank 4, got {}", nhwc ? "NHWC" : "NCHW",
                       to_string(*x.shape)));
  }
  const shape s = x.shape ? *x.shape : shape{-1, -1, -1, -1};
  c.set_output(0, x.type, nn_rules::blocked_shape(nhwc ? shape{s[0], s[3], s[1], s[2]} : s));
}

// from_channel_blocks(x, channels): [n, blocks, h, w, 16] -> [n, channels, h, w] (or NHWC).
void infer_from_channel_blocks(inference_context& c) {
  const tensor_type& x = c.input(0);
  const auto channels = c.attr<std::int64_t>("channels");
  const bool nhwc = c.attr<std::string>("data_format") == "NHWC";
  if (x.shape) {
    const shape& s = *x.shape;
    if (s.rank() != 5 || (s[4] >= 0 && s[4] != nn_rules::channel_block)) {
      c.fail(fmt::format("from_channel_blocks needs an NCHW16c input [n, blocks, h, w, 16], got {}",
                         to_string(s)));
    }
    if (s[1] >= 0 && s[1] != nn_rules::channel_blocks(channels)) {
      c.fail(fmt::format("{} channels take {} blocks, but the input {} has {}", channels,
                         nn_rules::channel_blocks(channels), to_string(s), s[1]));
    }
  }
  const shape s = x.shape ? *x.shape : shape{-1, -1, -1, -1, nn_rules::channel_block};
  c.set_output(0, x.type, nhwc ? shape{s[0], s[2], s[3], channels} : shape{s[0], channels, s[2], s[3]});
}

// conv_transpose2d(input, filter): the rule's shape (nn_rules::conv_transpose2d_output).
void infer_conv_transpose2d(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& w = c.input(1);
  const auto op = c.attr<std::vector<std::int64_t>>("output_padding");
  const shape sx = x.shape ? *x.shape : shape{-1, -1, -1, -1};
  const shape sw = w.shape ? *w.shape : shape{-1, -1, -1, -1};
  c.set_output(0, x.type,
               nn_rules::conv_transpose2d_output(sx, sw, read_conv_attrs(c), {op.at(0), op.at(1)}));
}

// Fails unless `dy` (the gradient fed to a backward op) has the forward output's shape
// `expected` wherever both are known. `from` says what `expected` was computed from.
void check_dy(const inference_context& c, const tensor_type& dy, const shape& expected,
              const std::string& from) {
  if (!dy.shape) return;
  const shape& s = *dy.shape;
  if (s.rank() != expected.rank()) {
    c.fail(fmt::format("dy {} must have rank {}, as the forward output {} of {}", to_string(s),
                       expected.rank(), to_string(expected), from));
  }
  for (std::size_t d = 0; d < s.rank(); ++d) {
    if (s[d] >= 0 && expected[d] >= 0 && s[d] != expected[d]) {
      c.fail(fmt::format("dy {} does not match the forward output {} of {} (dimension {})",
                         to_string(s), to_string(expected), from, d));
    }
  }
}

// A tensor of rank 4 named `what` (for messages), or fail.
void require_rank4(const inference_context& c, const tensor_type& t, std::string_view what) {
  if (t.shape && t.shape->rank() != 4) {
    c.fail(fmt::format("{} needs {} of rank 4, got {}", c.def().name, what, to_string(*t.shape)));
  }
}

// conv2d_backprop_input(dy, filter): dx of input_shape, whose unknown N and C are taken
// from dy and the filter.
void infer_conv2d_backprop_input(inference_context& c) {
  const tensor_type& dy = c.input(0);
  const tensor_type& w = c.input(1);
  require_rank4(c, dy, "an NCHW dy");
  require_rank4(c, w, "an OIHW filter");
  const conv_window a = read_conv_attrs(c);
  shape in = c.attr<shape>("input_shape");
  if (in[0] < 0 && dy.shape) in[0] = (*dy.shape)[0];
  if (in[1] < 0 && w.shape && (*w.shape)[1] >= 0) in[1] = (*w.shape)[1] * a.groups;
  if (w.shape) {
    const shape expected = conv_forward_shape(c, in, *w.shape, a, "input_shape");
    check_dy(c, dy, expected,
             fmt::format("input_shape {} and filter {}", to_string(in), to_string(*w.shape)));
  } else if (dy.shape && (*dy.shape)[0] >= 0 && in[0] >= 0 && (*dy.shape)[0] != in[0]) {
    c.fail(fmt::format("dy {} and input_shape {} differ in the batch dimension",
                       to_string(*dy.shape), to_string(in)));
  }
  c.set_output(0, dy.type, std::move(in));
}

// conv2d_backprop_filter(input, dy): dw of filter_shape, whose unknown O and C / groups are
// taken from dy and the input.
void infer_conv2d_backprop_filter(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& dy = c.input(1);
  require_rank4(c, x, "an NCHW input");
  require_rank4(c, dy, "an NCHW dy");
  const conv_window a = read_conv_attrs(c);
  shape fs = c.attr<shape>("filter_shape");
  if (fs[0] < 0 && dy.shape) fs[0] = (*dy.shape)[1];
  if (fs[1] < 0 && x.shape && (*x.shape)[1] >= 0 && (*x.shape)[1] % a.groups == 0) {
    fs[1] = (*x.shape)[1] / a.groups;
  }
  if (x.shape) {
    const shape expected = conv_forward_shape(c, *x.shape, fs, a, "input");
    check_dy(c, dy, expected,
             fmt::format("input {} and filter_shape {}", to_string(*x.shape), to_string(fs)));
  } else if (dy.shape && (*dy.shape)[1] >= 0 && fs[0] >= 0 && (*dy.shape)[1] != fs[0]) {
    c.fail(fmt::format("dy {} has {} channels but filter_shape {} has {} filters",
                       to_string(*dy.shape), (*dy.shape)[1], to_string(fs), fs[0]));
  }
  c.set_output(0, x.type, std::move(fs));
}

// The pooling ops' output shape for an input `s` of rank 4 (dimensions may be unknown);
// fails for padding not smaller than the window, an empty image, or a window larger than
// the padded input.
shape pool_forward_shape(const inference_context& c, const shape& s) {
  const nn_rules::pool_window win = nn_rules::pool_window_of(
      c.attr<std::vector<std::int64_t>>("kernel"), c.attr<std::vector<std::int64_t>>("strides"),
      c.attr<std::vector<std::int64_t>>("padding"), c.attr<bool>("ceil_mode"),
      c.attr<std::vector<std::int64_t>>("dilations"));
  if (c.def().name.starts_with("avg_pool2d") &&
      (win.dilation[0] != 1 || win.dilation[1] != 1)) {
    c.fail("avg_pool2d takes dilations of 1 only");
  }
  if (win.ceil_mode && c.def().name.starts_with("avg_pool2d") &&
      c.attr<bool>("count_include_pad")) {
    c.fail("ceil_mode with count_include_pad is not supported (the rounded-up windows would "
           "count padding past the input's own)");
  }
  const auto& kernel = win.kernel;
  const auto& pad = win.pad;
  if (pad[0] >= kernel[0] || pad[1] >= kernel[0] || pad[2] >= kernel[1] || pad[3] >= kernel[1]) {
    c.fail(fmt::format("padding [{}] must be smaller than the window [{}]", fmt::join(pad, ", "),
                       fmt::join(kernel, ", ")));
  }
  if (s[2] == 0 || s[3] == 0) c.fail(fmt::format("pooling over an empty image {}", to_string(s)));
  const nn_rules::pool_geometry g = nn_rules::pool2d_geometry(s, win);
  if (!g.window_fits()) {
    c.fail(fmt::format("the window [{}] is larger than the padded input {} (padding [{}])",
                       fmt::join(kernel, ", "), to_string(s), fmt::join(pad, ", ")));
  }
  return g.output_shape();
}

void infer_pool(inference_context& c) {
  const tensor_type& x = c.input(0);
  if (!x.shape) {
    c.set_output(0, x.type, std::nullopt);
    return;
  }
  // max_pool2d and avg_pool2d under "NCHW16c" (Note [channel blocks]): [n, blocks, h, w, 16]
  // in and out, each block's channels pooled as an NCHW tensor of blocks x 16 channels.
  const bool blocked = c.def().name != "max_pool2d_with_indices" &&
                       nn_rules::is_channel_blocked(c.attr<std::string>("data_format"));
  shape view;
  try {
    view = nn_rules::pool_input_view(*x.shape, blocked);
  } catch (const invalid_argument& e) {
    c.fail(fmt::format("{}: {}", c.def().name, e.what()));
  }
  const shape out = pool_forward_shape(c, view);
  c.set_output(0, x.type, blocked ? nn_rules::blocked_shape(out) : out);
}

// max_pool2d_with_indices: the values as max_pool2d, the indices (int64) of the same shape.
void infer_max_pool2d_with_indices(inference_context& c) {
  infer_pool(c);
  c.set_output(1, dtype::i64, c.outputs()[0].shape);
}

// max_pool2d_grad(input, dy): dx shaped as the input.
void infer_max_pool2d_grad(inference_context& c) {
  const tensor_type& x = c.input(0);
  const tensor_type& dy = c.input(1);
  require_rank4(c, x, "an NCHW input");
  require_rank4(c, dy, "an NCHW dy");
  if (x.shape) {
    check_dy(c, dy, pool_forward_shape(c, *x.shape),
             fmt::format("max_pool2d over input {}", to_string(*x.shape)));
  }
  c.set_output(0, x);
}

// avg_pool2d_grad(dy): dx of input_shape, whose unknown N and C are taken from dy.
void infer_avg_pool2d_grad(inference_context& c) {
  const tensor_type& dy = c.input(0);
  require_rank4(c, dy, "an NCHW dy");
  shape in = c.attr<shape>("input_shape");
  if (dy.shape) {
    if (in[0] < 0) in[0] = (*dy.shape)[0];
    if (in[1] < 0) in[1] = (*dy.shape)[1];
  }
  check_dy(c, dy, pool_forward_shape(c, in),
           fmt::format("avg_pool2d over input_shape {}", to_string(in)));
  c.set_output(0, dy.type, std::move(in));
}

// A shape attribute of rank 4 whose dimensions are >= 0, or -1 where the op can take them
// from its inputs (its doc comment says which).
attr_def shape4_attr(std::string name) {
  attr_def a = attr(std::move(name), attr_type::shape);
  a.validate = [](const attr_value& v) {
    const shape s = v.as<shape>();
    if (s.rank() != 4) {
      throw invalid_argument(fmt::format("expected a shape of rank 4, got {}", to_string(s)));
    }
    // Dimensions >= -1: graph::add_node's check_shape_attr.
  };
  return a;
}

}  // namespace

void register_nn_fused_ops(op_registry& r);  // fused_matmul, fused_conv2d (nn_fused_ops.cpp)
void register_nn_resize_ops(op_registry& r);  // resize (nn_resize_ops.cpp)

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
    d.attrs = {type_attr("T", numeric_types()), data_format_attr("NHWC")};
    d.infer = infer_bias_add;
    r.add(std::move(d));
  }
  // conv2d and its gradients: the type attribute and the window attributes.
  const auto conv_attr_defs = [] {
    auto strides = attr("strides", attr_type::ints, ints({1, 1}));
    strides.validate = int_list({2}, 1);
    auto padding = attr("padding", attr_type::ints, ints({0, 0, 0, 0}));
    padding.validate = int_list({2, 4}, 0);
    auto dilations = attr("dilations", attr_type::ints, ints({1, 1}));
    dilations.validate = int_list({2}, 1);
    auto groups = attr("groups", attr_type::integer, std::int64_t{1});
    groups.validate = at_least(1);
    return std::vector<attr_def>{type_attr("T", float_types()), std::move(strides),
                                 std::move(padding), std::move(dilations), std::move(groups)};
  };
  {
    op_def d;
    d.name = "conv2d";
    d.summary = "2-D convolution, NCHW (or NHWC) input, OIHW filter";
    d.inputs = {typed("input"), typed("filter")};
    d.outputs = {typed("output")};
    d.attrs = conv_attr_defs();
    auto format = attr("data_format", attr_type::string, std::string("NCHW"));
    format.validate = [](const attr_value& v) {
      const auto f = v.as<std::string>();
      if (f != "NHWC" && f != "NCHW" && f != "NCHW16c") {
        throw invalid_argument("must be \"NCHW\", \"NHWC\" or \"NCHW16c\"");
      }
    };
    d.attrs.push_back(std::move(format));
    d.infer = infer_conv2d;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "to_channel_blocks";
    d.summary = "NCHW (or NHWC) -> NCHW16c: channels in zero-padded blocks of 16 (Note [channel blocks])";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", float_types()), data_format_attr("NCHW")};
    d.infer = infer_to_channel_blocks;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "from_channel_blocks";
    d.summary = "NCHW16c -> NCHW (or NHWC): the first `channels` channels of the blocks";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    auto channels = attr("channels", attr_type::integer, std::int64_t{0});
    channels.validate = at_least(0);
    d.attrs = {type_attr("T", float_types()), std::move(channels), data_format_attr("NCHW")};
    d.infer = infer_from_channel_blocks;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "conv2d_backprop_input";
    d.summary = "the gradient of conv2d with respect to its input";
    d.inputs = {typed("dy"), typed("filter")};
    d.outputs = {typed("dx")};
    d.attrs = conv_attr_defs();
    d.attrs.push_back(shape4_attr("input_shape"));
    d.infer = infer_conv2d_backprop_input;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "conv2d_backprop_filter";
    d.summary = "the gradient of conv2d with respect to its filter";
    d.inputs = {typed("input"), typed("dy")};
    d.outputs = {typed("dw")};
    d.attrs = conv_attr_defs();
    d.attrs.push_back(shape4_attr("filter_shape"));
    d.infer = infer_conv2d_backprop_filter;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "conv_transpose2d";
    d.summary = "2-D transposed convolution (ONNX ConvTranspose), NCHW input";
    d.inputs = {typed("input"), typed("filter")};
    d.outputs = {typed("output")};
    d.attrs = conv_attr_defs();
    auto output_padding = attr("output_padding", attr_type::ints, ints({0, 0}));
    output_padding.validate = int_list({2}, 0);
    d.attrs.push_back(std::move(output_padding));
    d.infer = infer_conv_transpose2d;
    r.add(std::move(d));
  }
  register_nn_resize_ops(r);
  // The pooling ops and their gradients: the type attribute and the window attributes.
  const auto pool_attr_defs = [](bool avg) {
    auto kernel = attr("kernel", attr_type::ints);
    kernel.validate = int_list({2}, 1);
    auto strides = attr("strides", attr_type::ints, ints({}));
    strides.validate = int_list({0, 2}, 1);
    auto padding = attr("padding", attr_type::ints, ints({0, 0, 0, 0}));
    padding.validate = int_list({2, 4}, 0);
    auto dilations = attr("dilations", attr_type::ints, ints({1, 1}));
    dilations.validate = int_list({2}, 1);
    std::vector<attr_def> attrs{type_attr("T", float_types()), std::move(kernel),
                                std::move(strides), std::move(padding),
                                attr("ceil_mode", attr_type::boolean, false),
                                std::move(dilations)};
    if (avg) attrs.push_back(attr("count_include_pad", attr_type::boolean, false));
    return attrs;
  };
  for (const char* name : {"max_pool2d", "avg_pool2d"}) {
    const bool avg = std::string_view(name) == "avg_pool2d";
    op_def d;
    d.name = name;
    d.summary = avg ? "mean over 2-D windows, NCHW (or channel blocks)"
                    : "maximum over 2-D windows, NCHW (or channel blocks)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = pool_attr_defs(avg);
    // "NCHW16c": channel blocks (Note [channel blocks]), where conv_layout moves a pool between
    // convolutions that compute in them; CPU kernels alone read them.
    auto format = attr("data_format", attr_type::string, std::string("NCHW"));
    format.validate = [](const attr_value& v) {
      const auto f = v.as<std::string>();
      if (f != "NCHW" && f != "NCHW16c") throw invalid_argument("must be \"NCHW\" or \"NCHW16c\"");
    };
    d.attrs.push_back(std::move(format));
    d.infer = infer_pool;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "max_pool2d_with_indices";
    d.summary = "maximum over 2-D windows, NCHW, and where each is (ONNX MaxPool's Indices)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output"), fixed("indices", dtype::i64)};
    d.attrs = pool_attr_defs(false);
    auto storage_order = attr("storage_order", attr_type::integer, std::int64_t{0});
    storage_order.validate = [](const attr_value& v) {
      const auto order = v.as<std::int64_t>();
      if (order != 0 && order != 1) {
        throw invalid_argument(
            fmt::format("must be 0 (row-major) or 1 (column-major), got {}", order));
      }
    };
    d.attrs.push_back(std::move(storage_order));
    d.infer = infer_max_pool2d_with_indices;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "max_pool2d_grad";
    d.summary = "the gradient of max_pool2d: dy routed to each window's maximum";
    d.inputs = {typed("input"), typed("dy")};
    d.outputs = {typed("dx")};
    d.attrs = pool_attr_defs(false);
    d.infer = infer_max_pool2d_grad;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "avg_pool2d_grad";
    d.summary = "the gradient of avg_pool2d: dy spread evenly over each window";
    d.inputs = {typed("dy")};
    d.outputs = {typed("dx")};
    d.attrs = pool_attr_defs(true);
    d.attrs.push_back(shape4_attr("input_shape"));
    d.infer = infer_avg_pool2d_grad;
    r.add(std::move(d));
  }
  register_nn_fused_ops(r);
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
                           {"groups", options.groups},
                           {"data_format", options.data_format}},
                          o);
}

output conv2d_backprop_input(output dy, output w, shape input_shape, const conv2d_options& options,
                             const node_options& o) {
  return dy.builder().add1("conv2d_backprop_input", {dy, w},
                           {{"strides", options.strides},
                            {"padding", options.padding},
                            {"dilations", options.dilations},
                            {"groups", options.groups},
                            {"input_shape", std::move(input_shape)}},
                           o);
}

output conv_transpose2d(output x, output w, const conv2d_options& options,
                        std::vector<std::int64_t> output_padding, const node_options& o) {
  return x.builder().add1("conv_transpose2d", {x, w},
                          {{"strides", options.strides},
                           {"padding", options.padding},
                           {"dilations", options.dilations},
                           {"groups", options.groups},
                           {"output_padding", std::move(output_padding)}},
                          o);
}

output conv2d_backprop_filter(output x, output dy, shape filter_shape,
                              const conv2d_options& options, const node_options& o) {
  return x.builder().add1("conv2d_backprop_filter", {x, dy},
                          {{"strides", options.strides},
                           {"padding", options.padding},
                           {"dilations", options.dilations},
                           {"groups", options.groups},
                           {"filter_shape", std::move(filter_shape)}},
                          o);
}

namespace {
attr_map pool_attrs(const pool_options& options) {
  return {{"kernel", options.kernel},
          {"strides", options.strides},
          {"padding", options.padding},
          {"ceil_mode", options.ceil_mode},
          {"dilations", options.dilations}};
}
}  // namespace

output max_pool2d(output x, const pool_options& options, const node_options& o) {
  return x.builder().add1("max_pool2d", {x}, pool_attrs(options), o);
}

max_pool2d_with_indices_outputs max_pool2d_with_indices(output x, const pool_options& options,
                                                        std::int64_t storage_order,
                                                        const node_options& o) {
  attr_map attrs = pool_attrs(options);
  attrs.emplace("storage_order", storage_order);
  auto outs = x.builder().add("max_pool2d_with_indices", {x}, std::move(attrs), o);
  return {outs.at(0), outs.at(1)};
}

output avg_pool2d(output x, const pool_options& options, const node_options& o) {
  attr_map attrs = pool_attrs(options);
  attrs.emplace("count_include_pad", options.count_include_pad);
  return x.builder().add1("avg_pool2d", {x}, std::move(attrs), o);
}

output max_pool2d_grad(output x, output dy, const pool_options& options, const node_options& o) {
  return x.builder().add1("max_pool2d_grad", {x, dy}, pool_attrs(options), o);
}

output avg_pool2d_grad(output dy, shape input_shape, const pool_options& options,
                       const node_options& o) {
  attr_map attrs = pool_attrs(options);
  attrs.emplace("count_include_pad", options.count_include_pad);
  attrs.emplace("input_shape", std::move(input_shape));
  return dy.builder().add1("avg_pool2d_grad", {dy}, std::move(attrs), o);
}

}  // namespace ops
}  // namespace loom
