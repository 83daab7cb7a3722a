// Neural-network ops: matmul, bias_add, conv2d, conv_transpose2d, max_pool2d,
// max_pool2d_with_indices, avg_pool2d,
// resize, the gradients of conv2d and the pooling ops (the backward ops the symbolic
// gradients build on), and matmul and conv2d with a fused epilogue (bias, residual,
// activation); conv1d and the global pooling builders, composed of those.
//
// Layouts follow PyTorch for images (NCHW activations, OIHW filters) and TensorFlow for
// bias_add (the bias runs along the last dimension unless data_format is "NCHW"). On CPU
// the float32 and bfloat16 kernels call oneDNN; float64 (and what oneDNN lacks on the
// machine) runs loom's reference loops. The op definitions (attributes,
// inference) are in src/graph/ops/nn_ops.cpp and nn_fused_ops.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// a @ b. Rank 2 ([M, K] x [K, N] -> [M, N]) or batched: the leading dimensions broadcast
/// NumPy-style ([B, M, K] x [K, N], [B, M, K] x [B, K, N], [1, M, K] x [B, K, N], ...).
/// transpose_a / transpose_b swap the last two dimensions of that input first. Float types
/// only. Throws loom::invalid_argument (naming both shapes) when the inner dimensions differ.
output matmul(output a, output b, bool transpose_a = false, bool transpose_b = false,
              const node_options& o = {});

/// x + bias along the channel dimension: the last one for data_format "NHWC" (the default,
/// TensorFlow's), dimension 1 for "NCHW". x has rank >= 2, bias rank 1.
output bias_add(output x, output bias, const std::string& data_format = "NHWC",
                const node_options& o = {});

/// Attributes of conv2d. Sizes count elements; a dilation of 1 is no dilation.
struct conv2d_options {
  /// [stride_h, stride_w], each >= 1.
  std::vector<std::int64_t> strides{1, 1};
  /// [top, bottom, left, right] (or [h, w] for symmetric padding), each >= 0.
  std::vector<std::int64_t> padding{0, 0, 0, 0};
  /// [dilation_h, dilation_w], each >= 1.
  std::vector<std::int64_t> dilations{1, 1};
  /// Channel groups: input channels and filters both divide by it (groups == channels is
  /// a depthwise convolution).
  std::int64_t groups = 1;
  /// conv2d and fused_conv2d: "NCHW" activations, or "NHWC" (x [N, H, W, C], y [N, OH, OW,
  /// O]; the filter stays OIHW). The gradient ops take NCHW only.
  std::string data_format = "NCHW";
};

/// 2-D convolution (cross-correlation, as every framework computes it) of x [N, C, H, W]
/// with filter w [O, C / groups, KH, KW]: y [N, O, OH, OW],
/// OH = (H + top + bottom - dilation_h * (KH - 1) - 1) / stride_h + 1 (likewise OW).
/// With options.data_format "NHWC", x is [N, H, W, C] and y [N, OH, OW, O] (the same
/// numbers, channels last: what oneDNN computes in without reordering).
/// Throws loom::invalid_argument for channel counts that do not fit the groups or the
/// filter, and for a filter larger than the padded input.
output conv2d(output x, output w, const conv2d_options& options = {}, const node_options& o = {});

/// The gradient of conv2d(x, w, options) with respect to x: dx [N, C, H, W] =
/// `input_shape` from dy [N, O, OH, OW] and the filter w [O, C / groups, KH, KW] (the
/// transposed convolution). conv2d of `input_shape` with w must give dy's shape; its N and
/// C may be -1 (taken from dy and w), H and W must be known. Throws loom::invalid_argument
/// naming the shapes when they do not fit (at construction where they are known, else a
/// loom::node_error at run time).
output conv2d_backprop_input(output dy, output w, shape input_shape,
                             const conv2d_options& options = {}, const node_options& o = {});

/// The gradient of conv2d(x, w, options) with respect to w: dw [O, C / groups, KH, KW] =
/// `filter_shape` from x [N, C, H, W] and dy [N, O, OH, OW]. conv2d of x with a filter of
/// `filter_shape` must give dy's shape; its O and C / groups may be -1 (taken from dy and
/// x), KH and KW must be known. Errors as conv2d_backprop_input.
output conv2d_backprop_filter(output x, output dy, shape filter_shape,
                              const conv2d_options& options = {}, const node_options& o = {});

