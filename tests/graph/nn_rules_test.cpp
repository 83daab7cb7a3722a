// The nn ops' rules (loom/graph/ops/nn_rules.hpp) on their own: matmul's dims with transposes
// and batch broadcasting as numpy.matmul gives them, bias_add's channel geometry, conv2d and
// pooling output sizes with padding, stride and dilation as torch.nn.functional.conv2d and
// max_pool2d give them, the fused epilogue's checks, and the exact messages of every
// failure, worded for inference (shapes) or a kernel (tensors) (Note [nn rule messages]).
#include "loom/graph/ops/nn_rules.hpp"

#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using pad4 = std::array<std::int64_t, 4>;
using pair2 = std::array<std::int64_t, 2>;
using rules_test::host_tensor;
using rules_test::message_of;
namespace rules = nn_rules;
constexpr std::int64_t u = shape::unknown;

tensor f32(shape s) {
  return host_tensor(dtype::f32, std::move(s));
}

// ---- matmul ------------------------------------------------------------------------------

TEST(NnRules, MatmulDimsWithTransposes) {
  const auto plain = rules::matmul_dims_of(shape({2, 3}), shape({3, 4}), false, false);
  EXPECT_EQ(plain.out, shape({2, 4}));
  EXPECT_EQ(plain.k, 3);
  // a.T of a [3, 2], b.T of b [4, 3].
  EXPECT_EQ(rules::matmul_dims_of(shape({3, 2}), shape({3, 4}), true, false).out, shape({2, 4}));
  EXPECT_EQ(rules::matmul_dims_of(shape({2, 3}), shape({4, 3}), false, true).out, shape({2, 4}));
  const auto both = rules::matmul_dims_of(shape({3, 2}), shape({4, 3}), true, true);
  EXPECT_EQ(both.out, shape({2, 4}));
  EXPECT_EQ(both.k, 3);
  // K = 0 gives zeros of [M, N].
  const auto empty_k = rules::matmul_dims_of(shape({2, 0}), shape({0, 4}), false, false);
  EXPECT_EQ(empty_k.out, shape({2, 4}));
  EXPECT_EQ(empty_k.k, 0);
}

TEST(NnRules, MatmulBroadcastsBatchDims) {
  // numpy.matmul of (5, 1, 2, 3) and (4, 3, 6) is (5, 4, 2, 6).
  const auto d = rules::matmul_dims_of(shape({5, 1, 2, 3}), shape({4, 3, 6}), false, false);
  EXPECT_EQ(d.out, shape({5, 4, 2, 6}));
  EXPECT_EQ(d.k, 3);
  EXPECT_EQ(rules::matmul_dims_of(shape({0, 2, 3}), shape({3, 4}), false, false).out,
            shape({0, 2, 4}));
  EXPECT_EQ(rules::matmul_dims_of(shape({0, 2, 3}), shape({1, 3, 4}), false, false).out,
            shape({0, 2, 4}));
  EXPECT_EQ(message_of([] {
              return rules::matmul_dims_of(shape({2, 2, 3}), shape({3, 3, 4}), false, false);
            }),
            "batch dimensions of a [2, 2, 3] and b [3, 3, 4] do not broadcast");
}

TEST(NnRules, MatmulKeepsUnknownDimsAtInference) {
  const auto d = rules::matmul_dims_of(shape({u, 2, 3}), shape({3, u}), false, false);
  EXPECT_EQ(d.out, shape({u, 2, u}));
  EXPECT_EQ(d.k, 3);
  // An unknown K is not checked; the K reported is a's.
  const auto unknown_k = rules::matmul_dims_of(shape({2, u}), shape({3, 4}), false, false);
  EXPECT_EQ(unknown_k.out, shape({2, 4}));
  EXPECT_EQ(unknown_k.k, u);
}

