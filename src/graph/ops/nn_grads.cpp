// Gradients of the nn ops (nn_ops.cpp): matmul by matmuls, bias_add by a reduction, and
// conv2d and pooling (max_pool2d_with_indices through its values) by their backward ops
// (conv2d_backprop_input/filter, max_pool2d_grad, avg_pool2d_grad), which take the forward
// node's attributes; conv_transpose2d by conv2d and conv2d_backprop_filter; the fused
// ops (nn_fused_ops.cpp) through the activation's gradient and then their core's.
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/graph/ops/reduction.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;
using ints = std::vector<std::int64_t>;

// The gradients of inputs 0 and 1 (a, b) of a matmul (or fused_matmul) node whose product
// has the gradient dy.
grads matmul_input_grads(const gradient_context& c, output dy) {
  // z = op(a) @ op(b), op a transpose of the last two dims or not. Each case is written so
  // that no explicit transpose is made: matmul transposes its operands itself.
  const output a = c.input(0);
  const output b = c.input(1);
  const bool ta = c.attr<bool>("transpose_a");
  const bool tb = c.attr<bool>("transpose_b");
  output da;
  output db;
  if (!ta && !tb) {
    da = ops::matmul(dy, b, false, true);  // dy b^T
    db = ops::matmul(a, dy, true, false);  // a^T dy
  } else if (!ta && tb) {
    da = ops::matmul(dy, b);               // dy b
    db = ops::matmul(dy, a, true, false);  // dy^T a
  } else if (ta && !tb) {
    da = ops::matmul(b, dy, false, true);  // b dy^T
    db = ops::matmul(a, dy);               // a dy
  } else {
    da = ops::matmul(b, dy, true, true);  // b^T dy^T
    db = ops::matmul(dy, a, true, true);  // dy^T a^T
  }
  // Batch dimensions broadcast: sum them back.
  return {c.unbroadcast(da, 0), c.unbroadcast(db, 1)};
}

grads matmul_grad(const gradient_context& c) {
  return matmul_input_grads(c, c.grad(0));
}

grads bias_add_grad(const gradient_context& c) {
  const output dy = c.grad(0);
  const std::size_t rank = c.input_shape(0).rank();
  const std::size_t channel =
      nn_rules::channel_axis(rank, nn_rules::is_nchw(c.attr<std::string>("data_format")));
  ints axes;
  for (std::size_t d = 0; d < rank; ++d) {
    if (d != channel) axes.push_back(static_cast<std::int64_t>(d));
  }
  return {dy, ops::reduce_sum(dy, axes)};
}

attr_map conv_attrs(const gradient_context& c) {
  return {{"strides", c.attr<ints>("strides")},
          {"padding", c.attr<ints>("padding")},
          {"dilations", c.attr<ints>("dilations")},
          {"groups", c.attr<std::int64_t>("groups")}};
}

// The gradients of inputs 0 and 1 (input, filter) of a conv2d (or fused_conv2d) node whose
// output has the gradient dy. The backward ops take NCHW: an NHWC node's x and dy are
// transposed to it, and dx back.
grads conv2d_input_grads(const gradient_context& c, output dy) {
  graph_builder& b = c.builder();
  if (nn_rules::is_channel_blocked(c.attr<std::string>("data_format"))) {
    c.fail("a convolution in channel blocks (data_format NCHW16c, an inference layout) has no gradient: "
           "differentiate the NCHW or NHWC graph");
  }
  const bool nchw = nn_rules::is_nchw(c.attr<std::string>("data_format"));
  output x = c.input(0);
  if (!nchw) {
    x = ops::transpose(x, {0, 3, 1, 2});
    dy = ops::transpose(dy, {0, 3, 1, 2});
  }
  attr_map in_attrs = conv_attrs(c);
  in_attrs.emplace("input_shape", nn_rules::conv_nchw_view(c.input_shape(0), nchw));
  attr_map filter_attrs = conv_attrs(c);
  filter_attrs.emplace("filter_shape", c.input_shape(1));
  output dx = b.add1("conv2d_backprop_input", {dy, c.input(1)}, std::move(in_attrs));
  if (!nchw) dx = ops::transpose(dx, {0, 2, 3, 1});
  return {dx, b.add1("conv2d_backprop_filter", {x, dy}, std::move(filter_attrs))};
}