/// 2-D transposed convolution (ONNX ConvTranspose, PyTorch's ConvTranspose2d) of x
/// [N, C_in, H, W] with a filter w in ONNX's layout [C_in, C_out / groups, KH, KW]:
/// y [N, C_out, OH, OW], OH = (H - 1) · stride_h - top - bottom + dilation_h · (KH - 1) + 1
/// + output_padding[0] (likewise OW). `options` are conv2d's (padding [top, bottom, left,
/// right] or [h, w], as conv2d's: the padding of the conv2d whose gradient this is), each
/// output_padding ([h, w]) smaller than its stride. It is conv2d_backprop_input of x by w
/// (oneDNN's backward-data on CPU); differentiable with respect to x (a conv2d of dy) and w
/// (a conv2d_backprop_filter). Throws loom::invalid_argument naming the shapes for channels
/// that do not fit the filter or the groups, an output_padding not below the stride, or
/// padding that leaves no output.
output conv_transpose2d(output x, output w, const conv2d_options& options = {},
                        std::vector<std::int64_t> output_padding = {0, 0},
                        const node_options& o = {});

/// Inverted dropout for training: each element of x kept with probability 1 - rate and
/// scaled by 1 / (1 - rate), else 0, the mask drawn by random_uniform_per_run with `seed` (a
/// new mask on every run, reproducible from the seed; float types, x's shape fully known).
/// rate in [0, 1): 0 gives x. Built of random_uniform_per_run, greater_equal, where and mul,
/// so its gradient is dy through the same mask, scaled. Throws loom::invalid_argument for a rate outside [0, 1) or a shape not
/// fully known.
output dropout(output x, double rate, std::int64_t seed, const node_options& o = {});
/// dropout's output (named by `o`) and its mask: bool, true where x was kept (all true for
/// rate 0), as ONNX's Dropout returns them.
std::pair<output, output> dropout_with_mask(output x, double rate, std::int64_t seed,
                                            const node_options& o = {});

/// 1-D convolution of x [N, C, L] with filter w [O, C / groups, K]: y [N, O, OL], built as
/// conv2d over [N, C, 1, L] (expand_dims, conv2d, squeeze), so its gradient is conv2d's.
/// `stride`, `dilation` >= 1; `padding` is [left, right] (or one value for both).
output conv1d(output x, output w, std::int64_t stride = 1, std::vector<std::int64_t> padding = {0},
              std::int64_t dilation = 1, std::int64_t groups = 1, const node_options& o = {});

/// Attributes of the pooling ops.
struct pool_options {
  /// [kh, kw], each >= 1 (required).
  std::vector<std::int64_t> kernel;
  /// [sh, sw]; empty means the kernel size.
  std::vector<std::int64_t> strides;
  /// [top, bottom, left, right] (or [h, w]), each smaller than the kernel.
  std::vector<std::int64_t> padding{0, 0, 0, 0};
  /// avg_pool2d only: divide by the whole window (true) or by the elements inside the
  /// input (false, the default, TensorFlow's "SAME" behaviour).
  bool count_include_pad = false;
  /// Output sizes rounded up, as ONNX's and PyTorch's ceil_mode: OH = ⌈(H + top + bottom -
  /// kh) / sh⌉ + 1, less one when the last window would start past the input and its top
  /// padding. Not with count_include_pad (an error naming the node).
  bool ceil_mode = false;
  /// max_pool2d only (avg_pool2d takes [1, 1]): [dh, dw], window taps dh rows and dw
  /// columns apart (ONNX MaxPool's dilations); the window then spans d · (k - 1) + 1.
  std::vector<std::int64_t> dilations{1, 1};
};

