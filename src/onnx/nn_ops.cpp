// ONNX's neural-network ops as loom ops: Conv (1-D and 2-D; groups, dilations, pads,
// auto_pad), pooling, Gemm and MatMul, the normalizations. ONNX's Conv, pooling and
// normalization layouts are loom's (NCHW activations, OIHW filters).
#include <fmt/format.h>

#include <algorithm>

#include <cmath>

#include "importer.hpp"
#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "model_file.hpp"

namespace loom::onnx::detail {
namespace {

// The spatial geometry of a Conv or pooling node, as loom's 2-D ops take it: a 1-D node is
// run as 2-D with a height of 1. A 3-D pooling window keeps ONNX's per-dimension values
// (kernel, strides, dilations of 3; padding of 6, begins then ends): pool3d_lowering runs it
// as two 2-D pools.
struct window {
  bool one_d = false;
  bool three_d = false;
  std::vector<std::int64_t> kernel;     // [kh, kw]
  std::vector<std::int64_t> strides;    // [sh, sw]
  std::vector<std::int64_t> dilations;  // [dh, dw]
  std::vector<std::int64_t> padding;    // loom's [top, bottom, left, right]
};

// Reads kernel_shape (or `kernel` when the weights give it), strides, dilations, pads and
// auto_pad for an input of rank `rank` whose spatial dimensions are `in` (-1 unknown).
window read_window(const node_context& c, std::vector<std::int64_t> kernel,
                   const std::vector<std::int64_t>& in, bool three_d_ok = false) {
  const std::size_t n = in.size();
  if (n != 1 && n != 2 && !(n == 3 && three_d_ok)) {
    c.unsupported(fmt::format("{}-D windows (loom runs 1-D and 2-D{})", n,
                              three_d_ok ? ", and 3-D pooling" : ""));
  }
  auto per_dim = [&](std::string_view name, std::int64_t fallback) {
    auto v = c.attr_ints(name);
    if (v.empty()) v.assign(n, fallback);
    if (v.size() != n) c.fail(fmt::format("{} has {} values for {} spatial dimensions", name, v.size(), n));
    return v;
  };
  if (c.has_attr("kernel_shape")) kernel = c.attr_ints("kernel_shape");
  if (kernel.size() != n) c.fail(fmt::format("kernel_shape has {} values for {} spatial dimensions", kernel.size(), n));
  auto strides = per_dim("strides", 1);
  auto dilations = per_dim("dilations", 1);
  std::vector<std::int64_t> pads = c.attr_ints("pads");
  if (pads.empty()) pads.assign(2 * n, 0);
  if (pads.size() != 2 * n) c.fail(fmt::format("pads has {} values for {} spatial dimensions", pads.size(), n));
  const std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "VALID") {
    pads.assign(2 * n, 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t extent = dilations[i] * (kernel[i] - 1) + 1;
      std::int64_t total = 0;
      if (in[i] >= 0) {
        const std::int64_t out = (in[i] + strides[i] - 1) / strides[i];
        total = std::max<std::int64_t>(0, (out - 1) * strides[i] + extent - in[i]);
      } else if (strides[i] == 1) {
        total = extent - 1;
      } else {
        c.unsupported("auto_pad SAME with a stride above 1 needs the input's spatial size known at import");
      }
      const std::int64_t small = total / 2;
      pads[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      pads[i + n] = total - pads[i];
    }
  } else if (auto_pad != "NOTSET") {
    c.fail(fmt::format("auto_pad '{}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID", auto_pad));
  }
  window w;
  w.one_d = n == 1;
  w.three_d = n == 3;
  if (w.three_d) {
    w.kernel = kernel;
    w.strides = strides;
    w.dilations = dilations;
    w.padding = pads;
  } else if (w.one_d) {
    w.kernel = {1, kernel[0]};
    w.strides = {1, strides[0]};
    w.dilations = {1, dilations[0]};
    w.padding = {0, 0, pads[0], pads[1]};
  } else {
    w.kernel = kernel;
    w.strides = strides;
    w.dilations = dilations;
    w.padding = {pads[0], pads[2], pads[1], pads[3]};
  }
  return w;
}

std::vector<std::int64_t> spatial_dims(const node_context& c, std::size_t i) {
  const std::size_t rank = c.rank(i);
  if (rank < 3) c.fail(fmt::format("input {} has rank {}; a batch, channels and spatial dimensions are needed", i, rank));
  const shape& s = *c.type(i).shape;
  return {s.begin() + 2, s.end()};
}

// A rank-3 tensor seen as rank 4 (a height of 1) for loom's 2-D ops.
output as_2d(const node_context& c, output x, std::string_view suffix) {
  return ops::expand_dims(x, 2, c.aux(suffix));
}

void conv_lowering(node_context& c) {
  const auto in = spatial_dims(c, 0);
  const auto wdims = spatial_dims(c, 1);
  const window w = read_window(c, wdims, in);
  output x = c.in(0);
  output f = c.in(1);
  if (w.one_d) {
    x = as_2d(c, x, "x2d");
    f = as_2d(c, f, "w2d");
  }
  ops::conv2d_options o{.strides = w.strides, .padding = w.padding, .dilations = w.dilations,
                        .groups = c.attr_int("group", 1)};
  // ONNX's B is the convolution's own bias: a term of its sum, where the kernel adds it (as
  // ONNX Runtime and PyTorch do), not a bias_add after the rounded convolution; the session's
  // epilogue fusion may then add a residual and an activation to that node.
  const node_options name = w.one_d ? c.aux("conv") : c.opts();
  output y = c.has(2) ? ops::fused_conv2d(x, f, ops::epilogue{.bias = c.in(2), .bias_in_sum = true}, o, name)
                      : ops::conv2d(x, f, o, name);
  if (w.one_d) y = ops::squeeze(y, {2}, c.opts());
  c.set(0, y);
}

// A 3-D max or average pool as two 2-D ones: over (H, W) of x seen as [N * C, D, H, W], then
// over D of the result seen as [N * C, 1, D, H' * W']. Exact for max pooling (the maximum of
// a box is the maximum over D of the maxima over its (H, W) faces); for average pooling the
// box's count is the product of the per-dimension counts (its part inside the input, or all
// of it with count_include_pad, is a product of intervals), so the mean of means is the
// box's mean, up to rounding.
output pool3d(node_context& c, output x, const window& w, bool max, ops::pool_options o,
              const node_options& result) {
  const shape& s = *x.type().shape;
  for (std::size_t d = 1; d < 5; ++d) {
    if (s[d] < 0) c.unsupported("3-D pooling needs the channels and spatial sizes known at import");
  }
  const auto& k = w.kernel;
  const auto& p = w.padding;
  const auto pool = [&](output v, ops::pool_options po, std::string_view name) {
    return max ? ops::max_pool2d(v, po, c.aux(name)) : ops::avg_pool2d(v, po, c.aux(name));
  };
  o.kernel = {k[1], k[2]};
  o.strides = {w.strides[1], w.strides[2]};
  o.dilations = {w.dilations[1], w.dilations[2]};
  o.padding = {p[1], p[4], p[2], p[5]};
  output hw = pool(ops::reshape(x, {-1, s[2], s[3], s[4]}, c.aux("nc_d_h_w")), o, "pool_hw");
  const shape& hs = *hw.type().shape;  // [N * C, D, H', W']
  o.kernel = {k[0], 1};
  o.strides = {w.strides[0], 1};
  o.dilations = {w.dilations[0], 1};
  o.padding = {p[0], p[3], 0, 0};
  output d = pool(ops::reshape(hw, {-1, 1, hs[1], hs[2] * hs[3]}, c.aux("nc_1_d_hw")), o, "pool_d");
  const shape& ds = *d.type().shape;  // [N * C, 1, D', H' * W']
  return ops::reshape(d, {-1, s[1], ds[2], hs[2], hs[3]}, result);
}

void pool_lowering(node_context& c, bool max) {
  const auto in = spatial_dims(c, 0);
  const window w = read_window(c, {}, in, true);
  if (!max && std::any_of(w.dilations.begin(), w.dilations.end(), [](std::int64_t d) { return d != 1; })) {
    c.unsupported("average pooling with dilations");
  }
  const std::int64_t storage_order = max ? c.attr_int("storage_order", 0) : 0;
  // The Indices output, or a storage_order that would change it: max_pool2d_with_indices.
  const bool indices = max && (c.wants(1) || storage_order != 0);
  if (indices && w.three_d) c.unsupported("the Indices output of a 3-D MaxPool");
  output x = c.in(0);
  const dtype type = x.dtype_of();
  // Integer max pooling runs in double (exact for every int8, uint8 and int32 value).
  const bool widen = max && is_integer(type) && type != dtype::i64;
  if (widen) x = ops::cast(x, dtype::f64, c.aux("wide"));
  if (w.one_d) x = as_2d(c, x, "x2d");
  ops::pool_options o{.kernel = w.kernel,
                      .strides = w.strides,
                      .padding = w.padding,
                      .count_include_pad = c.attr_int("count_include_pad", 0) != 0,
                      .ceil_mode = c.attr_int("ceil_mode", 0) != 0,
                      .dilations = w.dilations};
  const bool last = !w.one_d && !widen;
  const auto opts = last ? c.opts() : c.aux("pool");
  output y;
  if (w.three_d) {
    y = pool3d(c, x, w, max, o, widen ? c.aux("pool3d") : c.opts());
    c.set(0, widen ? ops::cast(y, type, c.opts()) : y);
    return;
  }
  if (indices) {
    auto [values, where] = ops::max_pool2d_with_indices(x, o, storage_order, opts);
    y = values;
    // A 1-D window's index into [N, C, 1, L] is its index into [N, C, L], in either order.
    if (w.one_d) where = ops::squeeze(where, {2}, c.aux("indices"));
    if (c.wants(1)) c.set(1, where);
  } else {
    y = max ? ops::max_pool2d(x, o, opts) : ops::avg_pool2d(x, o, opts);
  }
  if (w.one_d) y = ops::squeeze(y, {2}, widen ? c.aux("squeeze") : c.opts());
  if (widen) y = ops::cast(y, type, c.opts());
  c.set(0, y);
}

void lp_pool_lowering(node_context& c) {
  const auto in = spatial_dims(c, 0);
  const window w = read_window(c, {}, in);
  if (w.dilations != std::vector<std::int64_t>{1, 1}) c.unsupported("LpPool with dilations");
  output x = c.in(0);
  if (w.one_d) x = as_2d(c, x, "x2d");
  ops::pool_options o{.kernel = w.kernel, .strides = w.strides, .padding = w.padding};
  output y = ops::lp_pool2d(x, static_cast<double>(c.attr_int("p", 2)), o, w.one_d ? c.aux("pool") : c.opts());
  if (w.one_d) y = ops::squeeze(y, {2}, c.opts());
  c.set(0, y);
}

void gemm_lowering(node_context& c) {
  const bool ta = c.attr_int("transA", 0) != 0;
  const bool tb = c.attr_int("transB", 0) != 0;
  const double alpha = c.attr_float("alpha", 1.0F);
  const double beta = c.attr_float("beta", 1.0F);
  const bool bias = c.has(2) && beta != 0.0;
  const dtype t = c.type(0).type;
  output y = ops::matmul(c.in(0), c.in(1), ta, tb, bias || alpha != 1.0 ? c.aux("matmul") : c.opts());
  if (alpha != 1.0) y = ops::mul(y, c.scalar(alpha, t, "alpha"), bias ? c.aux("scaled") : c.opts());
  if (bias) {
    output b = c.in(2);
    if (beta != 1.0) b = ops::mul(b, c.scalar(beta, t, "beta"), c.aux("bias_scaled"));
    const auto& bs = b.type().shape;
    const auto& ys = y.type().shape;
    // A bias along the columns is loom's bias_add, which the epilogue pass fuses.
    const bool row_bias = bs && ys && ys->rank() == 2 &&
                          (bs->rank() == 1 || (bs->rank() == 2 && (*bs)[0] == 1)) &&
                          (*bs)[bs->rank() - 1] == (*ys)[1] && (*ys)[1] >= 0;
    if (row_bias && bs->rank() == 2) b = ops::reshape(b, {-1}, c.aux("bias_row"));
    y = row_bias ? ops::bias_add(y, b, "NHWC", c.opts()) : ops::add(y, b, c.opts());
  }
  c.set(0, y);
}

void matmul_lowering(node_context& c) {
  output a = c.in(0);
  output b = c.in(1);
  const std::size_t ra = c.rank(0);
  const std::size_t rb = c.rank(1);
  if (ra == 1) a = ops::expand_dims(a, 0, c.aux("a2d"));
  if (rb == 1) b = ops::expand_dims(b, 1, c.aux("b2d"));
  const bool squeeze = ra == 1 || rb == 1;
  output y = ops::matmul(a, b, false, false, squeeze ? c.aux("matmul") : c.opts());
  if (squeeze) {
    const auto r = static_cast<std::int64_t>(y.type().shape->rank());
    std::vector<std::int64_t> axes;
    if (ra == 1) axes.push_back(r - 2);
    if (rb == 1) axes.push_back(r - 1);
    y = ops::squeeze(y, axes, c.opts());
  }
  c.set(0, y);
}

// A per-channel vector [C] reshaped to [C, 1, ..., 1] to broadcast over an NCHW input of
// rank `rank`.
tensor channel_column(const std::vector<double>& v, dtype t, std::size_t rank) {
  shape s = shape::filled(rank - 1, 1);
  s[0] = static_cast<std::int64_t>(v.size());
  tensor out = memory::host_tensor(t, s);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::f64) out.data<double>()[i] = v[i];
    else out.data<float>()[i] = static_cast<float>(v[i]);
  }
  return out;
}

