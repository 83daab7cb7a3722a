// The nn ops' rules: pure functions over shapes and attribute values that give matmul's
// dimensions, bias_add's channels, the window geometry of conv2d, conv_transpose2d and the
// pooling ops (and of their gradients), and the fused epilogue's arguments. Shape inference
// (src/graph/ops/nn_*.cpp) calls them with the shapes it knows, and every backend's
// kernels with their inputs at run time, so that all agree on every output size and
// reject the same inputs.
//
// Note [nn rule messages]
// A rule throws loom::invalid_argument; a kernel turns it into its node_error (ctx.fail,
// through common::apply_rule in src/kernel/common/apply_rule.hpp). Shape inference and the
// kernels have always worded some failures differently: a kernel names each tensor with its
// dtype and device ("float32[2, 3] on cpu:0") where inference names the shape it knows
// ("[2, 3]", dimensions -1 when unknown). A rule given an `operand` names it the way its
// caller does: the shape for inference, the tensor for a kernel.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom::nn_rules {

/// An input as a rule sees it: its shape, and its name in messages (Note [nn rule
/// messages]). A view: the shape or tensor must outlive it.
class operand {
 public:
  // Implicit: a rule is called with the shape or the tensor itself.
  operand(const shape& s) noexcept : shape_(&s) {}                        // NOLINT
  operand(const tensor& t) noexcept : shape_(&t.shape()), tensor_(&t) {}  // NOLINT

  [[nodiscard]] const shape& dims() const noexcept { return *shape_; }
  /// True for a kernel's tensor, false for a shape of inference.
  [[nodiscard]] bool is_tensor() const noexcept { return tensor_ != nullptr; }
  /// "float32[2, 3] on cpu:0" for a tensor, "[2, 3]" for a shape.
  [[nodiscard]] std::string name() const {
    return tensor_ != nullptr ? tensor_->describe() : to_string(*shape_);
  }

 private:
  const shape* shape_;
  const tensor* tensor_ = nullptr;
};

// ---- matmul ------------------------------------------------------------------------------

/// matmul's output shape for a and b (batch dims broadcast, then [M, N]) and its inner
/// dimension K.
struct matmul_dims {
  shape out;
  std::int64_t k = 0;
};

/// The dimensions of op(a) @ op(b) (matmul and fused_matmul). Throws invalid_argument when
/// a rank is below 2, the K of a and b differ (both known) or the batch dimensions do not
/// broadcast. At inference, unknown dimensions (-1) stay unknown in the result.
matmul_dims matmul_dims_of(operand a, operand b, bool transpose_a, bool transpose_b);

// ---- bias_add ----------------------------------------------------------------------------

/// True for the data_format "NCHW" (channels in dimension 1), false for "NHWC" (channels
/// last).
inline bool is_nchw(std::string_view data_format) noexcept {
  return data_format == "NCHW";
}

/// The channel dimension of bias_add's input of rank `rank` (>= 2): 1 for NCHW, else the
/// last (NHWC, and a matmul product's columns).
inline std::size_t channel_axis(std::size_t rank, bool nchw) noexcept {
  return nchw ? 1 : rank - 1;
}

/// bias_add's input seen as [outer, channels, inner]: rows of channels for NHWC (inner 1),
/// N planes of channels x inner (the spatial size) for NCHW.
struct bias_add_geometry {
  std::int64_t outer = 1;
  std::int64_t channels = 0;
  std::int64_t inner = 1;
};

/// The geometry of bias_add's input x, checked at run time: x of rank >= 2, a bias of rank
/// 1 and of the channel count's length. Throws invalid_argument.
bias_add_geometry bias_add_geometry_of(const tensor& x, const tensor& bias, bool nchw);

// ---- windows: conv2d and pooling ----------------------------------------------------------

/// [top, bottom, left, right] from a padding attribute of 4 values, or of 2 ([h, w],
/// symmetric). The attribute's validator has checked the length.
inline std::array<std::int64_t, 4> padding4(const std::vector<std::int64_t>& p) {
  if (p.size() == 2) return {p[0], p[0], p[1], p[1]};
  return {p[0], p[1], p[2], p[3]};
}