grads conv2d_grad(const gradient_context& c) {
  return conv2d_input_grads(c, c.grad(0));
}

// conv_transpose2d(x, w) is conv2d_backprop_input(x, w): the adjoint of conv2d(., w). So
// dx = conv2d(dy, w), and dw = conv2d_backprop_filter(dy, x), dy playing conv2d's input
// and x its output's gradient (output_padding only adds rows conv2d never reads).
grads conv_transpose2d_grad(const gradient_context& c) {
  graph_builder& b = c.builder();
  const output dy = c.grad(0);
  attr_map filter_attrs = conv_attrs(c);
  filter_attrs.emplace("filter_shape", c.input_shape(1));
  return {b.add1("conv2d", {dy, c.input(1)}, conv_attrs(c)),
          b.add1("conv2d_backprop_filter", {dy, c.input(0)}, std::move(filter_attrs))};
}

// Activation clip's dz for y = minimum(maximum(z, lo), hi): what the unfused maximum's and
// minimum's gradients give z (elementwise_grads.cpp: the first operand gets dy where it
// wins, ties included): dy where z >= lo and z <= hi, else 0 (a NaN z, or a NaN bound, gives
// 0). An infinite bound stands for no node at all (Note [clip activation] in nn_rules.hpp:
// the pass makes a lone maximum or minimum a clip with the other bound infinite), so it
// adds no condition.
output clip_dz(const gradient_context& c, output dy, output z) {
  const double lo = c.attr<double>("clip_min");
  const double hi = c.attr<double>("clip_max");
  const dtype t = c.forward().outputs[0].type;
  std::optional<output> keep;
  if (!(lo == -std::numeric_limits<double>::infinity())) {
    keep = ops::greater_equal(z, c.scalar(lo, t));
  }
  if (!(hi == std::numeric_limits<double>::infinity())) {
    const output below = ops::less_equal(z, c.scalar(hi, t));
    keep = keep ? ops::logical_and(*keep, below) : below;
  }
  if (!keep) return dy;
  return ops::where(*keep, dy, c.scalar(0.0, t));
}

// fused_matmul / fused_conv2d: y = act(z), z = core + bias + residual. dz = dy * act'(z),
// from y where act' is a function of y (relu, tanh, sigmoid), else from z recomputed by the
// same fused op without its activation (gelu, and clip, whose ties y cannot tell apart);
// then the core's gradients of dz, the bias's sum of dz over every dimension but its own,
// and dz itself for the residual.
output fused_dz(const gradient_context& c, bool conv) {
  const output dy = c.grad(0);
  const output y = c.output_of(0);
  const auto act = c.attr<std::string>("activation");
  if (act == "none") return dy;
  if (act == "relu") return c.builder().add1("relu_grad", {dy, y});
  if (act == "tanh") return dy * (1.0 - y * y);
  if (act == "sigmoid") return dy * (y * (1.0 - y));
  // gelu, clip: z again, with the node's inputs and attributes but no activation.
  std::vector<output> inputs;
  for (std::size_t i = 0; i < c.num_inputs(); ++i) inputs.push_back(c.input(i));
  attr_map attrs = c.forward().attrs;
  attrs["activation"] = std::string("none");
  attrs["clip_min"] = -std::numeric_limits<double>::infinity();
  attrs["clip_max"] = std::numeric_limits<double>::infinity();
  const output z = c.builder().add1(conv ? "fused_conv2d" : "fused_matmul", inputs, attrs);
  if (act == "clip") return clip_dz(c, dy, z);
  if (act == "gelu_tanh") {
    // As gelu's gradient (elementwise_grads.cpp): y = z s, s = sigmoid(2u),
    // u = k (z + 0.044715 z^3): dy/dz = s + z s (1 - s) 2 k (1 + 3 * 0.044715 z^2).
    constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
    const output z2 = z * z;
    const output u = (z + z2 * z * 0.044715) * k;
    const output s = ops::sigmoid(u * 2.0);
    const output du = (z2 * (3.0 * 0.044715) + 1.0) * (2.0 * k);
    return dy * (s + z * s * (1.0 - s) * du);
  }
  // y = z Phi(z): dy/dz = Phi(z) + z phi(z).
  const output phi_big = (ops::erf(z * (1.0 / std::numbers::sqrt2)) + 1.0) * 0.5;
  const output phi = ops::exp(z * z * -0.5) * (1.0 / std::sqrt(2.0 * std::numbers::pi));
  return dy * (phi_big + z * phi);
}