// The elements of a float32 or float64 tensor.
std::vector<double> doubles(const tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.num_elements()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = *element_as_double(t, static_cast<std::int64_t>(i));
  }
  return out;
}

// A per-channel vector [C] as [C, 1, ..., 1] for an input of rank `rank`.
output channel_view(const node_context& c, output v, std::size_t rank, std::string_view name) {
  std::vector<std::int64_t> dims(rank - 1, 1);
  dims[0] = -1;
  return ops::reshape(v, dims, c.aux(name));
}

// BatchNormalization written in loom's ops: s * (x - mean) / sqrt(var + eps) + bias, as
// ONNX's reference; in training mode over the batch's statistics, with the running
// statistics as outputs 1 and 2.
void batch_norm_composed(node_context& c, std::size_t rank, double epsilon) {
  const output x = c.in(0);
  const dtype t = x.dtype_of();
  const bool training = c.attr_int("training_mode", 0) != 0;
  output mean = channel_view(c, c.in(3), rank, "mean");
  output var = channel_view(c, c.in(4), rank, "var");
  if (training) {
    std::vector<std::int64_t> axes{0};
    for (std::size_t i = 2; i < rank; ++i) axes.push_back(static_cast<std::int64_t>(i));
    mean = ops::reduce_mean(x, axes, true, c.aux("batch_mean"));
    const output d = ops::sub(x, mean, c.aux("batch_centered"));
    var = ops::reduce_mean(ops::square(d, c.aux("batch_square")), axes, true, c.aux("batch_var"));
    const double momentum = c.attr_float("momentum", 0.9F);
    auto running = [&](std::size_t input, output batch, std::string_view name) {
      const output old = ops::mul(c.in(input), c.scalar(momentum, t, fmt::format("{}_momentum", name)),
                                  c.aux(fmt::format("{}_old", name)));
      const output flat = ops::reshape(batch, {-1}, c.aux(fmt::format("{}_flat", name)));
      const output now = ops::mul(flat, c.scalar(1.0 - momentum, t, fmt::format("{}_rest", name)),
                                  c.aux(fmt::format("{}_new", name)));
      return ops::add(old, now, c.aux(fmt::format("running_{}", name)));
    };
    if (c.wants(1)) c.set(1, running(3, mean, "mean"));
    if (c.wants(2)) c.set(2, running(4, var, "var"));
  } else {
    for (std::size_t i = 1; i < c.num_outputs(); ++i) {
      if (c.wants(i)) c.fail("outputs 1 and 2 (running statistics) exist in training mode only");
    }
  }
  const output scaled = ops::mul(channel_view(c, c.in(1), rank, "scale"), ops::sub(x, mean, c.aux("centered")),
                                 c.aux("scaled"));
  const output std = ops::sqrt(ops::add(var, c.scalar(epsilon, t, "epsilon"), c.aux("var_eps")), c.aux("std"));
  c.set(0, ops::add(ops::div(scaled, std, c.aux("normalized")), channel_view(c, c.in(2), rank, "bias"), c.opts()));
}