/// Output size along one spatial dimension: (in + pad0 + pad1 - dilation * (k - 1) - 1) /
/// stride + 1; -1 when `in` or `k` is unknown (-1); -2 when the (dilated) window is larger
/// than the padded input.
inline std::int64_t window_out_size(std::int64_t in, std::int64_t k, std::int64_t stride,
                                    std::int64_t dilation, std::int64_t pad0, std::int64_t pad1) {
  if (in < 0 || k < 0) return -1;
  const std::int64_t span = dilation * (k - 1) + 1;
  const std::int64_t padded = in + pad0 + pad1;
  if (padded < span) return -2;
  return (padded - span) / stride + 1;
}

/// The window attributes of conv2d, its gradients and fused_conv2d.
struct conv_window {
  std::int64_t groups = 1;
  std::array<std::int64_t, 2> stride{1, 1};
  std::array<std::int64_t, 2> dilation{1, 1};
  std::array<std::int64_t, 4> pad{};  // top, bottom, left, right
};

/// The window of the attribute values `groups`, `strides`, `dilations` (2 values each) and
/// `padding` (2 or 4), as the op definitions validate them.
inline conv_window conv_window_of(std::int64_t groups, const std::vector<std::int64_t>& strides,
                                  const std::vector<std::int64_t>& dilations,
                                  const std::vector<std::int64_t>& padding) {
  return {groups,
          {strides.at(0), strides.at(1)},
          {dilations.at(0), dilations.at(1)},
          padding4(padding)};
}

/// A convolution x [n, c, h, w] * filter [o, cg, kh, kw] -> y [n, o, oh, ow], cg = c /
/// groups: what conv2d computes and its gradients differentiate.
struct conv_geometry {
  std::int64_t n, c, h, w;     // input
  std::int64_t o, cg, kh, kw;  // filter
  std::int64_t oh, ow;         // output: window_out_size's (-1 unknown, -2 too large)
  std::int64_t groups;
  std::array<std::int64_t, 2> stride, dilation;
  std::array<std::int64_t, 4> pad;  // top, bottom, left, right

  /// [n, o, oh, ow], or [n, oh, ow, o] for an NHWC conv2d (nchw false).
  [[nodiscard]] shape output_shape(bool nchw = true) const {
    return nchw ? shape{n, o, oh, ow} : shape{n, oh, ow, o};
  }
  /// The channels fit the groups (c = cg * groups, o a multiple of groups) and the window
  /// is not empty: the kernels' check, every dimension known.
  [[nodiscard]] bool fits() const noexcept {
    return c == cg * groups && o % groups == 0 && kh != 0 && kw != 0;
  }
  /// The filter (dilated) fits the padded input: oh and ow are not -2.
  [[nodiscard]] bool window_fits() const noexcept { return oh != -2 && ow != -2; }
};

/// conv2d's activations are NCHW, or NHWC (channels last) under data_format "NHWC"; the
/// filter is OIHW either way, and the geometry is that of the NCHW view. The NCHW view of a
/// rank-4 activation shape `s` (`s` itself when nchw).
inline shape conv_nchw_view(const shape& s, bool nchw) {
  return nchw ? s : shape{s[0], s[3], s[1], s[2]};
}

/// The geometry of input shape `x` and filter shape `w` (rank 4; dimensions may be -1 at
/// inference) under `win`. Checks nothing: callers check fits() and window_fits() with
/// their own messages.
inline conv_geometry conv2d_geometry(const shape& x, const shape& w, const conv_window& win) {
  conv_geometry g{};
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.cg = w[1], g.kh = w[2], g.kw = w[3];
  g.groups = win.groups;
  g.stride = win.stride;
  g.dilation = win.dilation;
  g.pad = win.pad;
  g.oh = window_out_size(g.h, g.kh, g.stride[0], g.dilation[0], g.pad[0], g.pad[1]);
  g.ow = window_out_size(g.w, g.kw, g.stride[1], g.dilation[1], g.pad[2], g.pad[3]);
  return g;
}