TEST(NnRules, MatmulFailuresAtInferenceAndInKernels) {
  // Unlike numpy.matmul, vectors are not promoted.
  EXPECT_EQ(message_of([] {
              return rules::matmul_dims_of(shape({3}), shape({3, 4}), false, false);
            }),
            "matmul needs inputs of rank >= 2, got a [3] and b [3, 4]");
  EXPECT_EQ(message_of([] {
              return rules::matmul_dims_of(shape({2, 4}), shape({3, 5}), false, false);
            }),
            "inner dimensions differ: a [2, 4] has K = 4, b [3, 5] has K = 3");
  EXPECT_EQ(message_of([] {
              return rules::matmul_dims_of(shape({4, 2}), shape({5, 3}), true, true);
            }),
            "inner dimensions differ: a [4, 2] (transposed) has K = 4, b [5, 3] (transposed) has "
            "K = 3");
  // A kernel names tensors, and does not mark the transposed operand.
  const tensor a = f32(shape({2, 4}));
  const tensor b = f32(shape({5, 3}));
  EXPECT_EQ(message_of([&] { return rules::matmul_dims_of(a, b, false, true); }),
            "inner dimensions differ: a float32[2, 4] on cpu:0 has K = 4, b "
            "float32[5, 3] on cpu:0 has K = 3");
  const tensor v = f32(shape({4}));
  EXPECT_EQ(message_of([&] { return rules::matmul_dims_of(a, v, false, false); }),
            "matmul needs inputs of rank >= 2, got a float32[2, 4] on cpu:0 and b "
            "float32[4] on cpu:0");
  const auto ok = rules::matmul_dims_of(f32(shape({3, 2, 4})), f32(shape({4, 5})), false, false);
  EXPECT_EQ(ok.out, shape({3, 2, 5}));
  EXPECT_EQ(ok.k, 4);
}

// ---- bias_add ----------------------------------------------------------------------------

TEST(NnRules, BiasAddChannels) {
  EXPECT_TRUE(rules::is_nchw("NCHW"));
  EXPECT_FALSE(rules::is_nchw("NHWC"));
  EXPECT_FALSE(rules::is_nchw("nchw"));
  EXPECT_EQ(rules::channel_axis(4, true), 1u);
  EXPECT_EQ(rules::channel_axis(4, false), 3u);
  EXPECT_EQ(rules::channel_axis(2, false), 1u);

  const auto nchw = rules::bias_add_geometry_of(f32(shape({2, 3, 4, 5})), f32(shape({3})), true);
  EXPECT_EQ(nchw.outer, 2);
  EXPECT_EQ(nchw.channels, 3);
  EXPECT_EQ(nchw.inner, 20);
  const auto nhwc = rules::bias_add_geometry_of(f32(shape({2, 3, 4, 5})), f32(shape({5})), false);
  EXPECT_EQ(nhwc.outer, 24);
  EXPECT_EQ(nhwc.channels, 5);
  EXPECT_EQ(nhwc.inner, 1);
  // A matrix: its columns, whatever the format says.
  for (bool format : {true, false}) {
    const auto m = rules::bias_add_geometry_of(f32(shape({6, 4})), f32(shape({4})), format);
    EXPECT_EQ(m.outer, 6);
    EXPECT_EQ(m.channels, 4);
    EXPECT_EQ(m.inner, 1);
  }
  const auto no_rows = rules::bias_add_geometry_of(f32(shape({0, 3})), f32(shape({3})), false);
  EXPECT_EQ(no_rows.outer, 0);
  EXPECT_EQ(no_rows.channels, 3);
}

TEST(NnRules, BiasAddFailures) {
  EXPECT_EQ(message_of([] {
              return rules::bias_add_geometry_of(f32(shape({4})), f32(shape({4})), false);
            }),
            "bias_add needs an input of rank >= 2 and a bias of rank 1, got float32[4] on "
            "cpu:0 and float32[4] on cpu:0");
  EXPECT_EQ(message_of([] {
              return rules::bias_add_geometry_of(f32(shape({2, 4})), f32(shape({1, 4})), false);
            }),
            "bias_add needs an input of rank >= 2 and a bias of rank 1, got float32[2, 4] on "
            "cpu:0 and float32[1, 4] on cpu:0");
  EXPECT_EQ(message_of([] {
              return rules::bias_add_geometry_of(f32(shape({2, 3, 4, 5})), f32(shape({4})), true);
            }),
            "bias float32[4] on cpu:0 does not match the 3 channels of input "
            "float32[2, 3, 4, 5] on cpu:0");
}