void batch_norm_lowering(node_context& c) {
  const std::size_t rank = c.rank(0);
  if (rank < 2) c.fail(fmt::format("input has rank {}; at least 2 needed", rank));
  const double epsilon = c.attr_float("epsilon", 1e-5F);
  const dtype t = c.type(0).type;
  const tensor* scale = c.constant(1);
  const tensor* bias = c.constant(2);
  const tensor* mean = c.constant(3);
  const tensor* var = c.constant(4);
  const bool known = scale && bias && mean && var && (t == dtype::f32 || t == dtype::f64) &&
                     scale->type() == t && bias->type() == t && mean->type() == t && var->type() == t &&
                     c.attr_int("training_mode", 0) == 0;
  if (!known) {
    if (c.attr_int("training_mode", 0) == 0 && c.num_outputs() == 1) {
      c.set(0, ops::batch_norm(c.in(0), c.in(1), c.in(2), c.in(3), c.in(4), epsilon, c.opts()));
    } else {
      batch_norm_composed(c, rank, epsilon);
    }
    return;
  }
  // y = x * a + b per channel, a = scale / sqrt(var + eps), b = bias - mean * a (in double).
  const auto s = doubles(*scale);
  const auto bi = doubles(*bias);
  const auto m = doubles(*mean);
  const auto v = doubles(*var);
  if (bi.size() != s.size() || m.size() != s.size() || v.size() != s.size()) {
    c.fail("scale, B, input_mean and input_var differ in length");
  }
  std::vector<double> a(s.size());
  std::vector<double> b(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    a[i] = s[i] / std::sqrt(v[i] + epsilon);
    b[i] = bi[i] - m[i] * a[i];
  }
  const output scaled = ops::mul(c.in(0), c.constant_node(channel_column(a, t, rank), "a"), c.aux("scaled"));
  c.set(0, ops::add(scaled, c.constant_node(channel_column(b, t, rank), "b"), c.opts()));
}