// Note [channel blocks]
// Under data_format "NCHW16c" a convolution's activations are oneDNN's nChw16c: the channels
// cut into blocks of 16, each block's 16 values contiguous for every pixel, a tensor
// [n, ceil(c / 16), h, w, 16]; the channels past c (the last block's tail) are zero. It is
// the layout of oneDNN's AVX-512 float32 kernels that were the fastest on most depthwise and
// 1x1 layers here (for dense 3x3 ones, as fast as channels-last), and the conv_layout pass keeps
// chains of such convolutions in it (docs/passes.md). The filter stays OIHW and says how
// many channels there are. The output of a conv2d under "NCHW16c" is in channel blocks, and
// so is its input, unless it has rank 4: then it is NCHW (a first layer of a few channels,
// conv_blocks::output). Blocked tensors come from to_channel_blocks and go back through
// from_channel_blocks; only CPU kernels read them.

/// Channels per block of data_format "NCHW16c".
inline constexpr std::int64_t channel_block = 16;

/// True for the data_format "NCHW16c" (Note [channel blocks]).
inline bool is_channel_blocked(std::string_view data_format) noexcept {
  return data_format == "NCHW16c";
}

/// The blocks that hold c channels (-1 when c is unknown).
inline std::int64_t channel_blocks(std::int64_t c) noexcept {
  return c < 0 ? -1 : (c + channel_block - 1) / channel_block;
}

/// The blocked shape [n, ceil(c / 16), h, w, 16] of an NCHW shape [n, c, h, w].
inline shape blocked_shape(const shape& nchw) {
  return shape{nchw[0], channel_blocks(nchw[1]), nchw[2], nchw[3], channel_block};
}

/// How a CPU convolution computes, whatever layout its tensors are in (Note [channel
/// blocks]): in oneDNN's own choice of layouts (`none`), input and output in channel blocks
/// (`both`: float32 on a CPU whose oneDNN runs AVX-512, cpu_computes_in_channel_blocks; 16
/// input channels or more; one group, depthwise, or groups of whole blocks), or, for a
/// first layer of fewer than 16 input channels and one group, NCHW in and channel blocks out
/// (`output`: oneDNN's first-layer kernel, faster than its channels-last one and with no
/// conversion before the blocks). The kernels and the conv_layout pass ask this one rule, so
/// that a convolution the pass moves into channel blocks runs the primitive it ran before and
/// gives the same bits.
enum class conv_blocks { none, both, output };
conv_blocks conv_channel_blocks(const conv_geometry& g, dtype t);

/// The NCHW view [n, c, h, w] of conv2d's input shape `x` under `data_format`, for a filter
/// of shape `w` (rank 4) in `groups` groups: x itself (NCHW, and NCHW16c's NCHW input of rank
/// 4), x with its channels moved to dimension 1 (NHWC), or for channel blocks [n, blocks,
/// h, w, 16] the channels the filter takes (-1 when w[1] is unknown). Throws
/// invalid_argument when x's rank is not the format's or its blocks do not hold those
/// channels (dimensions of x may be -1 at inference: they are not checked).
shape conv_input_view(const shape& x, const shape& w, std::int64_t groups, std::string_view data_format);

/// conv2d's output shape under `data_format` from its NCHW view [n, o, oh, ow]: itself, in
/// NHWC, or in channel blocks.
shape conv_output_in(const shape& nchw, std::string_view data_format);

/// Whether this machine's CPU convolutions compute in channel blocks at all (defined by the
/// CPU backend: oneDNN's effective instruction set is AVX-512 or wider, and LOOM_MAX_CPU_ISA
/// does not cap loom below it).
bool cpu_computes_in_channel_blocks() noexcept;

/// The window attributes of the pooling ops and their gradients.
struct pool_window {
  std::array<std::int64_t, 2> kernel{};
  std::array<std::int64_t, 2> stride{};
  std::array<std::int64_t, 4> pad{};  // top, bottom, left, right
  /// ONNX's / PyTorch's ceil_mode: output sizes rounded up (Note [pooling ceil_mode]).
  bool ceil_mode = false;
  /// [dilation_h, dilation_w]: window taps this many elements apart (max pooling).
  std::array<std::int64_t, 2> dilation{1, 1};
};

