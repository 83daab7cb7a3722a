// The nn ops' rules that format messages (include/loom/graph/ops/nn_rules.hpp).
#include "loom/graph/ops/nn_rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

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

shape conv_transpose2d_output(operand x, operand w, const conv_window& win,
                              const std::array<std::int64_t, 2>& output_padding) {
  const shape& sx = x.dims();
  const shape& sw = w.dims();
  if (sx.rank() != 4) {
    throw invalid_argument(
        fmt::format("conv_transpose2d needs an NCHW input of rank 4, got {}", x.name()));
  }
  if (sw.rank() != 4) {
    throw invalid_argument(fmt::format(
        "conv_transpose2d needs a filter [C_in, C_out / groups, kH, kW] of rank 4, got {}",
        w.name()));
  }
  const std::int64_t g = win.groups;
  const auto describe = [&] {
    return fmt::format("input {}, filter {}, groups {}", x.name(), w.name(), g);
  };
  if (sx[1] >= 0 && sw[0] >= 0 && sx[1] != sw[0]) {
    throw invalid_argument(fmt::format(
        "the input has {} channels but the filter's dimension 0 is {} ({})", sx[1], sw[0],
        describe()));
  }
  const std::int64_t ci = sx[1] >= 0 ? sx[1] : sw[0];
  if (ci >= 0 && ci % g != 0) {
    throw invalid_argument(
        fmt::format("input channels {} do not divide into {} groups ({})", ci, g, describe()));
  }
  if (sw[2] == 0 || sw[3] == 0) {
    throw invalid_argument(fmt::format("empty filter window ({})", describe()));
  }
  for (std::size_t d = 0; d < 2; ++d) {
    if (output_padding[d] >= win.stride[d]) {
      throw invalid_argument(fmt::format("output_padding [{}, {}] must be smaller than the "
                                         "strides [{}, {}]",
                                         output_padding[0], output_padding[1], win.stride[0],
                                         win.stride[1]));
    }
  }
  shape out{sx[0], sw[1] >= 0 ? sw[1] * g : -1, -1, -1};
  for (std::size_t d = 0; d < 2; ++d) {
    const std::int64_t in = sx[2 + d];
    const std::int64_t k = sw[2 + d];
    if (in == 0) throw invalid_argument(fmt::format("empty image ({})", describe()));
    if (in < 0 || k < 0) continue;
    const std::int64_t size = (in - 1) * win.stride[d] - win.pad[2 * d] - win.pad[2 * d + 1] +
                              win.dilation[d] * (k - 1) + 1 + output_padding[d];
    if (size < 1) {
      throw invalid_argument(fmt::format(
          "the padding [{}] leaves no output along dimension {} ({})", fmt::join(win.pad, ", "),
          2 + d, describe()));
    }
    out[2 + d] = size;
  }
  return out;
}

namespace {

// The index of `value` in `names`, or a failure naming the attribute.
template <class E, std::size_t N>
E parse_choice(const std::array<std::string_view, N>& names, std::string_view value,
               const char* attr) {
  const auto* it = std::find(names.begin(), names.end(), value);
  if (it == names.end()) {
    throw invalid_argument(fmt::format("{} must be one of \"{}\", got \"{}\"", attr,
                                       fmt::join(names, "\", \""), value));
  }
  return static_cast<E>(it - names.begin());
}

}  // namespace

resize_params resize_params_of(std::string_view mode, std::string_view coord,
                               std::string_view rounding, std::vector<std::int64_t> sizes,
                               std::vector<double> scales) {
  resize_params p;
  p.mode = parse_choice<resize_mode>(resize_mode_names, mode, "mode");
  p.coord = parse_choice<resize_coord>(resize_coord_names, coord,
                                       "coordinate_transformation_mode");
  p.rounding = parse_choice<resize_rounding>(resize_rounding_names, rounding, "nearest_mode");
  p.sizes = std::move(sizes);
  p.scales = std::move(scales);
  return p;
}