void layer_norm_lowering(node_context& c) {
  const auto rank = static_cast<std::int64_t>(c.rank(0));
  const std::int64_t axis = normalize_axis(c, c.attr_int("axis", -1), rank);
  const double epsilon = c.attr_float("epsilon", 1e-5F);
  const output scale = c.in(1);
  output bias;
  if (c.has(2)) {
    bias = c.in(2);
  } else {
    const auto& s = scale.type().shape;
    if (!s || !s->is_fully_defined()) c.unsupported("a LayerNormalization without B needs Scale's shape known");
    bias = ops::zeros(c.b(), scale.dtype_of(), *s, c.aux("zero_bias"));
  }
  const auto r = ops::layer_norm(c.in(0), scale, bias, axis, epsilon, c.opts());
  c.set(0, r.y);
  // Mean and InvStdDev: loom's are x.shape[:axis]; ONNX keeps the normalized dimensions as 1,
  // in the stash type (float32 unless stash_type says otherwise).
  const auto stash = dtype_of(static_cast<std::int32_t>(c.attr_int("stash_type", 1)), "stash_type");
  auto statistic = [&](output v, std::string_view name) {
    for (std::int64_t i = axis; i < rank; ++i) v = ops::expand_dims(v, i, c.aux(fmt::format("{}_{}", name, i)));
    return v.dtype_of() == stash ? v : ops::cast(v, stash, c.aux(fmt::format("{}_stash", name)));
  };
  if (c.wants(1)) c.set(1, statistic(r.mean, "mean"));
  if (c.wants(2)) c.set(2, statistic(r.rstd, "inv_std_dev"));
}