/// The window of the attribute values `kernel` (2 values), `strides` (2, or none: the
/// kernel's), `padding` (2 or 4), ceil_mode and `dilations` (2, or none: 1), as the op
/// definitions validate them.
inline pool_window pool_window_of(const std::vector<std::int64_t>& kernel,
                                  const std::vector<std::int64_t>& strides,
                                  const std::vector<std::int64_t>& padding,
                                  bool ceil_mode = false,
                                  const std::vector<std::int64_t>& dilations = {}) {
  const std::vector<std::int64_t>& s = strides.empty() ? kernel : strides;
  const std::array<std::int64_t, 2> d =
      dilations.empty() ? std::array<std::int64_t, 2>{1, 1}
                        : std::array<std::int64_t, 2>{dilations.at(0), dilations.at(1)};
  return {{kernel.at(0), kernel.at(1)}, {s.at(0), s.at(1)}, padding4(padding), ceil_mode, d};
}

// Note [pooling ceil_mode]
// With ceil_mode the output size along a dimension is ⌈(in + pad0 + pad1 - k) / s⌉ + 1, less
// one when the last window would start at or past in + pad0 (PyTorch's and ONNX Runtime's
// rule: every window starts inside the input or its leading padding). pool2d_geometry
// realises it as extra trailing padding (pad[1], pad[3] grow until the floor formula gives
// that size), so every kernel, forward and backward, oneDNN's and loom's loops alike, runs
// unchanged: max pooling never takes padding, and average pooling without count_include_pad
// counts only the input. Average pooling with count_include_pad would count the extension
// too (PyTorch does not), so that combination is refused.

/// The trailing padding that gives ceil_mode's output size along one dimension (in, k known,
/// in + pad0 + pad1 >= k): pad1, or more.
inline std::int64_t ceil_mode_pad(std::int64_t in, std::int64_t k, std::int64_t stride,
                                  std::int64_t pad0, std::int64_t pad1) {
  const std::int64_t span = in + pad0 + pad1 - k;
  std::int64_t out = (span + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + pad0) --out;
  const std::int64_t need = (out - 1) * stride + k - (in + pad0);
  return need > pad1 ? need : pad1;
}

/// A 2-D pooling window over x [n, c, h, w] giving [n, c, oh, ow] (the forward ops and
/// their gradients share it).
struct pool_geometry {
  std::int64_t n, c, h, w, oh, ow;  // oh, ow: window_out_size's (-1 unknown, -2 too large)
  std::array<std::int64_t, 2> kernel, stride;
  std::array<std::int64_t, 4> pad;  // top, bottom, left, right
  std::array<std::int64_t, 2> dilation{1, 1};

  /// Whether the window's taps are apart (a dilation above 1).
  [[nodiscard]] bool dilated() const noexcept { return dilation[0] != 1 || dilation[1] != 1; }

  /// [n, c, oh, ow].
  [[nodiscard]] shape output_shape() const { return shape{n, c, oh, ow}; }
  /// The window fits the padded input: oh and ow are not -2.
  [[nodiscard]] bool window_fits() const noexcept { return oh != -2 && ow != -2; }
};

/// The geometry of an input shape `x` (rank 4; dimensions may be -1 at inference) under
/// `win`; under ceil_mode its pad holds the extra trailing padding (Note [pooling
/// ceil_mode]). Checks nothing: callers check with their own messages.
inline pool_geometry pool2d_geometry(const shape& x, const pool_window& win) {
  pool_geometry g{};
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kernel = win.kernel;
  g.stride = win.stride;
  g.pad = win.pad;
  g.dilation = win.dilation;
  // The dilated window's extent.
  const std::int64_t span_h = g.dilation[0] * (g.kernel[0] - 1) + 1;
  const std::int64_t span_w = g.dilation[1] * (g.kernel[1] - 1) + 1;
  if (win.ceil_mode) {  // Note [pooling ceil_mode]: more trailing padding
    if (g.h >= 0 && g.h + g.pad[0] + g.pad[1] >= span_h) {
      g.pad[1] = ceil_mode_pad(g.h, span_h, g.stride[0], g.pad[0], g.pad[1]);
    }
    if (g.w >= 0 && g.w + g.pad[2] + g.pad[3] >= span_w) {
      g.pad[3] = ceil_mode_pad(g.w, span_w, g.stride[1], g.pad[2], g.pad[3]);
    }
  }
  g.oh = window_out_size(g.h, g.kernel[0], g.stride[0], g.dilation[0], g.pad[0], g.pad[1]);
  g.ow = window_out_size(g.w, g.kernel[1], g.stride[1], g.dilation[1], g.pad[2], g.pad[3]);
  return g;
}