/// Maximum over each window of x [N, C, H, W] (padding never wins):
/// y [N, C, OH, OW], OH = (H + top + bottom - kh) / sh + 1.
output max_pool2d(output x, const pool_options& options, const node_options& o = {});
/// The outputs of max_pool2d_with_indices.
struct max_pool2d_with_indices_outputs {
  /// max_pool2d(x, options), bit for bit, by max pooling's rule (docs/training.md) in
  /// every dtype: a window with nothing above -inf gives -inf, where max_pool2d's oneDNN
  /// path (float32, bfloat16) gives the lowest finite value.
  output values;
  /// int64, values' shape: where in x each maximum is, as an index into x flattened.
  output indices;
};
/// max_pool2d with ONNX MaxPool's Indices output: each window's maximum (max_pool2d's, NaN
/// never wins) and the index of the element holding it, the first in row-major window order
/// among equal maxima (a window of NaN and -inf alone gives its first element). With
/// storage_order 0 the index of x[n, c, h, w] is ((n · C + c) · H + h) · W + w; with 1
/// (column-major planes) (n · C + c) · H · W + w · H + h. A window holding no element of x
/// (possible only with dilations over padding) gives -inf and index -1. Float types, CPU.
/// Differentiable through values (max_pool2d's gradient). storage_order other than 0 or 1
/// throws loom::invalid_argument naming the node, as max_pool2d's shape errors do.
max_pool2d_with_indices_outputs max_pool2d_with_indices(output x, const pool_options& options,
                                                        std::int64_t storage_order = 0,
                                                        const node_options& o = {});
/// Mean over each window of x [N, C, H, W]; shapes as max_pool2d.
output avg_pool2d(output x, const pool_options& options, const node_options& o = {});

/// The gradient of max_pool2d(x, options): dx shaped as x, where each window's dy goes to
/// the position of the window's maximum (the first in row-major window order on ties;
/// padding never wins), summed where windows overlap. dy must have max_pool2d's output
/// shape; throws loom::invalid_argument naming both shapes otherwise.
output max_pool2d_grad(output x, output dy, const pool_options& options,
                       const node_options& o = {});

/// The gradient of avg_pool2d over an input of `input_shape`: dx, where each window's dy is
/// divided by the window's count (as the forward, count_include_pad included) and added to
/// every input position in it. `input_shape`'s N and C may be -1 (taken from dy), H and W
/// must be known; avg_pool2d over it must give dy's shape.
output avg_pool2d_grad(output dy, shape input_shape, const pool_options& options,
                       const node_options& o = {});

/// ONNX LpPool: (Σ over each window of |x|^p)^(1/p), zero padding counted as zeros; built
/// as avg_pool2d(|x|^p, count_include_pad) · kh · kw, then ^(1/p) (differentiable where the
/// window's sum is not 0). `options` as avg_pool2d's (count_include_pad ignored); p >= 1.
output lp_pool2d(output x, double p, const pool_options& options, const node_options& o = {});

/// The mean over every spatial dimension (2 onwards) of x [N, C, ...], keeping them as size
/// 1 (ONNX GlobalAveragePool): reduce_mean over dims 2.. with keepdims. x's rank must be known
/// (>= 3).
output global_avg_pool(output x, const node_options& o = {});
/// The maximum over every spatial dimension, as global_avg_pool (ONNX GlobalMaxPool).
output global_max_pool(output x, const node_options& o = {});

/// ONNX DepthToSpace of x [N, C, H, W]: y [N, C / b², H · b, W · b], b = `blocksize`, the
/// channels read as [b, b, C / b²] (mode "DCR", the default) or [C / b², b, b] ("CRD").
/// Built of reshape and transpose (differentiable). x's C, H and W must be known; throws
/// loom::invalid_argument when b² does not divide C or the mode is another.
output depth_to_space(output x, std::int64_t blocksize, const std::string& mode = "DCR",
                      const node_options& o = {});
/// ONNX SpaceToDepth, the inverse of depth_to_space "DCR": x [N, C, H, W] to
/// [N, C · b², H / b, W / b]; b must divide H and W.
output space_to_depth(output x, std::int64_t blocksize, const node_options& o = {});

/// Attributes of resize (ONNX Resize, without tf_crop_and_resize).
struct resize_options {
  /// The output shape, one size per dimension of x (required).
  std::vector<std::int64_t> sizes;
  /// "nearest", "linear" or "cubic" (separable interpolation along every resized dimension;
  /// cubic with ONNX's kernel of parameter cubic_coeff_a).
  std::string mode = "nearest";
  /// "half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
  /// "tf_half_pixel_for_nearest" or "tf_crop_and_resize" (the region `roi` of x, stretched
  /// to `sizes`): how an output index maps to an input coordinate.
  std::string coordinate_transformation_mode = "half_pixel";
  /// For mode "nearest": "round_prefer_floor", "round_prefer_ceil", "floor" or "ceil".
  std::string nearest_mode = "round_prefer_floor";
  /// Optional: one scale per dimension (each > 0), used by the coordinate transform in place
  /// of sizes[d] / x.shape[d] (ONNX's scales input, when the sizes were derived from it).
  std::vector<double> scales;
  /// Mode cubic: the kernel's A (ONNX's cubic_coeff_a; PyTorch's bicubic is -0.75).
  double cubic_coeff_a = -0.75;
  /// Interpolation taps outside the input get weight 0, the others renormalised (ONNX's
  /// exclude_outside); by default they read the nearest edge element.
  bool exclude_outside = false;
  /// tf_crop_and_resize: the region, as fractions of each dimension (starts of every
  /// dimension, then ends: 2 values per dimension of x).
  std::vector<double> roi;
  /// tf_crop_and_resize: the value of outputs whose coordinate falls outside x.
  double extrapolation_value = 0.0;
};