// ---- windows -----------------------------------------------------------------------------

TEST(NnRules, PaddingAndWindowOutputSizes) {
  EXPECT_EQ(rules::padding4({1, 2}), pad4({1, 1, 2, 2}));
  EXPECT_EQ(rules::padding4({1, 2, 3, 4}), pad4({1, 2, 3, 4}));

  // floor((in + pad0 + pad1 - dilation * (k - 1) - 1) / stride) + 1, as torch computes it.
  EXPECT_EQ(rules::window_out_size(5, 3, 1, 1, 0, 0), 3);
  EXPECT_EQ(rules::window_out_size(5, 3, 2, 1, 1, 1), 3);
  EXPECT_EQ(rules::window_out_size(6, 3, 2, 1, 0, 0), 2);  // the last partial window drops
  EXPECT_EQ(rules::window_out_size(7, 3, 1, 2, 0, 0), 3);  // dilated span 5
  EXPECT_EQ(rules::window_out_size(4, 3, 1, 1, 2, 0), 4);  // one-sided padding
  EXPECT_EQ(rules::window_out_size(2, 3, 1, 1, 1, 0), 1);  // padding makes it fit
  EXPECT_EQ(rules::window_out_size(0, 1, 1, 1, 1, 1), 2);  // a padded empty input
  // Windows larger than the padded input: -2.
  EXPECT_EQ(rules::window_out_size(2, 3, 1, 1, 0, 0), -2);
  EXPECT_EQ(rules::window_out_size(5, 3, 1, 3, 0, 0), -2);  // dilated span 7
  EXPECT_EQ(rules::window_out_size(0, 1, 1, 1, 0, 0), -2);
  // Unknown input or window: -1.
  EXPECT_EQ(rules::window_out_size(u, 3, 1, 1, 0, 0), -1);
  EXPECT_EQ(rules::window_out_size(5, u, 1, 1, 0, 0), -1);
}

TEST(NnRules, ConvWindowAndGeometry) {
  const auto win = rules::conv_window_of(2, {2, 2}, {1, 1}, {1, 1});
  EXPECT_EQ(win.groups, 2);
  EXPECT_EQ(win.stride, pair2({2, 2}));
  EXPECT_EQ(win.dilation, pair2({1, 1}));
  EXPECT_EQ(win.pad, pad4({1, 1, 1, 1}));
  EXPECT_EQ(rules::conv_window_of(1, {1, 2}, {3, 1}, {0, 1, 2, 3}).pad, pad4({0, 1, 2, 3}));

  // conv2d(x [1, 4, 8, 8], w [6, 2, 3, 3], stride=2, padding=1, groups=2) is [1, 6, 4, 4].
  const auto g = rules::conv2d_geometry(shape({1, 4, 8, 8}), shape({6, 2, 3, 3}), win);
  EXPECT_EQ(g.output_shape(), shape({1, 6, 4, 4}));
  EXPECT_EQ(g.cg, 2);
  EXPECT_EQ(g.groups, 2);
  EXPECT_TRUE(g.fits());
  EXPECT_TRUE(g.window_fits());

  // conv2d(x [2, 3, 10, 12], w [8, 3, 3, 3], dilation=(2, 3)) is [2, 8, 6, 6].
  const auto dilated = rules::conv2d_geometry(shape({2, 3, 10, 12}), shape({8, 3, 3, 3}),
                                              rules::conv_window_of(1, {1, 1}, {2, 3}, {0, 0}));
  EXPECT_EQ(dilated.output_shape(), shape({2, 8, 6, 6}));
  EXPECT_TRUE(dilated.fits());
}