/// The NCHW view of a pooling input of shape `x`: x itself (NCHW, rank 4) or, `blocked`
/// (data_format "NCHW16c", Note [channel blocks]), [n, blocks x 16, h, w] of the blocks
/// [n, blocks, h, w, 16] (dimensions may be -1 at inference). Throws invalid_argument naming x
/// when its rank (or its blocks) is not the layout's.
shape pool_input_view(const shape& x, bool blocked);

/// Whether a CPU pool (max, or average with or without `include_pad`) over `g` (NCHW; n may
/// be unknown) of dtype `t` gives the same bits computed in channel blocks (Note [channel
/// blocks]; data_format "NCHW16c"), where conv_layout may move it (defined by the CPU
/// backend: float32, a machine that computes convolutions in blocks, a window oneDNN pools
/// with the same implementation in both layouts).
bool cpu_pools_in_channel_blocks(const pool_geometry& g, dtype t, bool max, bool include_pad) noexcept;

// ---- conv_transpose2d ---------------------------------------------------------------------

/// conv_transpose2d's output [n, co, oh, ow] for x [n, ci, h, w] and a filter in ONNX's
/// layout [ci, co / groups, kh, kw] under `win` and `output_padding` ([h, w]):
/// oh = (h - 1) · stride_h - top - bottom + dilation_h · (kh - 1) + 1 + output_padding_h
/// (likewise ow); dimensions stay -1 where what they depend on is unknown. It is the input
/// shape of the conv2d (filter [ci, co / groups, kh, kw], same window) whose output has x's
/// shape, so conv2d_backprop_input computes it. Throws invalid_argument for an input or
/// filter not of rank 4, x's channels differing from the filter's dim 0, channels not
/// dividing into the groups, an empty window, an output_padding not below the stride, an
/// empty image (h or w 0), or an output size below 1.
shape conv_transpose2d_output(operand x, operand w, const conv_window& win,
                              const std::array<std::int64_t, 2>& output_padding);

// ---- resize --------------------------------------------------------------------------------

/// resize's interpolation ("nearest", "linear", "cubic").
enum class resize_mode { nearest, linear, cubic };
/// resize's coordinate_transformation_mode values.
enum class resize_coord {
  half_pixel,
  asymmetric,
  align_corners,
  pytorch_half_pixel,
  tf_half_pixel_for_nearest,
  tf_crop_and_resize
};
/// resize's nearest_mode values.
enum class resize_rounding { round_prefer_floor, round_prefer_ceil, floor, ceil };

/// The values each string attribute of resize takes, in the order of its enum.
inline constexpr std::array<std::string_view, 3> resize_mode_names = {"nearest", "linear", "cubic"};
inline constexpr std::array<std::string_view, 6> resize_coord_names = {
    "half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
    "tf_half_pixel_for_nearest", "tf_crop_and_resize"};
