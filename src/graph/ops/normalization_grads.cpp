// Gradients of the normalization family (normalization_ops.cpp): layer_norm emits one
// layer_norm_grad node (which has no gradient itself: second order through it is an
// error).
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/normalization.hpp"

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

}  // namespace

void register_normalization_gradients(gradient_registry& r) {
  r.add("layer_norm", layer_norm_grad);
}

}  // namespace loom