shape resize_output(const shape& x, const resize_params& p) {
  if (p.sizes.size() != x.rank()) {
    throw invalid_argument(fmt::format("sizes [{}] must have one size per dimension of x {}",
                                       fmt::join(p.sizes, ", "), to_string(x)));
  }
  if (!p.scales.empty() && p.scales.size() != x.rank()) {
    throw invalid_argument(fmt::format("scales [{}] must have one scale per dimension of x {}",
                                       fmt::join(p.scales, ", "), to_string(x)));
  }
  for (const double sc : p.scales) {
    if (!(sc > 0.0)) {
      throw invalid_argument(fmt::format("scales [{}] must all be > 0", fmt::join(p.scales, ", ")));
    }
  }
  if (p.coord == resize_coord::tf_crop_and_resize && p.roi.size() != 2 * x.rank()) {
    throw invalid_argument(fmt::format(
        "tf_crop_and_resize needs a roi of 2 values per dimension of x {} (starts, then ends), "
        "got [{}]",
        to_string(x), fmt::join(p.roi, ", ")));
  }
  for (std::size_t d = 0; d < x.rank(); ++d) {
    if (x[d] == 0 && p.sizes[d] > 0) {
      throw invalid_argument(fmt::format("x {} is empty along dimension {}: nothing to resize "
                                         "to {} elements",
                                         to_string(x), d, p.sizes[d]));
    }
  }
  return shape(p.sizes);
}

double resize_scale(const resize_params& p, std::size_t d, std::int64_t in, std::int64_t out) {
  if (!p.scales.empty()) return p.scales[d];
  return static_cast<double>(out) / static_cast<double>(in);
}

double resize_source(resize_coord c, std::int64_t o, std::int64_t in, double scale) {
  const auto x = static_cast<double>(o);
  const double out_len = scale * static_cast<double>(in);
  switch (c) {
    case resize_coord::half_pixel:
      return (x + 0.5) / scale - 0.5;
    case resize_coord::asymmetric:
      return x / scale;
    case resize_coord::align_corners:
      return out_len == 1.0 ? 0.0 : x * static_cast<double>(in - 1) / (out_len - 1.0);
    case resize_coord::pytorch_half_pixel:
      return out_len == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5;
    case resize_coord::tf_half_pixel_for_nearest:
      return (x + 0.5) / scale;
    case resize_coord::tf_crop_and_resize:
      break;  // resize_crop_source: it needs the region
  }
  return x;
}

double resize_crop_source(std::int64_t o, std::int64_t in, std::int64_t out, double start,
                          double end) {
  const auto last = static_cast<double>(in - 1);
  if (out == 1) return 0.5 * (start + end) * last;
  return start * last + static_cast<double>(o) * (end - start) * last / static_cast<double>(out - 1);
}

std::int64_t resize_nearest_index(resize_rounding r, double x, std::int64_t in) {
  const double f = std::floor(x);
  const double frac = x - f;
  bool up = false;
  if (frac != 0.0) {
    switch (r) {
      case resize_rounding::round_prefer_floor:
        up = frac > 0.5;
        break;
      case resize_rounding::round_prefer_ceil:
        up = frac >= 0.5;
        break;
      case resize_rounding::floor:
        up = false;
        break;
      case resize_rounding::ceil:
        up = true;
        break;
    }
  }
  const double i = up ? f + 1.0 : f;
  if (!(i > 0.0)) return 0;
  if (i >= static_cast<double>(in - 1)) return in - 1;
  return static_cast<std::int64_t>(i);
}

activation activation_of(std::string_view name) {
  const auto* it = std::find(activation_names.begin(), activation_names.end(), name);
  if (it == activation_names.end()) {
    throw invalid_argument("unknown activation \"" + std::string(name) + "\"");
  }
  return static_cast<activation>(it - activation_names.begin());
}

void check_bias_in_sum(bool bias_in_sum, bool has_bias) {
  if (bias_in_sum && !has_bias) throw invalid_argument("bias_in_sum = true needs a bias (has_bias = false)");
}