inline constexpr std::array<std::string_view, 4> resize_rounding_names = {
    "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

/// resize's attributes, parsed.
struct resize_params {
  resize_mode mode = resize_mode::nearest;
  resize_coord coord = resize_coord::half_pixel;
  resize_rounding rounding = resize_rounding::round_prefer_floor;
  std::vector<std::int64_t> sizes;
  std::vector<double> scales;  // empty: sizes[d] / in[d]
  /// Mode cubic: the kernel's A (ONNX's cubic_coeff_a).
  double cubic_coeff_a = -0.75;
  /// Taps outside the input get weight 0 and the rest are renormalised (ONNX's
  /// exclude_outside); otherwise they read the nearest edge element.
  bool exclude_outside = false;
  /// tf_crop_and_resize: the region of x resized, as fractions of each dimension: the
  /// starts of every dimension, then the ends (2 * rank values).
  std::vector<double> roi;
  /// tf_crop_and_resize: the value of outputs whose coordinate falls outside x.
  double extrapolation_value = 0.0;
};

/// The attribute values parsed. Throws invalid_argument naming the attribute and the value
/// for a string outside its list.
resize_params resize_params_of(std::string_view mode, std::string_view coord,
                               std::string_view rounding, std::vector<std::int64_t> sizes,
                               std::vector<double> scales);

/// resize's output shape for x (dimensions may be -1 at inference): `sizes`. Throws
/// invalid_argument when sizes or (non-empty) scales do not have x's rank, a scale is not
/// > 0, or a known empty input dimension is to give a non-empty one.
shape resize_output(const shape& x, const resize_params& p);

/// The scale of dimension d (in -> out): scales[d] when given, else out / in.
double resize_scale(const resize_params& p, std::size_t d, std::int64_t in, std::int64_t out);

/// The input coordinate of output index o along a dimension of in -> out elements whose
/// scale is `scale` (ONNX's coordinate transformations; align_corners and
/// pytorch_half_pixel test scale · in == 1, as ONNX's reference). tf_crop_and_resize needs
/// its region: resize_crop_source.
double resize_source(resize_coord c, std::int64_t o, std::int64_t in, double scale);

/// tf_crop_and_resize's input coordinate of output index o along a dimension of in -> out
/// elements whose region is [start, end] (fractions of in - 1): start · (in - 1) + o · (end -
/// start) · (in - 1) / (out - 1), or the region's middle when out is 1. A coordinate outside
/// [0, in - 1] reads extrapolation_value.
double resize_crop_source(std::int64_t o, std::int64_t in, std::int64_t out, double start,
                          double end);

/// The input index nearest to coordinate x under `r` (an integral x is itself), clamped to
/// [0, in).
std::int64_t resize_nearest_index(resize_rounding r, double x, std::int64_t in);

// ---- fused epilogue (fused_matmul, fused_conv2d) ----------------------------------------

/// The activations of a fused epilogue, in the order of activation_names.
enum class activation { none, relu, gelu, gelu_tanh, tanh, sigmoid, clip };

/// The values of the "activation" attribute, in the order of `activation`.
inline constexpr std::array<std::string_view, 7> activation_names = {
    "none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "clip"};

/// The activation named `name`. Throws invalid_argument for another name.
activation activation_of(std::string_view name);

// Note [clip activation]
// Activation "clip" with the attributes clip_min = lo and clip_max = hi is
// minimum(maximum(v, lo), hi) with the element-wise rules (Note [NaN rules] in
// src/kernel/common/elementwise_rules.hpp), v first in both: exactly the unfused
// maximum(v, lo) then minimum(., hi) nodes that ONNX's Clip lowers to, ties and signed zeros
// included (a tie returns the bound: maximum(-0, +0) = +0). Any bounds are accepted and
// mean just that: a NaN bound gives NaN everywhere, lo > hi gives hi everywhere (np.clip's
// answer), an infinite bound leaves v as it is (maximum(v, -inf) = v, NaN included), so a
// lone maximum(v, lo) is clip with hi = +inf and a lone minimum(v, hi) clip with lo = -inf.
// The bounds are values of the node's dtype T: a kernel converts each to T (as a scalar
// constant of T holding it) and compares in T's compute type. The other activations take
// no bounds (both attributes at their defaults, -inf and +inf).

/// Checks clip_min (`lo`) and clip_max (`hi`) against activation `a` (Note [clip
/// activation]): any values for clip; for another activation, lo must be -inf and hi +inf.
/// Throws invalid_argument naming the attribute.
void check_clip_bounds(activation a, double lo, double hi);
/// fused_conv2d's bias_in_sum (the bias a term of the convolution's sum) needs a bias.
/// Throws loom::invalid_argument otherwise.
void check_bias_in_sum(bool bias_in_sum, bool has_bias);

/// A fused node's input count against its attributes: 2 (the core's) + has_bias +
/// has_residual. Throws invalid_argument.
void check_epilogue_inputs(std::size_t inputs, bool has_bias, bool has_residual);

/// At run time: the bias (when not null) is [out[channel]] (blocked, an NCHW16c output: one
/// value per channel, out[channel] blocks of them), the residual (when not null) has shape
/// `out`. Throws invalid_argument.
void check_epilogue_args(const shape& out, std::size_t channel, const tensor* bias,
                         const tensor* residual, bool blocked = false);

}  // namespace loom::nn_rules
