// Gradients of the normalization family (normalization_ops.cpp, normalization_train_ops.cpp):
// layer_norm emits one layer_norm_grad node and batch_norm_train one batch_norm_train_grad
// (which have no gradients themselves: second order through them is an error);
// sync_batch_norm's sums go through one all_reduce; batch_norm's (inference) is built of
// element-wise ops and sums over every dim but 1.
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/collective.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
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
  //   dvar = -scale inv² dscale / 2 (the sums over every dim but the channels', dim 1 or the last).
  const std::size_t rank = c.input_shape(0).rank();
  const std::size_t channel =
      normalization_rules::batch_norm_channel_axis(c.attr<std::string>("data_format"), rank);
  std::vector<std::int64_t> axes;
  for (std::size_t k = 0; k < rank; ++k) {
    if (k != channel) axes.push_back(static_cast<std::int64_t>(k));
  }
  std::vector<std::int64_t> bshape(rank, 1);
  bshape[channel] = -1;
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

// batch_norm_train and sync_batch_norm: only y carries a gradient; mean and invstd are what
// the backward pass reads, and the running statistics are state, not inputs of the loss.
void refuse_statistics_grads(const gradient_context& c) {
  if (c.has_grad(1) || c.has_grad(2)) {
    c.fail("gradients through the batch statistics (mean, invstd outputs) are not supported");
  }
}

grads batch_norm_train_grad(const gradient_context& c) {
  // One batch_norm_train_grad node (its CPU kernel reads dy and x once per channel for the
  // sums and once for dx): with xhat = (x - mean) invstd, a = scale invstd and n the count,
  //   dx = a (dy - Σdy / n - xhat Σ(dy xhat) / n), dscale = Σ dy xhat, dbias = Σ dy.
  refuse_statistics_grads(c);
  auto outs = c.builder().add(
      "batch_norm_train_grad",
      {c.grad(0), c.input(0), c.input(1), c.output_of(1), c.output_of(2)},
      {{"data_format", c.attr<std::string>("data_format")}});
  return {outs.at(0), outs.at(1), outs.at(2), std::nullopt, std::nullopt};
}

grads sync_batch_norm_grad(const gradient_context& c) {
  // The same terms, with Σdy, Σ dy (x - mean) and n summed over the ranks by one all_reduce
  // (Note [packed batch statistics]); dscale and dbias stay this rank's.
  refuse_statistics_grads(c);
  const attr_map format{{"data_format", c.attr<std::string>("data_format")}};
  const std::vector<output> per_channel{c.grad(0), c.input(0), c.input(1), c.output_of(1),
                                        c.output_of(2)};
  auto local = c.builder().add("batch_norm_grad_reduce", per_channel, format);
  const output total = ops::all_reduce(local.at(0), "sum", c.attr<std::string>("group"));
  std::vector<output> elemt = per_channel;
  elemt.push_back(total);
  const output dx = c.builder().add1("batch_norm_grad_elemt", elemt, format);
  return {dx, local.at(1), local.at(2), std::nullopt, std::nullopt, std::nullopt};
}

}  // namespace

void register_normalization_gradients(gradient_registry& r) {
  r.add("batch_norm", batch_norm_grad);
  r.add("batch_norm_train", batch_norm_train_grad);
  r.add("sync_batch_norm", sync_batch_norm_grad);
  // sync_batch_norm's gradient differentiates through the merged statistics itself: nothing
  // flows back through the statistics it gathers.
  r.add_none("batch_norm_stats");
  r.add("layer_norm", layer_norm_grad);
}

}  // namespace loom
