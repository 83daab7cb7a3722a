// The nn ops' rules that format messages (include/loom/graph/ops/nn_rules.hpp).
#include "loom/graph/ops/nn_rules.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::nn_rules {

matmul_dims matmul_dims_of(operand a, operand b, bool transpose_a, bool transpose_b) {
  const shape& sa = a.dims();
  const shape& sb = b.dims();
  if (sa.rank() < 2 || sb.rank() < 2) {
    throw invalid_argument(
        fmt::format("matmul needs inputs of rank >= 2, got a {} and b {}", a.name(), b.name()));
  }
  const std::size_t ra = sa.rank();
  const std::size_t rb = sb.rank();
  const std::int64_t m = transpose_a ? sa[ra - 1] : sa[ra - 2];
  const std::int64_t ka = transpose_a ? sa[ra - 2] : sa[ra - 1];
  const std::int64_t kb = transpose_b ? sb[rb - 1] : sb[rb - 2];
  const std::int64_t n = transpose_b ? sb[rb - 2] : sb[rb - 1];
  if (ka >= 0 && kb >= 0 && ka != kb) {
    // Inference's message also says which operand is transposed (Note [nn rule messages]).
    const auto mark = [](const operand& x, bool transposed) {
      return !x.is_tensor() && transposed ? " (transposed)" : "";
    };
    throw invalid_argument(
        fmt::format("inner dimensions differ: a {}{} has K = {}, b {}{} has K = {}", a.name(),
                    mark(a, transpose_a), ka, b.name(), mark(b, transpose_b), kb));
  }
  shape out;
  try {
    out = broadcast_shapes(shape(sa.dims().first(ra - 2)), shape(sb.dims().first(rb - 2)));
  } catch (const invalid_argument&) {
    throw invalid_argument(
        fmt::format("batch dimensions of a {} and b {} do not broadcast", a.name(), b.name()));
  }
  out.push_back(m);
  out.push_back(n);
  return {std::move(out), ka};
}

bias_add_geometry bias_add_geometry_of(const tensor& x, const tensor& bias, bool nchw) {
  const shape& s = x.shape();
  if (s.rank() < 2 || bias.rank() != 1) {
    throw invalid_argument(
        fmt::format("bias_add needs an input of rank >= 2 and a bias of rank 1, got {} and {}",
                    x.describe(), bias.describe()));
  }
  const std::size_t axis = channel_axis(s.rank(), nchw);
  bias_add_geometry g;
  g.channels = s[axis];
  if (bias.dim(0) != g.channels) {
    throw invalid_argument(fmt::format("bias {} does not match the {} channels of input {}",
                                       bias.describe(), g.channels, x.describe()));
  }
  for (std::size_t d = 0; d < axis; ++d) g.outer *= s[d];
  for (std::size_t d = axis + 1; d < s.rank(); ++d) g.inner *= s[d];
  return g;
}

activation activation_of(std::string_view name) {
  const auto* it = std::find(activation_names.begin(), activation_names.end(), name);
  if (it == activation_names.end()) {
    throw invalid_argument("unknown activation \"" + std::string(name) + "\"");
  }
  return static_cast<activation>(it - activation_names.begin());
}

void check_epilogue_inputs(std::size_t inputs, bool has_bias, bool has_residual) {
  const std::size_t wanted = 2 + std::size_t{has_bias} + std::size_t{has_residual};
  if (inputs != wanted) {
    throw invalid_argument(
        fmt::format("has {} inputs, but has_bias = {} and has_residual = {} need {}", inputs,
                    has_bias, has_residual, wanted));
  }
}

void check_epilogue_args(const shape& out, std::size_t channel, const tensor* bias,
                         const tensor* residual) {
  if (bias != nullptr && (bias->rank() != 1 || bias->dim(0) != out[channel])) {
    throw invalid_argument(
        fmt::format("bias {} does not match the {} channels (dimension {}) of the output {}",
                    bias->describe(), out[channel], channel, to_string(out)));
  }
  if (residual != nullptr && residual->shape() != out) {
    throw invalid_argument(fmt::format("residual {} must have the output's shape {}",
                                       residual->describe(), to_string(out)));
  }
}

}  // namespace loom::nn_rules
