// Gradients of the nn ops (nn_ops.cpp): matmul by matmuls, bias_add by a reduction, and
// conv2d and pooling by their backward ops (conv2d_backprop_input/filter,
// max_pool2d_grad, avg_pool2d_grad), which take the forward node's attributes.
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/reduction.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;
using ints = std::vector<std::int64_t>;

grads matmul_grad(const gradient_context& c) {
  // z = op(a) @ op(b), op a transpose of the last two dims or not. Each case is written so
  // that no explicit transpose is made: matmul transposes its operands itself.
  const output a = c.input(0);
  const output b = c.input(1);
  const output dy = c.grad(0);
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

grads bias_add_grad(const gradient_context& c) {
  const output dy = c.grad(0);
  const std::size_t rank = c.input_shape(0).rank();
  const std::size_t channel = c.attr<std::string>("data_format") == "NCHW" ? 1 : rank - 1;
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

grads conv2d_grad(const gradient_context& c) {
  graph_builder& b = c.builder();
  const output dy = c.grad(0);
  attr_map in_attrs = conv_attrs(c);
  in_attrs.emplace("input_shape", c.input_shape(0));
  attr_map filter_attrs = conv_attrs(c);
  filter_attrs.emplace("filter_shape", c.input_shape(1));
  return {b.add1("conv2d_backprop_input", {dy, c.input(1)}, std::move(in_attrs)),
          b.add1("conv2d_backprop_filter", {c.input(0), dy}, std::move(filter_attrs))};
}

attr_map pool_attrs(const gradient_context& c) {
  return {{"kernel", c.attr<ints>("kernel")},
          {"strides", c.attr<ints>("strides")},
          {"padding", c.attr<ints>("padding")}};
}

}  // namespace

void register_nn_gradients(gradient_registry& r) {
  r.add("matmul", matmul_grad);
  r.add("bias_add", bias_add_grad);
  r.add("conv2d", conv2d_grad);
  r.add("max_pool2d", [](const gradient_context& c) -> grads {
    return {c.builder().add1("max_pool2d_grad", {c.input(0), c.grad(0)}, pool_attrs(c))};
  });
  r.add("avg_pool2d", [](const gradient_context& c) -> grads {
    attr_map a = pool_attrs(c);
    a.emplace("count_include_pad", c.attr<bool>("count_include_pad"));
    a.emplace("input_shape", c.input_shape(0));
    return {c.builder().add1("avg_pool2d_grad", {c.grad(0)}, std::move(a))};
  });
}

}  // namespace loom