TEST(NnRules, ConvGeometryThatDoesNotFit) {
  const auto plain = rules::conv_window_of(1, {1, 1}, {1, 1}, {0, 0});
  // Channels: c = cg * groups, and o a multiple of groups.
  EXPECT_FALSE(rules::conv2d_geometry(shape({1, 3, 5, 5}), shape({4, 2, 3, 3}), plain).fits());
  EXPECT_FALSE(rules::conv2d_geometry(shape({1, 4, 5, 5}), shape({5, 2, 3, 3}),
                                      rules::conv_window_of(2, {1, 1}, {1, 1}, {0, 0}))
                   .fits());
  EXPECT_FALSE(rules::conv2d_geometry(shape({1, 3, 5, 5}), shape({4, 3, 0, 3}), plain).fits());
  // A window larger than the input, until padding makes room.
  const auto big = rules::conv2d_geometry(shape({1, 1, 2, 2}), shape({1, 1, 3, 3}), plain);
  EXPECT_EQ(big.oh, -2);
  EXPECT_EQ(big.ow, -2);
  EXPECT_TRUE(big.fits());
  EXPECT_FALSE(big.window_fits());
  const auto padded = rules::conv2d_geometry(shape({1, 1, 2, 2}), shape({1, 1, 3, 3}),
                                             rules::conv_window_of(1, {1, 1}, {1, 1}, {1, 1}));
  EXPECT_EQ(padded.output_shape(), shape({1, 1, 2, 2}));
  EXPECT_TRUE(padded.window_fits());
  // Only one side too small.
  EXPECT_FALSE(
      rules::conv2d_geometry(shape({1, 1, 5, 2}), shape({1, 1, 3, 3}), plain).window_fits());
  // Unknown dims stay unknown.
  EXPECT_EQ(rules::conv2d_geometry(shape({u, 3, u, 8}), shape({4, 3, 3, 3}), plain).output_shape(),
            shape({u, 4, u, 6}));
}

TEST(NnRules, PoolWindowAndGeometry) {
  // No strides: the kernel's.
  const auto dflt = rules::pool_window_of({2, 3}, {}, {0, 0});
  EXPECT_EQ(dflt.kernel, pair2({2, 3}));
  EXPECT_EQ(dflt.stride, pair2({2, 3}));
  EXPECT_EQ(dflt.pad, pad4({0, 0, 0, 0}));
  EXPECT_EQ(rules::pool2d_geometry(shape({2, 5, 6, 9}), dflt).output_shape(), shape({2, 5, 3, 3}));

  // max_pool2d(x [1, 3, 7, 7], 3, stride=2, padding=1) is [1, 3, 4, 4].
  const auto win = rules::pool_window_of({3, 3}, {2, 2}, {1, 1});
  EXPECT_EQ(win.pad, pad4({1, 1, 1, 1}));
  const auto g = rules::pool2d_geometry(shape({1, 3, 7, 7}), win);
  EXPECT_EQ(g.output_shape(), shape({1, 3, 4, 4}));
  EXPECT_TRUE(g.window_fits());

  EXPECT_EQ(rules::pool_window_of({3, 3}, {1, 2}, {1, 0, 1, 0}).pad, pad4({1, 0, 1, 0}));
  EXPECT_EQ(rules::pool2d_geometry(shape({1, 1, 4, 4}),
                                   rules::pool_window_of({3, 3}, {1, 2}, {1, 0, 1, 0}))
                .output_shape(),
            shape({1, 1, 3, 2}));

  const auto big =
      rules::pool2d_geometry(shape({1, 1, 2, 2}), rules::pool_window_of({3, 3}, {}, {0, 0}));
  EXPECT_EQ(big.oh, -2);
  EXPECT_FALSE(big.window_fits());
  EXPECT_EQ(rules::pool2d_geometry(shape({1, 1, u, 4}), rules::pool_window_of({2, 2}, {}, {0, 0}))
                .output_shape(),
            shape({1, 1, u, 2}));
}

// ---- fused epilogue ----------------------------------------------------------------------

