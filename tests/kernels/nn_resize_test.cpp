// resize (src/backends/cpu/nn_resize.cpp) against ONNX's reference formulas written here as
// loops (onnx/backend/test/case/node/resize.py: the coordinate transformation, the two
// neighbours of the edge-padded input nearest the source coordinate, linear or nearest
// coefficients, every dimension in turn): each mode, coordinate transformation and rounding,
// up- and down-sampling, scales given, ONNX's own documented examples, every float dtype,
// and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"

namespace loom::testing {
namespace {

using reduction::expect_error;
using reduction::unravel;

struct spec {
  std::string mode = "nearest";
  std::string coord = "half_pixel";
  std::string rounding = "round_prefer_floor";
  std::vector<double> scales;  // empty: out / in
  std::vector<double> roi;     // tf_crop_and_resize: starts, then ends
  double extrapolation = 0.0;  // tf_crop_and_resize: outside x
};

// ONNX's interpolate_1d_with_x for one dimension: the (index, coefficient) pairs that
// output index x reads; none when it reads extrapolation_value (tf_crop_and_resize outside x).
std::vector<std::pair<std::int64_t, double>> taps_1d(const spec& s, std::int64_t in,
                                                     std::int64_t out, std::size_t d,
                                                     std::int64_t x) {
  const double scale = s.scales.empty() ? static_cast<double>(out) / static_cast<double>(in)
                                        : s.scales[d];
  const double output_width = scale * static_cast<double>(in);
  const auto xd = static_cast<double>(x);
  double x_ori = 0.0;
  if (s.coord == "align_corners") {
    x_ori = output_width == 1 ? 0.0 : xd * static_cast<double>(in - 1) / (output_width - 1);
  } else if (s.coord == "asymmetric") {
    x_ori = xd / scale;
  } else if (s.coord == "pytorch_half_pixel") {
    x_ori = output_width == 1 ? -0.5 : (xd + 0.5) / scale - 0.5;
  } else if (s.coord == "tf_half_pixel_for_nearest") {
    x_ori = (xd + 0.5) / scale;
  } else if (s.coord == "tf_crop_and_resize") {
    const double start = s.roi[d];
    const double end = s.roi[s.roi.size() / 2 + d];
    const auto last = static_cast<double>(in - 1);
    x_ori = out > 1 ? start * last + xd * (end - start) * last / static_cast<double>(out - 1)
                    : 0.5 * (start + end) * last;
    if (x_ori < 0 || x_ori > last) return {};
  } else {
    x_ori = (xd + 0.5) / scale - 0.5;
  }
  const double x_int = std::floor(x_ori);
  const double ratio = x_ori == x_int ? 1.0 : x_ori - x_int;
  std::vector<double> coeffs;
  if (s.mode == "linear") {
    coeffs = {1.0 - ratio, ratio};
  } else if (ratio == 1.0) {
    coeffs = {0.0, 1.0};
  } else if (s.rounding == "round_prefer_floor") {
    coeffs = {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
  } else if (s.rounding == "round_prefer_ceil") {
    coeffs = {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
  } else if (s.rounding == "floor") {
    coeffs = {1.0, 0.0};
  } else {
    coeffs = {0.0, 1.0};
  }
  // get_neighbor: the input padded by 1 on each side ('edge'), the 2 indices nearest to
  // x_ori + 1 (the smaller first on ties), back to the unpadded indices, clamped (edge).
  const double xp = x_ori + 1.0;
  std::int64_t best[2] = {-1, -1};  // the nearest and the second nearest, in that order
  const auto nearer = [xp](std::int64_t a, std::int64_t b) {
    const double da = std::fabs(xp - static_cast<double>(a));
    const double db = std::fabs(xp - static_cast<double>(b));
    return da < db || (da == db && a < b);
  };
  for (std::int64_t i = 0; i < in + 2; ++i) {
    if (best[0] < 0 || nearer(i, best[0])) {
      best[1] = best[0];
      best[0] = i;
    } else if (best[1] < 0 || nearer(i, best[1])) {
      best[1] = i;
    }
  }
  const std::int64_t n0 = best[0] < best[1] ? best[0] : best[1];
  const std::int64_t n1 = best[0] < best[1] ? best[1] : best[0];
  const auto clamp = [in](std::int64_t i) { return std::clamp<std::int64_t>(i - 1, 0, in - 1); };
  return {{clamp(n0), coeffs[0]}, {clamp(n1), coeffs[1]}};
}

std::vector<double> reference(const spec& s, const tensor& x, const shape& out) {
  const shape& in = x.shape();
  const auto xv = values(x);
  std::vector<double> y(static_cast<std::size_t>(out.num_elements()));
  for (std::int64_t o = 0; o < out.num_elements(); ++o) {
    const auto oi = unravel(o, out);
    // Sum over every combination of one tap per dimension.
    std::vector<std::vector<std::pair<std::int64_t, double>>> per_dim;
    bool outside = false;
    for (std::size_t d = 0; d < in.rank(); ++d) {
      per_dim.push_back(taps_1d(s, in[d], out[d], d, oi[d]));
      outside = outside || per_dim.back().empty();
    }
    if (outside) {
      y[static_cast<std::size_t>(o)] = s.extrapolation;
      continue;
    }
    double acc = 0.0;
    const std::size_t combos = std::size_t{1} << in.rank();
    for (std::size_t m = 0; m < combos; ++m) {
      double coeff = 1.0;
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < in.rank(); ++d) {
        const auto& t = per_dim[d][(m >> d) & 1u];
        coeff *= t.second;
        flat = flat * in[d] + t.first;
      }
      if (coeff != 0.0) acc += coeff * xv[static_cast<std::size_t>(flat)];
    }
    y[static_cast<std::size_t>(o)] = acc;
  }
  return y;
}

attr_map attrs_of(const spec& s, const shape& out) {
  attr_map a{{"sizes", out.to_vector()},
             {"mode", s.mode},
             {"coordinate_transformation_mode", s.coord},
             {"nearest_mode", s.rounding}};
  if (!s.scales.empty()) a.emplace("scales", s.scales);
  if (!s.roi.empty()) {
    a.emplace("roi", s.roi);
    a.emplace("extrapolation_value", s.extrapolation);
  }
  return a;
}

const char* const coords[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                              "tf_half_pixel_for_nearest"};
const char* const roundings[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

TEST(ResizeTest, EveryModeTransformationAndRoundingAgainstOnnxFormulas) {
  const std::vector<std::pair<shape, shape>> sizes = {
      {{1, 1, 2, 2}, {1, 1, 4, 4}}, {{1, 2, 4, 4}, {1, 2, 3, 2}}, {{2, 1, 3, 5}, {2, 1, 7, 3}},
      {{1, 1, 4, 4}, {1, 1, 1, 1}}, {{3, 5}, {6, 2}},             {{4}, {9}},
      {{2, 3, 4}, {3, 5, 2}}};
  std::uint64_t seed = 1;
  for (const auto& [in, out] : sizes) {
    const tensor x = random(dtype::f64, in, seed++);
    for (const char* coord : coords) {
      for (const char* rounding : roundings) {
        const spec s{"nearest", coord, rounding, {}};
        SCOPED_TRACE(::testing::Message() << "nearest " << coord << " " << rounding << " "
                                          << to_string(in) << " -> " << to_string(out));
        expect_close(run_op1("resize", {x}, attrs_of(s, out)), out, reference(s, x, out), 1e-12,
                     1e-12);
      }
      if (std::string(coord) == "tf_half_pixel_for_nearest") continue;
      const spec s{"linear", coord, "round_prefer_floor", {}};
      SCOPED_TRACE(::testing::Message() << "linear " << coord << " " << to_string(in) << " -> "
                                        << to_string(out));
      expect_close(run_op1("resize", {x}, attrs_of(s, out)), out, reference(s, x, out), 1e-12,
                   1e-12);
    }
  }
}

TEST(ResizeTest, ScalesDriveTheTransformation) {
  // The importer passes floor(in · scale) as sizes and the scale itself: the coordinates use
  // the scale, not out / in (here 5 · 0.6 = 3 but 7 · 0.6 = 4.2 -> 4).
  const tensor x = random(dtype::f64, {1, 1, 5, 7}, 3);
  const shape out{1, 1, 3, 4};
  for (const char* mode : {"nearest", "linear"}) {
    for (const char* coord : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"}) {
      const spec s{mode, coord, "round_prefer_ceil", {1.0, 1.0, 0.6, 0.6}};
      SCOPED_TRACE(::testing::Message() << mode << " " << coord);
      expect_close(run_op1("resize", {x}, attrs_of(s, out)), out, reference(s, x, out), 1e-12,
                   1e-12);
    }
  }
}

TEST(ResizeTest, OnnxDocumentedExamples) {
  // resize_upsample_scales_nearest: [[1, 2], [3, 4]] by (2, 3).
  const tensor a = make(dtype::f32, {1, 1, 2, 2}, {1, 2, 3, 4});
  expect_close(run_op1("resize", {a},
                       {{"sizes", std::vector<std::int64_t>{1, 1, 4, 6}},
                        {"scales", std::vector<double>{1.0, 1.0, 2.0, 3.0}}}),
               {1, 1, 4, 6},
               {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4}, 0, 0);
  // resize_upsample_scales_linear: [[1, 2], [3, 4]] by 2, half_pixel.
  expect_close(run_op1("resize", {a},
                       {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                        {"mode", std::string("linear")},
                        {"scales", std::vector<double>{1.0, 1.0, 2.0, 2.0}}}),
               {1, 1, 4, 4},
               {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75,
                4.0},
               1e-6, 1e-6);
  // resize_upsample_scales_linear_align_corners.
  expect_close(run_op1("resize", {a},
                       {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                        {"mode", std::string("linear")},
                        {"coordinate_transformation_mode", std::string("align_corners")}}),
               {1, 1, 4, 4},
               {1.0, 1.33333333, 1.66666667, 2.0, 1.66666667, 2.0, 2.33333333, 2.66666667,
                2.33333333, 2.66666667, 3.0, 3.33333333, 3.0, 3.33333333, 3.66666667, 4.0},
               1e-6, 1e-6);
  // resize_downsample_scales_nearest: [[1, 2, 3, 4], [5, 6, 7, 8]] by 0.6 -> [[1, 3]].
  const tensor b = make(dtype::f32, {1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_close(run_op1("resize", {b},
                       {{"sizes", std::vector<std::int64_t>{1, 1, 1, 2}},
                        {"scales", std::vector<double>{1.0, 1.0, 0.6, 0.6}}}),
               {1, 1, 1, 2}, {1, 3}, 0, 0);
}

TEST(ResizeTest, TfCropAndResizeAgainstOnnxFormulas) {
  // Regions inside x, reaching past its edges (extrapolation), reversed, and of one output.
  const tensor x = random(dtype::f64, {2, 5, 6}, 3);
  const std::vector<std::pair<std::vector<double>, shape>> cases = {
      {{0, 0.2, 0.1, 1, 0.8, 0.9}, {2, 4, 7}},
      {{0, -0.3, 0.4, 1, 0.6, 1.7}, {2, 3, 3}},
      {{0, 0.9, 0.7, 1, 0.1, 0.2}, {2, 6, 4}},
      {{0, 0.25, 0.5, 1, 0.75, 0.5}, {2, 1, 1}},
  };
  for (const char* mode : {"linear", "nearest"}) {
    for (const auto& [roi, out] : cases) {
      spec s{.mode = mode, .coord = "tf_crop_and_resize", .roi = roi, .extrapolation = -7.5};
      SCOPED_TRACE(std::string(mode) + " roi " + ::testing::PrintToString(roi));
      expect_close(run_op1("resize", {x}, attrs_of(s, out)), out, reference(s, x, out), 1e-12,
                   1e-12);
    }
  }
  // ONNX's resize_tf_crop_and_resize case.
  const tensor a = make(dtype::f32, {1, 1, 4, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  spec s{.mode = "linear", .coord = "tf_crop_and_resize", .roi = {0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7},
         .extrapolation = 10};
  expect_close(run_op1("resize", {a}, attrs_of(s, {1, 1, 3, 3})), {1, 1, 3, 3},
               {7.6, 10, 10, 12.4, 10, 10, 10, 10, 10}, 1e-6, 1e-6);
}

TEST(ResizeTest, EveryFloatDtypeNonContiguousAndEmpty) {
  const spec s{"linear", "half_pixel", "round_prefer_floor", {}};
  const shape out{2, 3, 5, 7};
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    const tensor x = random(t, {2, 3, 4, 3}, 9);
    expect_close(run_op1("resize", {x}, attrs_of(s, out)), out, reference(s, x, out),
                 rtol_for(t), atol_for(t));
    const tensor xt = non_contiguous(x);
    expect_close(run_op1("resize", {xt}, attrs_of(s, out)), out, reference(s, xt, out),
                 rtol_for(t), atol_for(t));
  }
  EXPECT_EQ(run_op1("resize", {make(dtype::f32, {0, 3, 2, 2}, {})},
                    {{"sizes", std::vector<std::int64_t>{0, 3, 4, 4}}})
                .shape(),
            (shape{0, 3, 4, 4}));
  EXPECT_EQ(run_op1("resize", {random(dtype::f32, {1, 3, 2, 2}, 1)},
                    {{"sizes", std::vector<std::int64_t>{1, 3, 0, 4}}})
                .shape(),
            (shape{1, 3, 0, 4}));
}

TEST(ResizeTest, BadInputIsATypedError) {
  const tensor x = random(dtype::f32, {1, 1, 2, 2}, 1);
  expect_error<invalid_argument>(
      [&] { (void)run_op("resize", {x}, {{"sizes", std::vector<std::int64_t>{4, 4}}}); },
      {"under_test", "sizes [4, 4] must have one size per dimension", "[1, 1, 2, 2]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {x},
                     {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                      {"mode", std::string("area")}});
      },
      {"mode", "area"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {x},
                     {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                      {"coordinate_transformation_mode", std::string("tf_crop_and_resize")}});
      },
      {"under_test", "tf_crop_and_resize needs a roi of 2 values per dimension"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {x},
                     {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                      {"scales", std::vector<double>{1.0, 1.0, 0.0, 2.0}}});
      },
      {"under_test", "must all be > 0"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {x},
                     {{"sizes", std::vector<std::int64_t>{1, 1, 4, 4}},
                      {"scales", std::vector<double>{2.0, 2.0}}});
      },
      {"under_test", "one scale per dimension"});
  expect_error<invalid_argument>(
      [&] { (void)run_op("resize", {x}, {{"sizes", std::vector<std::int64_t>{1, 1, -4, 4}}}); },
      {"sizes must be >= 0"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {make(dtype::f32, {1, 0}, {})},
                     {{"sizes", std::vector<std::int64_t>{1, 3}}});
      },
      {"under_test", "empty along dimension 1"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("resize", {random(dtype::i32, {2, 2}, 3)},
                     {{"sizes", std::vector<std::int64_t>{4, 4}}});
      },
      {"under_test", "int32"});
  // At run time: declared of unknown dims, the kernel's rule fails the node.
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("resize", {make(dtype::f32, {1, 0}, {})}, {shape{-1, -1}},
                              {{"sizes", std::vector<std::int64_t>{1, 3}}});
      },
      {"under_test", "resize", "empty along dimension 1"});
}

}  // namespace
}  // namespace loom::testing
