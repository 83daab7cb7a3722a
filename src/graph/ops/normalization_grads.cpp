// Gradients of the normalization family (normalization_ops.cpp): layer_norm emits one
// layer_norm_grad node (which has no gradient itself: second order through it is an
// error); batch_norm's is built of element-wise ops and sums over every dim but 1.
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/reduction.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;

// The forward's axis in [0, rank).
std::int64_t axis_of(const gradient_context& c) {
  return static_cast<std::int64_t>(c.input_shape(0).normalize_axis(c.attr<std::int64_t>("axis")));
}

grads layer_norm_grad(const gradient_context& c) {
  // One layer_norm_grad node (its CPU kernel fuses the row sums, dx, dgamma and dbeta:
  // src/backends/cpu/normalization_kernels.cpp). Over the normalised dims [axis, rank), with
  // xhat = (x - mean) rstd and dxhat = dy gamma:
  //   dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
  //   dgamma = sum over the leading dims of dy xhat, dbeta = sum of dy.
  // mean and rstd (outputs 1 and 2) are only statistics: gradients sent to them are not
  // propagated (their consumers are the training graph's bookkeeping, not the loss).
  if (c.has_grad(1) || c.has_grad(2)) {
    c.fail("gradients through layer_norm's mean or rstd outputs are not supported");
  }
  auto outs = c.builder().add("layer_norm_grad",
                              {c.grad(0), c.input(0), c.input(1), c.output_of(1), c.output_of(2)},
                              {{"axis", axis_of(c)}});
  return {outs.at(0), outs.at(1), outs.at(2)};
}

grads batch_norm_grad(const gradient_context& c) {
  // y = x a + b per channel, a = scale inv, inv = 1 / sqrt(var + eps), b = bias - mean a:
  //   dx = dy a, dbias = Σ dy, dscale = Σ dy (x - mean) inv, dmean = -a Σ dy,
  //   dvar = -scale inv² dscale / 2 (the sums over every dim but the channels').
  const std::size_t rank = c.input_shape(0).rank();
  std::vector<std::int64_t> axes{0};
  for (std::size_t k = 2; k < rank; ++k) axes.push_back(static_cast<std::int64_t>(k));
  std::vector<std::int64_t> bshape(rank, 1);
  bshape[1] = -1;
  const auto per_channel = [&](output v) { return ops::reshape(v, bshape); };
  const output dy = c.grad(0);
  const output scale = c.input(1);
  const output inv = ops::rsqrt(c.input(4) + c.attr<double>("epsilon"));
  const output a = scale * inv;
  const output dbias = ops::reduce_sum(dy, axes);
  const output centred = c.input(0) - per_channel(c.input(3));
  const output dscale = ops::reduce_sum(dy * centred, axes) * inv;
  return {dy * per_channel(a), dscale, dbias, -(dbias * a), dscale * scale * inv * inv * -0.5};
}

}  // namespace

void register_normalization_gradients(gradient_registry& r) {
  r.add("batch_norm", batch_norm_grad);
  r.add("layer_norm", layer_norm_grad);
}

}  // namespace loom