TEST(NnRules, Activations) {
  EXPECT_EQ(rules::activation_of("none"), rules::activation::none);
  EXPECT_EQ(rules::activation_of("relu"), rules::activation::relu);
  EXPECT_EQ(rules::activation_of("gelu"), rules::activation::gelu);
  EXPECT_EQ(rules::activation_of("gelu_tanh"), rules::activation::gelu_tanh);
  EXPECT_EQ(rules::activation_of("tanh"), rules::activation::tanh);
  EXPECT_EQ(rules::activation_of("sigmoid"), rules::activation::sigmoid);
  EXPECT_EQ(rules::activation_of("clip"), rules::activation::clip);
  EXPECT_EQ(message_of([] { return rules::activation_of("Relu"); }), "unknown activation \"Relu\"");
  EXPECT_EQ(message_of([] { return rules::activation_of(""); }), "unknown activation \"\"");
}

// Clip takes any bounds (NaN, lo > hi, infinite: Note [clip activation]); the others only
// the defaults -inf and +inf.
TEST(NnRules, ClipBounds) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::clip, 0.0, 6.0));
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::clip, 6.0, 0.0));
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::clip, nan, nan));
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::clip, -inf, inf));
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::none, -inf, inf));
  EXPECT_NO_THROW(rules::check_clip_bounds(rules::activation::relu, -inf, inf));
  EXPECT_EQ(message_of([] { rules::check_clip_bounds(rules::activation::relu, 0.0, inf); }),
            "clip_min = 0 is given, but activation \"relu\" takes no bounds (only \"clip\" does)");
  EXPECT_EQ(message_of([&] { rules::check_clip_bounds(rules::activation::gelu, -inf, nan); }),
            "clip_max = nan is given, but activation \"gelu\" takes no bounds (only \"clip\" "
            "does)");
  EXPECT_EQ(message_of([] { rules::check_clip_bounds(rules::activation::none, inf, inf); }),
            "clip_min = inf is given, but activation \"none\" takes no bounds (only \"clip\" "
            "does)");
}

TEST(NnRules, EpilogueInputs) {
  EXPECT_NO_THROW(rules::check_epilogue_inputs(2, false, false));
  EXPECT_NO_THROW(rules::check_epilogue_inputs(3, true, false));
  EXPECT_NO_THROW(rules::check_epilogue_inputs(3, false, true));
  EXPECT_NO_THROW(rules::check_epilogue_inputs(4, true, true));
  EXPECT_EQ(message_of([] { rules::check_epilogue_inputs(3, false, false); }),
            "has 3 inputs, but has_bias = false and has_residual = false need 2");
  EXPECT_EQ(message_of([] { rules::check_epilogue_inputs(2, true, true); }),
            "has 2 inputs, but has_bias = true and has_residual = true need 4");
}

TEST(NnRules, EpilogueArguments) {
  const shape out({2, 3, 4, 4});
  const tensor bias = f32(shape({3}));
  const tensor residual = f32(out);
  EXPECT_NO_THROW(rules::check_epilogue_args(out, 1, &bias, &residual));
  EXPECT_NO_THROW(rules::check_epilogue_args(out, 1, nullptr, nullptr));
  const tensor wrong_bias = f32(shape({4}));
  const tensor wrong_residual = f32(shape({2, 3, 4, 1}));
  // The bias is checked first.
  EXPECT_EQ(message_of([&] { rules::check_epilogue_args(out, 1, &wrong_bias, &wrong_residual); }),
            "bias float32[4] on cpu:0 does not match the 3 channels (dimension 1) of the "
            "output [2, 3, 4, 4]");
  // Channels last: the same bias now fits.
  EXPECT_NO_THROW(rules::check_epilogue_args(out, 3, &wrong_bias, nullptr));
  const tensor matrix_bias = f32(shape({3, 1}));
  EXPECT_EQ(message_of([&] { rules::check_epilogue_args(out, 1, &matrix_bias, nullptr); }),
            "bias float32[3, 1] on cpu:0 does not match the 3 channels (dimension 1) of "
            "the output [2, 3, 4, 4]");
  EXPECT_EQ(message_of([&] { rules::check_epilogue_args(out, 1, &bias, &wrong_residual); }),
            "residual float32[2, 3, 4, 1] on cpu:0 must have the output's shape "
            "[2, 3, 4, 4]");
}

