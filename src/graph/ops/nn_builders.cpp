// The nn builders composed of other ops (declared in loom/graph/ops/nn.hpp): conv1d (a
// conv2d over a height of 1), lp_pool2d (an average pool of |x|^p), the global pooling
// builders (reductions over the spatial dimensions) and depth_to_space / space_to_depth
// (reshape, transpose, reshape). Their gradients are those of the ops they are built of.
#include <fmt/format.h>

#include <array>
#include <numeric>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::ops {
namespace {

// The spatial axes [2, rank) of x, whose rank must be known and >= 3.
std::vector<std::int64_t> spatial_axes(output x, const char* what) {
  const auto& s = x.type().shape;
  if (!s || s->rank() < 3) {
    throw invalid_argument(fmt::format("{} needs x of known rank >= 3 ([N, C, ...]), got {}",
                                       what, s ? to_string(*s) : std::string("unknown rank")));
  }
  std::vector<std::int64_t> axes(s->rank() - 2);
  std::iota(axes.begin(), axes.end(), 2);
  return axes;
}

// x's [C, H, W], which must be known (rank 4).
std::array<std::int64_t, 3> chw_of(output x, const char* what) {
  const auto& s = x.type().shape;
  if (!s || s->rank() != 4 || (*s)[1] < 0 || (*s)[2] < 0 || (*s)[3] < 0) {
    throw invalid_argument(fmt::format("{} needs x [N, C, H, W] with C, H and W known, got {}",
                                       what, s ? to_string(*s) : std::string("unknown rank")));
  }
  return {(*s)[1], (*s)[2], (*s)[3]};
}

}  // namespace

output depth_to_space(output x, std::int64_t blocksize, const std::string& mode,
                      const node_options& o) {
  const auto [c, h, w] = chw_of(x, "depth_to_space");
  const std::int64_t b = blocksize;
  if (b < 1 || c % (b * b) != 0) {
    throw invalid_argument(fmt::format(
        "depth_to_space: blocksize {} squared must divide the {} channels", b, c));
  }
  const std::int64_t cb = c / (b * b);
  output t;
  if (mode == "DCR") {
    t = transpose(reshape(x, {-1, b, b, cb, h, w}), {0, 3, 4, 1, 5, 2});
  } else if (mode == "CRD") {
    t = transpose(reshape(x, {-1, cb, b, b, h, w}), {0, 1, 4, 2, 5, 3});
  } else {
    throw invalid_argument(
        fmt::format("depth_to_space: mode must be \"DCR\" or \"CRD\", got \"{}\"", mode));
  }
  return reshape(t, {-1, cb, h * b, w * b}, o);
}

output space_to_depth(output x, std::int64_t blocksize, const node_options& o) {
  const auto [c, h, w] = chw_of(x, "space_to_depth");
  const std::int64_t b = blocksize;
  if (b < 1 || h % b != 0 || w % b != 0) {
    throw invalid_argument(fmt::format(
        "space_to_depth: blocksize {} must divide the height {} and the width {}", b, h, w));
  }
  const output t = transpose(reshape(x, {-1, c, h / b, b, w / b, b}), {0, 3, 5, 1, 2, 4});
  return reshape(t, {-1, c * b * b, h / b, w / b}, o);
}

output conv1d(output x, output w, std::int64_t stride, std::vector<std::int64_t> padding,
              std::int64_t dilation, std::int64_t groups, const node_options& o) {
  if (padding.size() != 1 && padding.size() != 2) {
    throw invalid_argument(fmt::format("conv1d: padding must have 1 or 2 values, got {}",
                                       padding.size()));
  }
  const std::int64_t left = padding[0];
  const std::int64_t right = padding.size() == 2 ? padding[1] : padding[0];
  conv2d_options c;
  c.strides = {1, stride};
  c.padding = {0, 0, left, right};
  c.dilations = {1, dilation};
  c.groups = groups;
  const output y = conv2d(expand_dims(x, 2), expand_dims(w, 2), c);
  return squeeze(y, {2}, o);
}

std::pair<output, output> dropout_with_mask(output x, double rate, std::int64_t seed,
                                            const node_options& o) {
  if (!(rate >= 0.0 && rate < 1.0)) {
    throw invalid_argument(fmt::format("dropout: rate must be in [0, 1), got {}", rate));
  }
  const auto& s = x.type().shape;
  if (!s || !s->is_fully_defined()) {
    throw invalid_argument(fmt::format("dropout: the input's shape must be known, got {}", to_string(x.type())));
  }
  graph_builder& b = x.builder();
  if (rate == 0.0) return {identity(x, o), fill(b, dtype::boolean, *s, 1.0)};
  const dtype t = x.dtype_of();
  const output u = random_uniform_per_run(b, t, *s, seed);  // a new mask every step
  const output keep = greater_equal(u, scalar(b, rate, t));
  const output scaled = mul(x, scalar(b, 1.0 / (1.0 - rate), t));
  return {where(keep, scaled, zeros(b, t, shape{}), o), keep};
}

output dropout(output x, double rate, std::int64_t seed, const node_options& o) {
  return dropout_with_mask(x, rate, seed, o).first;
}

output lp_pool2d(output x, double p, const pool_options& options, const node_options& o) {
  if (!(p >= 1.0)) throw invalid_argument(fmt::format("lp_pool2d: p must be >= 1, got {}", p));
  if (options.kernel.size() != 2) {
    throw invalid_argument("lp_pool2d: kernel must have 2 values");
  }
  pool_options sum_opts = options;
  sum_opts.count_include_pad = true;
  const double window = static_cast<double>(options.kernel[0] * options.kernel[1]);
  graph_builder& b = x.builder();
  const output powered = pow(abs(x), scalar(b, p, x.dtype_of()));
  const output sums = avg_pool2d(powered, sum_opts) * window;
  return pow(sums, scalar(b, 1.0 / p, x.dtype_of()), o);
}

output global_avg_pool(output x, const node_options& o) {
  return reduce_mean(x, spatial_axes(x, "global_avg_pool"), true, o);
}

output global_max_pool(output x, const node_options& o) {
  return reduce_max(x, spatial_axes(x, "global_max_pool"), true, o);
}

}  // namespace loom::ops