void lp_norm_lowering(node_context& c) {
  const std::int64_t p = c.attr_int("p", 2);
  const std::int64_t axis = c.attr_int("axis", -1);
  const output x = c.in(0);
  output norm;
  if (p == 2) {
    norm = ops::sqrt(ops::reduce_sum(ops::square(x, c.aux("square")), {axis}, true, c.aux("sum")), c.aux("norm"));
  } else if (p == 1) {
    norm = ops::reduce_sum(ops::abs(x, c.aux("abs")), {axis}, true, c.aux("norm"));
  } else {
    c.fail(fmt::format("p = {} (1 or 2)", p));
  }
  c.set(0, ops::div(x, norm, c.opts()));
}

// Note [3-D transposed convolution]
// loom's transposed convolution is 2-D. A 3-D one is a sum over the filter's depth taps kd:
// input depth slice id, through the 2-D transposed convolution with the filter's slice kd,
// lands on output depth id * stride + kd * dilation (before the depth padding is cut). So
// the input's depth is folded into the batch ([N, C, D, H, W] -> [N * D, C, H, W]), each kd
// gives one 2-D transposed convolution, its D slices are spread `stride` apart (zeros
// between), shifted by kd * dilation and padded to the full depth, the kd terms are added
// in order, and the depth padding is cut off. Needs the input's channels and spatial size
// known at import (the batch may be symbolic).
output conv_transpose3d(node_context& c, const std::vector<std::int64_t>& in,
                        const std::vector<std::int64_t>& kernel,
                        const std::vector<std::int64_t>& strides,
                        const std::vector<std::int64_t>& dilations,
                        const std::vector<std::int64_t>& pads,
                        const std::vector<std::int64_t>& output_padding) {
  const shape& xs = *c.type(0).shape;
  const auto ws = c.type(1).shape;
  const std::int64_t group = c.attr_int("group", 1);
  if (xs[1] < 0 || in[0] < 0 || in[1] < 0 || in[2] < 0 || !ws || (*ws)[1] < 0) {
    c.unsupported("a 3-D ConvTranspose needs the input's channels and spatial size and the weights' shape known at import");
  }
  const std::int64_t channels = xs[1];
  const std::int64_t depth = in[0];
  const std::int64_t out_channels = (*ws)[1] * group;
  // The 2-D part's output size, and the depth before and after its padding is cut.
  auto extent = [&](std::size_t i) {
    return strides[i] * (in[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1;
  };
  const std::int64_t oh = extent(1) - pads[1] - pads[4];
  const std::int64_t ow = extent(2) - pads[2] - pads[5];
  const std::int64_t full_depth = extent(0);
  const std::int64_t out_depth = full_depth - pads[0] - pads[3];
  if (oh <= 0 || ow <= 0 || out_depth <= 0) {
    c.fail(fmt::format("the padding leaves an output of {}x{}x{}", out_depth, oh, ow));
  }
  const std::int64_t spread = (depth - 1) * strides[0] + 1;  // input slices stride apart
  const ops::conv2d_options o{.strides = {strides[1], strides[2]},
                              .padding = {pads[1], pads[4], pads[2], pads[5]},
                              .dilations = {dilations[1], dilations[2]},
                              .groups = group};
  const output folded = ops::reshape(ops::transpose(c.in(0), {0, 2, 1, 3, 4}, c.aux("depth_major")),
                                     {-1, channels, in[1], in[2]}, c.aux("fold_depth"));
  output sum;
  for (std::int64_t kd = 0; kd < kernel[0]; ++kd) {
    auto name = [&](std::string_view what) { return c.aux(fmt::format("kd{}_{}", kd, what)); };
    const output wk = ops::squeeze(ops::slice(c.in(1), {0, 0, kd, 0, 0}, {-1, -1, 1, -1, -1}, name("w")),
                                   {2}, name("w2d"));
    output y = ops::conv_transpose2d(folded, wk, o, {output_padding[1], output_padding[2]}, name("conv"));
    y = ops::reshape(y, {-1, depth, out_channels, oh, ow}, name("unfold"));
    if (strides[0] > 1) {
      y = ops::pad(ops::expand_dims(y, 2, name("slot")), {0, 0, 0, 0, 0, strides[0] - 1, 0, 0, 0, 0, 0, 0},
                   0.0, name("stride_zeros"));
      y = ops::reshape(y, {-1, depth * strides[0], out_channels, oh, ow}, name("spread"));
      y = ops::slice(y, {0, 0, 0, 0, 0}, {-1, spread, -1, -1, -1}, name("spread_cut"));
    }
    const std::int64_t before = kd * dilations[0];
    y = ops::pad(y, {0, 0, before, full_depth - before - spread, 0, 0, 0, 0, 0, 0}, 0.0, name("place"));
    sum = kd == 0 ? y : ops::add(sum, y, name("sum"));
  }
  output y = ops::slice(sum, {0, pads[0], 0, 0, 0}, {-1, out_depth, -1, -1, -1}, c.aux("cut_pads"));
  const bool bias = c.has(2);
  y = ops::transpose(y, {0, 2, 1, 3, 4}, bias ? c.aux("ncdhw") : c.opts());
  if (bias) y = ops::add(y, ops::reshape(c.in(2), {out_channels, 1, 1, 1}, c.aux("bias4d")), c.opts());
  return y;
}

void conv_transpose_lowering(node_context& c) {
  const auto in = spatial_dims(c, 0);
  const std::size_t n = in.size();
  if (n < 1 || n > 3) c.unsupported(fmt::format("{}-D ConvTranspose (loom runs 1-D, 2-D and 3-D)", n));
  const auto wdims = spatial_dims(c, 1);
  auto per_dim = [&](std::string_view name, std::int64_t fallback) {
    auto v = c.attr_ints(name);
    if (v.empty()) v.assign(n, fallback);
    if (v.size() != n) c.fail(fmt::format("{} has {} values for {} spatial dimensions", name, v.size(), n));
    return v;
  };
  const auto kernel = c.has_attr("kernel_shape") ? c.attr_ints("kernel_shape") : wdims;
  if (kernel.size() != n) c.fail(fmt::format("kernel_shape has {} values for {} spatial dimensions", kernel.size(), n));
  const auto strides = per_dim("strides", 1);
  const auto dilations = per_dim("dilations", 1);
  auto output_padding = per_dim("output_padding", 0);
  std::vector<std::int64_t> pads = c.attr_ints("pads");
  if (pads.empty()) pads.assign(2 * n, 0);
  if (pads.size() != 2 * n) c.fail(fmt::format("pads has {} values for {} spatial dimensions", pads.size(), n));
  const std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  std::vector<std::int64_t> output_shape = c.attr_ints("output_shape");
  if (output_shape.size() > n) output_shape.erase(output_shape.begin(), output_shape.end() - static_cast<std::ptrdiff_t>(n));
  if (output_shape.empty() && (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")) {
    for (std::size_t i = 0; i < n; ++i) output_shape.push_back(in[i] < 0 ? -1 : in[i] * strides[i]);
  }
  if (!output_shape.empty()) {
    // ONNX's rule: the padding that gives output_shape, split as auto_pad says (SAME_UPPER
    // puts the odd one at the end); an output larger than the unpadded one grows
    // output_padding instead.
    if (output_shape.size() != n) c.fail(fmt::format("output_shape has {} values", output_shape.size()));
    for (std::size_t i = 0; i < n; ++i) {
      if (in[i] < 0) c.unsupported("output_shape needs the input's spatial size known at import");
      const std::int64_t total = strides[i] * (in[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 -
                                 output_shape[i];
      if (total < 0) {
        output_padding[i] -= total;
        pads[i] = pads[i + n] = 0;
        continue;
      }
      const bool upper = auto_pad != "SAME_LOWER";
      pads[i] = upper ? total / 2 : total - total / 2;
      pads[i + n] = total - pads[i];
    }
  } else if (auto_pad == "VALID") {
    pads.assign(2 * n, 0);
  } else if (auto_pad != "NOTSET") {
    c.fail(fmt::format("auto_pad '{}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID", auto_pad));
  }
  if (n == 3) {
    c.set(0, conv_transpose3d(c, in, kernel, strides, dilations, pads, output_padding));
    return;
  }
  // As 2-D: a 1-D transposed convolution has a height of 1.
  const bool one_d = n == 1;
  const ops::conv2d_options o{
      .strides = one_d ? std::vector<std::int64_t>{1, strides[0]} : strides,
      .padding = one_d ? std::vector<std::int64_t>{0, 0, pads[0], pads[1]}
                       : std::vector<std::int64_t>{pads[0], pads[2], pads[1], pads[3]},
      .dilations = one_d ? std::vector<std::int64_t>{1, dilations[0]} : dilations,
      .groups = c.attr_int("group", 1)};
  const output x = one_d ? as_2d(c, c.in(0), "x2d") : c.in(0);
  const output w = one_d ? as_2d(c, c.in(1), "w2d") : c.in(1);
  const bool last = !c.has(2) && !one_d;
  const std::vector<std::int64_t> extra =
      one_d ? std::vector<std::int64_t>{0, output_padding[0]} : std::vector<std::int64_t>{output_padding[0], output_padding[1]};
  output y = ops::conv_transpose2d(x, w, o, extra, last ? c.opts() : c.aux("conv"));
  if (c.has(2)) y = ops::bias_add(y, c.in(2), "NCHW", one_d ? c.aux("bias") : c.opts());
  if (one_d) y = ops::squeeze(y, {2}, c.opts());
  c.set(0, y);
}

void resize_lowering(node_context& c) {
  const std::string mode = c.attr_string("mode", "nearest");
  const std::string transform = c.attr_string("coordinate_transformation_mode", "half_pixel");
  const auto rank = c.rank(0);
  const shape& in = *c.type(0).shape;
  // tf_crop_and_resize: the region (input 1), starts then ends, known at import.
  std::vector<double> roi;
  const bool crop = transform == "tf_crop_and_resize";
  if (crop) {
    const tensor* r = c.has(1) ? c.constant(1) : nullptr;
    if (r == nullptr && c.has(1)) c.require_value(1, "roi");
    if (r == nullptr || (r->type() != dtype::f32 && r->type() != dtype::f64)) {
      c.unsupported("tf_crop_and_resize needs its roi as float values known at import");
    }
    roi = doubles(*r);
    if (roi.size() != 2 * rank) c.fail(fmt::format("a roi of {} values for a rank-{} input", roi.size(), rank));
  }
  std::vector<std::int64_t> sizes;
  std::vector<double> scales;
  const std::size_t scales_input = 2;
  if (c.has(3)) {
    sizes = c.ints(3, "sizes");
  } else {
    const tensor* s = c.constant(scales_input);
    if (s == nullptr) c.require_value(scales_input, "scales");
    if (s == nullptr || s->type() != dtype::f32) c.unsupported("scales must be float32 values known at import");
    for (std::int64_t i = 0; i < s->num_elements(); ++i) scales.push_back(s->data<float>()[i]);
    if (scales.size() != rank) c.fail(fmt::format("{} scales for a rank-{} input", scales.size(), rank));
    for (std::size_t i = 0; i < rank; ++i) {
      if (in[i] < 0) c.unsupported("scales need the input's shape known at import");
      // tf_crop_and_resize scales the region, not the whole dimension.
      const double extent = crop ? roi[rank + i] - roi[i] : 1.0;
      sizes.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(in[i]) * extent * scales[i])));
    }
  }
  if (sizes.size() != rank) c.fail(fmt::format("{} sizes for a rank-{} input", sizes.size(), rank));
  ops::resize_options o{.sizes = sizes,
                        .mode = mode,
                        .coordinate_transformation_mode = transform,
                        .nearest_mode = c.attr_string("nearest_mode", "round_prefer_floor"),
                        .scales = scales,
                        .cubic_coeff_a = c.attr_float("cubic_coeff_a", -0.75F),
                        .exclude_outside = c.attr_int("exclude_outside", 0) != 0,
                        .roi = roi,
                        .extrapolation_value = c.attr_float("extrapolation_value", 0.0F)};
  c.set(0, ops::resize(c.in(0), o, c.opts()));
}

// (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes`, as ONNX's function body.
void mvn_lowering(node_context& c) {
  const auto axes = c.attr_ints("axes", {0, 2, 3});
  const output x = c.in(0);
  const output mean = ops::reduce_mean(x, axes, true, c.aux("mean"));
  const output mean_sq = ops::reduce_mean(ops::square(x, c.aux("square")), axes, true, c.aux("mean_square"));
  const output var = ops::sub(mean_sq, ops::square(mean, c.aux("mean_squared")), c.aux("variance"));
  const output std = ops::add(ops::sqrt(var, c.aux("std")), c.scalar(1e-9, x.dtype_of(), "epsilon"), c.aux("std_eps"));
  c.set(0, ops::div(ops::sub(x, mean, c.aux("centered")), std, c.opts()));
}

void global_lp_pool_lowering(node_context& c) {
  const std::int64_t p = c.attr_int("p", 2);
  const std::size_t rank = c.rank(0);
  std::vector<std::int64_t> axes;
  for (std::size_t i = 2; i < rank; ++i) axes.push_back(static_cast<std::int64_t>(i));
  const output x = c.in(0);
  if (p == 1) {
    c.set(0, ops::reduce_sum(ops::abs(x, c.aux("abs")), axes, true, c.opts()));
  } else if (p == 2) {
    c.set(0, ops::sqrt(ops::reduce_sum(ops::square(x, c.aux("square")), axes, true, c.aux("sum")), c.opts()));
  } else {
    c.unsupported(fmt::format("p = {} (1 or 2)", p));
  }
}

}  // namespace

void add_nn_ops(op_table& t) {
  t["MeanVarianceNormalization"] = {mvn_lowering, {"reduce_mean"}};
  t["GlobalLpPool"] = {global_lp_pool_lowering, {"reduce_sum"}};
  t["Conv"] = {conv_lowering, {"conv2d", "fused_conv2d"}};
  t["MaxPool"] = {[](node_context& c) { pool_lowering(c, true); },
                  {"max_pool2d", "max_pool2d_with_indices"}};
  t["AveragePool"] = {[](node_context& c) { pool_lowering(c, false); }, {"avg_pool2d"}};
  t["GlobalAveragePool"] = {[](node_context& c) { c.set(0, ops::global_avg_pool(c.in(0), c.opts())); },
                            {"reduce_mean"}};
  t["GlobalMaxPool"] = {[](node_context& c) { c.set(0, ops::global_max_pool(c.in(0), c.opts())); },
                        {"reduce_max"}};
  t["LpPool"] = {lp_pool_lowering, {"avg_pool2d"}};
  t["InstanceNormalization"] = {[](node_context& c) {
                                  c.set(0, ops::instance_norm(c.in(0), c.in(1), c.in(2),
                                                              c.attr_float("epsilon", 1e-5F), c.opts()));
                                },
                                {"reduce_mean"}};
  t["DepthToSpace"] = {[](node_context& c) {
                         c.set(0, ops::depth_to_space(c.in(0), c.attr_int("blocksize", 0),
                                                      c.attr_string("mode", "DCR"), c.opts()));
                       },
                       {"transpose"}};
  t["SpaceToDepth"] = {[](node_context& c) {
                         c.set(0, ops::space_to_depth(c.in(0), c.attr_int("blocksize", 0), c.opts()));
                       },
                       {"transpose"}};
  t["Gemm"] = {gemm_lowering, {"matmul", "bias_add"}};
  t["MatMul"] = {matmul_lowering, {"matmul"}};
  t["BatchNormalization"] = {batch_norm_lowering, {"mul", "add"}};
  t["LayerNormalization"] = {layer_norm_lowering, {"layer_norm"}};
  t["LpNormalization"] = {lp_norm_lowering, {"reduce_sum"}};
  t["ConvTranspose"] = {conv_transpose_lowering, {"conv_transpose2d"}};
  t["Resize"] = {resize_lowering, {"resize"}};
}

}  // namespace loom::onnx::detail