/// ONNX Resize (opset 13+ semantics) of x (float types) to `sizes`: along each dimension
/// whose size or scale changes, output index o maps to an input coordinate by the
/// coordinate transformation, then takes the nearest element (nearest_mode), interpolates
/// the two neighbours linearly or the four cubically (indices clamped to the edges unless
/// exclude_outside). No gradient. Throws
/// loom::invalid_argument naming the node for sizes of another rank than x, an unknown mode,
/// scales of the wrong length or not positive, or a non-empty output from an empty input
/// dimension.
output resize(output x, const resize_options& options, const node_options& o = {});

/// The epilogue of a fused matmul or conv2d: y = activation(core + bias + residual), the
/// bias and the residual optional.
struct epilogue {
  /// Rank 1: [N] (the last dimension of a matmul's product, broadcast over its rows, as
  /// bias_add "NHWC") or [C_out] (the channels of a conv2d's output: dimension 1 of NCHW,
  /// as bias_add "NCHW", the last of NHWC).
  std::optional<output> bias;
  /// Exactly the core's output shape, added element-wise.
  std::optional<output> residual;
  /// "none", "relu", "gelu" (erf form), "gelu_tanh" (the tanh approximation), "tanh",
  /// "sigmoid" or "clip"; the same functions as ops::relu, ops::gelu, ops::tanh,
  /// ops::sigmoid, and for "clip" ops::minimum(ops::maximum(v, clip_min), clip_max) with
  /// scalar constants of the dtype (NaN propagates, a tie gives the bound; any bounds: a
  /// NaN one gives NaN, clip_min > clip_max gives clip_max).
  std::string activation = "none";
  /// The bounds of "clip" (an infinite one clips nothing); the other activations take
  /// only these defaults.
  double clip_min = -std::numeric_limits<double>::infinity();
  double clip_max = std::numeric_limits<double>::infinity();
  /// fused_conv2d only: the bias is a term of the convolution's own sum (ONNX's Conv B,
  /// PyTorch's conv2d bias), added where the convolution's kernel adds it (within the sum:
  /// oneDNN's bias argument), not to the rounded convolution as a bias_add after it: the
  /// same value but for rounding. The residual and the activation follow as always.
  bool bias_in_sum = false;
};

/// activation(matmul(a, b, transpose_a, transpose_b) + bias + residual) as one node
/// (`fused_matmul`), which the CPU runs as one oneDNN primitive with post-ops where it can.
/// Shapes and dtypes as matmul (float types). The node: inputs a, b, then the list `args`
/// (the bias, then the residual, those given); attributes T, transpose_a, transpose_b,
/// has_bias, has_residual, activation, clip_min, clip_max, and num_args = has_bias +
/// has_residual. Throws loom::invalid_argument naming the shapes for what matmul rejects, a
/// bias that is not [N], a residual that is not the product's shape, an unknown activation,
/// clip bounds with an activation other than "clip", and bias_in_sum (a convolution's).
output fused_matmul(output a, output b, const epilogue& e, bool transpose_a = false,
                    bool transpose_b = false, const node_options& o = {});

/// activation(conv2d(x, w, options) + bias + residual) as one node (`fused_conv2d`). Shapes
/// and dtypes as conv2d (NCHW or NHWC); the bias is [C_out], the residual the output's
/// shape. The node:
/// inputs input, filter, then `args` as fused_matmul's; conv2d's attributes, the
/// epilogue's, and bias_in_sum (which needs a bias). Errors as conv2d's, and as
/// fused_matmul's for the epilogue.
output fused_conv2d(output x, output w, const epilogue& e, const conv2d_options& options = {},
                    const node_options& o = {});

}  // namespace loom::ops