TEST(NnRules, ConvTranspose2dOutputSizes) {
  const rules::conv_window plain = rules::conv_window_of(1, {1, 1}, {1, 1}, {0, 0, 0, 0});
  // (in - 1) * stride - pads + dilation * (k - 1) + 1 + output_padding.
  EXPECT_EQ(rules::conv_transpose2d_output(shape({1, 2, 3, 3}), shape({2, 4, 3, 3}), plain, {0, 0}),
            shape({1, 4, 5, 5}));
  const rules::conv_window w = rules::conv_window_of(2, {2, 3}, {2, 1}, {1, 0, 2, 1});
  // H: (4 - 1) * 2 - 1 + 2 * 2 + 1 + 1 = 11; W: (5 - 1) * 3 - 3 + 2 + 1 + 2 = 14.
  EXPECT_EQ(rules::conv_transpose2d_output(shape({2, 4, 4, 5}), shape({4, 3, 3, 3}), w, {1, 2}),
            shape({2, 6, 11, 14}));
  // Unknown dimensions stay unknown; the channels come from the filter.
  EXPECT_EQ(rules::conv_transpose2d_output(shape({-1, -1, -1, 5}), shape({4, 3, 3, 3}), w, {0, 0}),
            shape({-1, 6, -1, 12}));
  // The kernels name tensors.
  const tensor x = f32(shape({1, 4, 3, 3}));
  const tensor f = f32(shape({3, 2, 3, 3}));
  EXPECT_EQ(message_of([&] { (void)rules::conv_transpose2d_output(x, f, plain, {0, 0}); }),
            "the input has 4 channels but the filter's dimension 0 is 3 (input float32[1, 4, 3, "
            "3] on cpu:0, filter float32[3, 2, 3, 3] on cpu:0, groups 1)");
  EXPECT_EQ(message_of([&] {
              (void)rules::conv_transpose2d_output(shape({1, 2, 3, 3}), shape({2, 4, 3, 3}), plain,
                                                   {1, 0});
            }),
            "output_padding [1, 0] must be smaller than the strides [1, 1]");
  EXPECT_EQ(message_of([&] {
              (void)rules::conv_transpose2d_output(shape({1, 3, 3, 3}), shape({3, 4, 3, 3}),
                                                   rules::conv_window_of(2, {1, 1}, {1, 1},
                                                                         {0, 0, 0, 0}),
                                                   {0, 0});
            }),
            "input channels 3 do not divide into 2 groups (input [1, 3, 3, 3], filter [3, 4, 3, "
            "3], groups 2)");
}

TEST(NnRules, PoolingCeilModeAndDilations) {
  // 8 with a window of 3, stride 2: 3 outputs rounding down, 4 rounding up (one more row of
  // padding at the bottom and the right).
  const auto down = rules::pool2d_geometry(shape({1, 1, 8, 8}),
                                           rules::pool_window_of({3, 3}, {2, 2}, {0, 0}));
  EXPECT_EQ(down.output_shape(), shape({1, 1, 3, 3}));
  const auto up = rules::pool2d_geometry(shape({1, 1, 8, 8}),
                                         rules::pool_window_of({3, 3}, {2, 2}, {0, 0}, true));
  EXPECT_EQ(up.output_shape(), shape({1, 1, 4, 4}));
  EXPECT_EQ(up.pad, (pad4{0, 1, 0, 1}));
  // 5 with a window of 2, stride 2 and padding 1: rounding up would start a window in the
  // bottom padding, so the size stays 3 and the padding as given.
  const auto edge = rules::pool2d_geometry(shape({1, 1, 5, 5}),
                                           rules::pool_window_of({2, 2}, {2, 2}, {1, 1}, true));
  EXPECT_EQ(edge.output_shape(), shape({1, 1, 3, 3}));
  EXPECT_EQ(edge.pad, (pad4{1, 1, 1, 1}));
  // A dilated window spans d · (k - 1) + 1: 3 taps 2 apart span 5, so 8 gives 4 outputs at
  // stride 1, and with ceil_mode at stride 2, ⌈3 / 2⌉ + 1 = 3.
  const auto dil = rules::pool2d_geometry(
      shape({1, 1, 8, 8}), rules::pool_window_of({3, 3}, {1, 1}, {0, 0}, false, {2, 2}));
  EXPECT_EQ(dil.output_shape(), shape({1, 1, 4, 4}));
  EXPECT_TRUE(dil.dilated());
  const auto dil_up = rules::pool2d_geometry(
      shape({1, 1, 8, 8}), rules::pool_window_of({3, 3}, {2, 2}, {0, 0}, true, {2, 2}));
  EXPECT_EQ(dil_up.output_shape(), shape({1, 1, 3, 3}));
  // Unknown sizes stay unknown.
  EXPECT_EQ(rules::pool2d_geometry(shape({1, 1, -1, 7}),
                                   rules::pool_window_of({2, 2}, {2, 2}, {0, 0}, true))
                .output_shape(),
            shape({1, 1, -1, 4}));
}

