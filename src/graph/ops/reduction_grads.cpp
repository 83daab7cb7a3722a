// Gradients of the reduction-family ops (reduction_ops.cpp). A reduction's gradient
// broadcasts dy back over the reduced axes (reshaped to the keepdims shape, then
// broadcast_to the input's shape, a view); softmax and log_softmax use their outputs;
// softmax_cross_entropy uses its own backprop output.
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

// Which input dimensions the forward reduction reduces (all of them when "axes" is empty).
std::vector<bool> reduced_axes(const gradient_context& c) {
  const shape& in = c.input_shape(0);
  std::vector<bool> reduced(in.rank(), false);
  const auto axes = c.attr<ints>("axes");
  if (axes.empty()) {
    reduced.assign(in.rank(), true);
  } else {
    for (std::int64_t a : axes) reduced[in.normalize_axis(a)] = true;
  }
  return reduced;
}

// `v`, an output (or its gradient) of a reduction over `reduced`, broadcast back to the
// input's shape.
output broadcast_back(const gradient_context& c, output v, const std::vector<bool>& reduced) {
  const shape& in = c.input_shape(0);
  shape kept = in;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (reduced[d]) kept[d] = 1;
  }
  const output k = ops::reshape(v, kept.to_vector());
  return c.builder().add1("broadcast_to", {k}, {{"shape", in}});
}

std::int64_t reduced_count(const gradient_context& c, const std::vector<bool>& reduced) {
  const shape& in = c.input_shape(0);
  std::int64_t n = 1;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (reduced[d]) n *= in[d];
  }
  return n;
}

// With an output_type wider than x's, dy comes back in x's dtype.
grads sum_grad(const gradient_context& c) {
  const output dx = broadcast_back(c, c.grad(0), reduced_axes(c));
  return {dx.dtype_of() == c.input_type(0) ? dx : ops::cast(dx, c.input_type(0))};
}

grads mean_grad(const gradient_context& c) {
  const auto reduced = reduced_axes(c);
  const std::int64_t n = reduced_count(c, reduced);
  // An empty reduction's mean is NaN; its gradient reaches no element, so any scale will do.
  const double scale = n == 0 ? 0.0 : 1.0 / static_cast<double>(n);
  return {broadcast_back(c, c.grad(0) * scale, reduced)};
}

// max / min: the gradient is shared evenly between the elements equal to the result
// (TensorFlow's rule).
grads extremum_grad(const gradient_context& c) {
  const auto reduced = reduced_axes(c);
  const output x = c.input(0);
  const dtype t = c.input_type(0);
  const output y = broadcast_back(c, c.output_of(0), reduced);
  const output hit = ops::cast(ops::equal(x, y), t);
  // The ties counted over the forward's own axes (empty: all, as the forward reads it).
  const output count = broadcast_back(c, ops::reduce_sum(hit, c.attr<ints>("axes")), reduced);
  return {hit * broadcast_back(c, c.grad(0), reduced) / count};
}

// prod: d/dx_i = prod / x_i. Exact where no reduced element is zero; where one is, this
// divides by zero (documented in docs/training.md).
grads prod_grad(const gradient_context& c) {
  const auto reduced = reduced_axes(c);
  const output y = broadcast_back(c, c.output_of(0) * c.grad(0), reduced);
  return {y / c.input(0)};
}

// reduce_l1: dx = dy sign(x) (0 where x is 0).
grads l1_grad(const gradient_context& c) {
  const output x = c.input(0);
  const dtype t = c.input_type(0);
  const output zero = ops::scalar(c.builder(), 0.0, t);
  const output sign = ops::cast(ops::greater(x, zero), t) - ops::cast(ops::less(x, zero), t);
  return {sign * broadcast_back(c, c.grad(0), reduced_axes(c))};
}

// reduce_l2: dx = dy x / y (0 where the norm y is 0, PyTorch's subgradient).
grads l2_grad(const gradient_context& c) {
  const auto reduced = reduced_axes(c);
  const output y = c.output_of(0);
  const output zero = ops::scalar(c.builder(), 0.0, c.input_type(0));
  const output scale = ops::where(ops::equal(y, zero), zero, c.grad(0) / y);
  return {c.input(0) * broadcast_back(c, scale, reduced)};
}

// reduce_sum_square: dx = 2 x dy.
grads sum_square_grad(const gradient_context& c) {
  return {c.input(0) * broadcast_back(c, c.grad(0) * 2.0, reduced_axes(c))};
}

// reduce_log_sum: y = log Σx, dx = dy / Σx = dy exp(-y).
grads log_sum_grad(const gradient_context& c) {
  return {broadcast_back(c, c.grad(0) * ops::exp(-c.output_of(0)), reduced_axes(c))};
}

// reduce_log_sum_exp: dx = dy exp(x - y), the softmax of x over the reduced axes.
grads log_sum_exp_grad(const gradient_context& c) {
  const auto reduced = reduced_axes(c);
  const output p = ops::exp(c.input(0) - broadcast_back(c, c.output_of(0), reduced));
  return {p * broadcast_back(c, c.grad(0), reduced)};
}

std::int64_t axis_of(const gradient_context& c) {
  return static_cast<std::int64_t>(c.input_shape(0).normalize_axis(c.attr<std::int64_t>("axis")));
}

grads softmax_grad(const gradient_context& c) {
  // dx = y (dy - sum(dy y, axis)).
  const output y = c.output_of(0);
  const output dy = c.grad(0);
  const output s = ops::reduce_sum(dy * y, {axis_of(c)}, true);
  return {y * (dy - s)};
}

grads log_softmax_grad(const gradient_context& c) {
  // dx = dy - softmax(x) sum(dy, axis), softmax(x) = exp(y).
  const output dy = c.grad(0);
  const output s = ops::reduce_sum(dy, {axis_of(c)}, true);
  return {dy - ops::exp(c.output_of(0)) * s};
}

grads xent_grad(const gradient_context& c) {
  // d loss_n / d logits_n = backprop_n (softmax - one_hot), scaled by the incoming dloss_n.
  if (c.has_grad(1))
    c.fail("gradients through softmax_cross_entropy's backprop output are not supported");
  const output dloss = ops::expand_dims(c.grad(0), -1);
  return {c.output_of(1) * dloss, std::nullopt};
}

}  // namespace

void register_reduction_gradients(gradient_registry& r) {
  r.add("reduce_sum", sum_grad);
  r.add("reduce_mean", mean_grad);
  r.add("reduce_max", extremum_grad);
  r.add("reduce_min", extremum_grad);
  r.add("reduce_prod", prod_grad);
  r.add("reduce_l1", l1_grad);
  r.add("reduce_l2", l2_grad);
  r.add("reduce_sum_square", sum_square_grad);
  r.add("reduce_log_sum", log_sum_grad);
  r.add("reduce_log_sum_exp", log_sum_exp_grad);
  r.add_none("reduce_any");
  r.add_none("reduce_all");
  r.add("softmax", softmax_grad);
  r.add("log_softmax", log_softmax_grad);
  r.add("softmax_cross_entropy", xent_grad);
  r.add_none("argmax");
  r.add_none("argmin");
}

}  // namespace loom