gradient_fn fused_grad(bool conv) {
  return [conv](const gradient_context& c) -> grads {
    const output dz = fused_dz(c, conv);
    grads g = conv ? conv2d_input_grads(c, dz) : matmul_input_grads(c, dz);
    if (c.attr<bool>("has_bias")) {
      const std::size_t rank = c.output_shape(0).rank();
      // NCHW for conv2d unless its data_format says NHWC; a product's last dimension.
      const std::size_t channel = nn_rules::channel_axis(
          rank, conv && nn_rules::is_nchw(c.attr<std::string>("data_format")));
      ints axes;
      for (std::size_t d = 0; d < rank; ++d) {
        if (d != channel) axes.push_back(static_cast<std::int64_t>(d));
      }
      g.push_back(ops::reduce_sum(dz, axes));
    }
    if (c.attr<bool>("has_residual")) g.push_back(dz);
    return g;
  };
}

attr_map pool_attrs(const gradient_context& c) {
  const auto format = c.forward().attrs.find("data_format");
  if (format != c.forward().attrs.end() && nn_rules::is_channel_blocked(format->second.as<std::string>())) {
    c.fail("a pooling in channel blocks (data_format NCHW16c, an inference layout) has no gradient: "
           "differentiate the NCHW graph");
  }
  return {{"kernel", c.attr<ints>("kernel")},
          {"strides", c.attr<ints>("strides")},
          {"padding", c.attr<ints>("padding")},
          {"ceil_mode", c.attr<bool>("ceil_mode")},
          {"dilations", c.attr<ints>("dilations")}};
}

}  // namespace

void register_nn_gradients(gradient_registry& r) {
  r.add("matmul", matmul_grad);
  r.add("bias_add", bias_add_grad);
  r.add("conv2d", conv2d_grad);
  r.add("conv_transpose2d", conv_transpose2d_grad);
  // Conversions into and out of channel blocks (Note [channel blocks]): each other's adjoint
  // (the blocks' zero channels take no gradient).
  r.add("to_channel_blocks", [](const gradient_context& c) -> grads {
    const std::string format = c.attr<std::string>("data_format");
    const shape& s = c.input_shape(0);
    return {c.builder().add1("from_channel_blocks", {c.grad(0)},
                             {{"channels", format == "NHWC" ? s[3] : s[1]}, {"data_format", format}})};
  });
  r.add("from_channel_blocks", [](const gradient_context& c) -> grads {
    return {c.builder().add1("to_channel_blocks", {c.grad(0)}, {{"data_format", c.attr<std::string>("data_format")}})};
  });
  // resize: differentiable in principle, but without a backward op yet; asking is an error
  // naming the node (never a silent zero).
  r.add("resize", [](const gradient_context& c) -> grads {
    c.fail("resize has no gradient (no backward op for it yet)");
  });
  r.add("fused_matmul", fused_grad(false));
  r.add("fused_conv2d", fused_grad(true));
  // max_pool2d_with_indices: through its values, max_pool2d's (the indices take none).
  const auto max_pool_grad = [](const gradient_context& c) -> grads {
    return {c.builder().add1("max_pool2d_grad", {c.input(0), c.grad(0)}, pool_attrs(c))};
  };
  r.add("max_pool2d", max_pool_grad);
  r.add("max_pool2d_with_indices", max_pool_grad);
  r.add("avg_pool2d", [](const gradient_context& c) -> grads {
    attr_map a = pool_attrs(c);
    a.emplace("count_include_pad", c.attr<bool>("count_include_pad"));
    a.emplace("input_shape", c.input_shape(0));
    return {c.builder().add1("avg_pool2d_grad", {c.grad(0)}, std::move(a))};
  });
}

}  // namespace loom