TEST(NnRules, ResizeCoordinatesAndRounding) {
  using rules::resize_coord;
  using rules::resize_rounding;
  // in 4 -> out 8 (scale 2): ONNX's formulas.
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::half_pixel, 3, 4, 2.0), 1.25);
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::asymmetric, 3, 4, 2.0), 1.5);
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::align_corners, 3, 4, 2.0), 3.0 * 3 / 7);
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::pytorch_half_pixel, 3, 4, 2.0), 1.25);
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::tf_half_pixel_for_nearest, 3, 4, 2.0), 1.75);
  // tf_crop_and_resize: the region [0.25, 0.75] of 5 elements (coordinates 1 to 3) onto 3,
  // and onto 1 (its middle).
  EXPECT_DOUBLE_EQ(rules::resize_crop_source(0, 5, 3, 0.25, 0.75), 1.0);
  EXPECT_DOUBLE_EQ(rules::resize_crop_source(2, 5, 3, 0.25, 0.75), 3.0);
  EXPECT_DOUBLE_EQ(rules::resize_crop_source(0, 5, 1, 0.25, 0.75), 2.0);
  // An output of length 1.
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::align_corners, 0, 4, 0.25), 0.0);
  EXPECT_DOUBLE_EQ(rules::resize_source(resize_coord::pytorch_half_pixel, 0, 4, 0.25), -0.5);
  // Ties and clamping.
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::round_prefer_floor, 1.5, 4), 1);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::round_prefer_ceil, 1.5, 4), 2);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::floor, 1.9, 4), 1);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::ceil, 1.1, 4), 2);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::ceil, 2.0, 4), 2);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::round_prefer_floor, -0.7, 4), 0);
  EXPECT_EQ(rules::resize_nearest_index(resize_rounding::ceil, 3.2, 4), 3);
  // Parsing and the output shape.
  const auto p = rules::resize_params_of("linear", "align_corners", "floor", {1, 2, 6}, {});
  EXPECT_EQ(p.mode, rules::resize_mode::linear);
  EXPECT_EQ(p.coord, resize_coord::align_corners);
  EXPECT_EQ(p.rounding, resize_rounding::floor);
  EXPECT_EQ(rules::resize_output(shape({1, 2, 3}), p), shape({1, 2, 6}));
  EXPECT_EQ(rules::resize_params_of("cubic", "half_pixel", "floor", {}, {}).mode, rules::resize_mode::cubic);
  EXPECT_EQ(message_of([&] { (void)rules::resize_params_of("area", "half_pixel", "floor", {}, {}); }),
            "mode must be one of \"nearest\", \"linear\", \"cubic\", got \"area\"");
  EXPECT_EQ(message_of([&] { (void)rules::resize_output(shape({1, 2}), p); }),
            "sizes [1, 2, 6] must have one size per dimension of x [1, 2]");
}

}  // namespace
}  // namespace loom