void check_clip_bounds(activation a, double lo, double hi) {
  if (a == activation::clip) return;
  constexpr double inf = std::numeric_limits<double>::infinity();
  const auto name = activation_names[static_cast<std::size_t>(a)];
  if (!(lo == -inf)) {
    throw invalid_argument(fmt::format(
        "clip_min = {} is given, but activation \"{}\" takes no bounds (only \"clip\" does)", lo,
        name));
  }
  if (!(hi == inf)) {
    throw invalid_argument(fmt::format(
        "clip_max = {} is given, but activation \"{}\" takes no bounds (only \"clip\" does)", hi,
        name));
  }
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
                         const tensor* residual, bool blocked) {
  if (bias != nullptr &&
      (bias->rank() != 1 || (blocked ? channel_blocks(bias->dim(0)) : bias->dim(0)) != out[channel])) {
    throw invalid_argument(
        blocked ? fmt::format("bias {} does not fill the {} channel blocks of the NCHW16c output {}",
                              bias->describe(), out[channel], to_string(out))
                : fmt::format("bias {} does not match the {} channels (dimension {}) of the output {}",
                              bias->describe(), out[channel], channel, to_string(out)));
  }
  if (residual != nullptr && residual->shape() != out) {
    throw invalid_argument(fmt::format("residual {} must have the output's shape {}",
                                       residual->describe(), to_string(out)));
  }
}

shape conv_input_view(const shape& x, const shape& w, std::int64_t groups, std::string_view data_format) {
  const bool blocked = is_channel_blocked(data_format) && x.rank() != 4;
  const std::size_t rank = blocked ? 5 : 4;
  if (x.rank() != rank) {
    throw invalid_argument(fmt::format("conv2d needs an {} input of rank {}{}, got {}", data_format, rank,
                                       is_channel_blocked(data_format) ? " (or an NCHW one of rank 4)" : "",
                                       to_string(x)));
  }
  if (!blocked) return conv_nchw_view(x, data_format != "NHWC");
  // Note [channel blocks]: the filter says how many channels the blocks hold.
  const std::int64_t channels = w[1] >= 0 ? w[1] * groups : -1;
  if ((x[4] >= 0 && x[4] != channel_block) ||
      (channels >= 0 && x[1] >= 0 && x[1] != channel_blocks(channels))) {
    throw invalid_argument(fmt::format("the NCHW16c input {} does not hold the {} channels the filter {} takes "
                                       "in {} groups ({} blocks of {})",
                                       to_string(x), channels, to_string(w), groups, channel_blocks(channels),
                                       channel_block));
  }
  return shape{x[0], channels, x[2], x[3]};
}

shape pool_input_view(const shape& x, bool blocked) {
  if (!blocked) {
    if (x.rank() != 4) throw invalid_argument(fmt::format("pooling needs an NCHW input of rank 4, got {}", to_string(x)));
    return x;
  }
  if (x.rank() != 5 || x[4] != channel_block) {
    throw invalid_argument(fmt::format(
        "pooling in channel blocks (NCHW16c) needs an input [n, blocks, h, w, 16], got {}", to_string(x)));
  }
  return shape{x[0], x[1] < 0 ? -1 : x[1] * channel_block, x[2], x[3]};
}

shape conv_output_in(const shape& nchw, std::string_view data_format) {
  if (is_channel_blocked(data_format)) return blocked_shape(nchw);
  return data_format == "NHWC" ? shape{nchw[0], nchw[2], nchw[3], nchw[1]} : nchw;
}

conv_blocks conv_channel_blocks(const conv_geometry& g, dtype t) {
  if (t != dtype::f32 || g.c < 0 || !cpu_computes_in_channel_blocks()) return conv_blocks::none;
  if (g.c < channel_block) {
    return g.groups == 1 && g.o >= channel_block ? conv_blocks::output : conv_blocks::none;
  }
  const bool depthwise = g.cg == 1 && g.o == g.groups;
  const bool whole_blocks = g.cg % channel_block == 0 && (g.o / g.groups) % channel_block == 0;
  return g.groups == 1 || depthwise || whole_blocks ? conv_blocks::both : conv_blocks::none;
}

}  // namespace loom::nn_rules
