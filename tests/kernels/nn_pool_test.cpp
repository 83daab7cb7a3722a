// max_pool2d, max_pool2d_with_indices and avg_pool2d against float64 loops: windows,
// strides, padding (both count_include_pad modes), ceil_mode, max pooling's dilations, ties,
// NaN and -inf, both storage orders of the indices, every float dtype, non-contiguous
// input, empty batches, bad attributes and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"

namespace loom::testing {
namespace {

struct pool_case {
  shape x;
  std::vector<std::int64_t> kernel;
  std::vector<std::int64_t> strides{};  // empty: the kernel
  std::vector<std::int64_t> padding{0, 0, 0, 0};
  bool include_pad = false;
  bool ceil_mode = false;
  std::vector<std::int64_t> dilations{1, 1};
};

// The pooled values; with `indices` (max only) also ONNX MaxPool's Indices: the first tap
// inside the input, then any strictly greater one (NaN never is), as
// (plane · H + h) · W + w, or plane · H · W + w · H + h with storage_order 1; -1 for a window
// with no tap inside.
std::vector<double> reference(bool max, const pool_case& c, const tensor& x, shape& out,
                              std::vector<double>* indices = nullptr,
                              std::int64_t storage_order = 0) {
  const auto xv = values(x);
  std::vector<std::int64_t> p = c.padding;
  if (p.size() == 2) p = {p[0], p[0], p[1], p[1]};
  const auto s = c.strides.empty() ? c.kernel : c.strides;
  const std::int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3];
  // ceil_mode: PyTorch's rule (round up, but no window may start past the input and its
  // leading padding).
  const auto out_size = [&](std::int64_t in, std::int64_t k, std::int64_t st, std::int64_t p0,
                            std::int64_t p1) {
    const std::int64_t span = in + p0 + p1 - k;
    if (!c.ceil_mode) return span / st + 1;
    std::int64_t o = (span + st - 1) / st + 1;
    if ((o - 1) * st >= in + p0) --o;
    return o;
  };
  const auto& d = c.dilations;
  const std::int64_t oh = out_size(h, d[0] * (c.kernel[0] - 1) + 1, s[0], p[0], p[1]);
  const std::int64_t ow = out_size(w, d[1] * (c.kernel[1] - 1) + 1, s[1], p[2], p[3]);
  out = {n, ch, oh, ow};
  std::vector<double> r;
  for (std::int64_t plane = 0; plane < n * ch; ++plane) {
    for (std::int64_t y = 0; y < oh; ++y) {
      for (std::int64_t xx = 0; xx < ow; ++xx) {
        double acc = max ? -INFINITY : 0.0;
        std::int64_t count = 0;
        std::int64_t at = -1;
        for (std::int64_t i = 0; i < c.kernel[0]; ++i) {
          for (std::int64_t j = 0; j < c.kernel[1]; ++j) {
            const std::int64_t iy = y * s[0] - p[0] + i * d[0];
            const std::int64_t ix = xx * s[1] - p[2] + j * d[1];
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = xv[static_cast<std::size_t>((plane * h + iy) * w + ix)];
            if (at < 0 || (max && v > acc)) {
              at = storage_order == 0 ? (plane * h + iy) * w + ix : plane * h * w + ix * h + iy;
            }
            acc = max ? std::max(acc, v) : acc + v;
            ++count;
          }
        }
        if (indices != nullptr) indices->push_back(static_cast<double>(at));
        if (!max) acc /= static_cast<double>(c.include_pad ? c.kernel[0] * c.kernel[1] : count);
        r.push_back(acc);
      }
    }
  }
  return r;
}

attr_map attrs_of(bool max, const pool_case& c) {
  attr_map a{{"kernel", c.kernel}, {"strides", c.strides}, {"padding", c.padding}};
  if (!max) a.emplace("count_include_pad", c.include_pad);
  if (c.ceil_mode) a.emplace("ceil_mode", true);
  if (c.dilations != std::vector<std::int64_t>{1, 1}) a.emplace("dilations", c.dilations);
  return a;
}

void check_with(bool max, const pool_case& c, const tensor& x) {
  SCOPED_TRACE(std::string(max ? "max " : "avg ") + x.describe());
  const tensor got = run_op1(max ? "max_pool2d" : "avg_pool2d", {x}, attrs_of(max, c));
  shape s;
  const auto want = reference(max, c, x, s);
  // A max is exact; a mean rounds once in the dtype (plus float accumulation).
  const dtype t = x.type();
  expect_close(got, s, want, max ? 0.0 : rtol_for(t), max ? 0.0 : atol_for(t));
}

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

const std::vector<pool_case>& cases() {
  static const std::vector<pool_case> c{
      {.x = {2, 3, 8, 8}, .kernel = {2, 2}},
      {.x = {1, 2, 9, 7}, .kernel = {3, 3}, .strides = {2, 2}},
      {.x = {1, 2, 7, 7}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}},
      {.x = {1, 2, 7, 7},
       .kernel = {3, 3},
       .strides = {2, 2},
       .padding = {1, 1},
       .include_pad = true},
      {.x = {2, 1, 6, 9}, .kernel = {2, 3}, .strides = {1, 2}, .padding = {1, 0, 2, 1}},
      {.x = {2, 1, 6, 9},
       .kernel = {2, 3},
       .strides = {1, 2},
       .padding = {1, 0, 2, 1},
       .include_pad = true},
      {.x = {1, 3, 5, 5}, .kernel = {5, 5}},
      {.x = {1, 1, 4, 4}, .kernel = {1, 1}},
      {.x = {2, 16, 14, 14}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}},
  };
  return c;
}

TEST(NnPool, MaxAgainstReference) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& c : cases()) check_with(true, c, random(t, c.x, seed++));
  }
}

// Tiled 2x2 windows (max pooling's vectorized path for float32 and float64), over widths
// that leave every vector remainder and odd sizes whose last row and column lie in no
// window, with -inf and ties; in float32 and float64 NaN too: from -inf, only a greater
// element replaces the maximum, so NaN is skipped and an all-NaN window gives -inf.
TEST(NnPool, MaxTiled2x2WidthsInfinitiesAndNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const dtype t : float_types) {
    const bool with_nan = t == dtype::f32 || t == dtype::f64;
    for (std::int64_t w = 2; w <= 37; w += (w < 12 ? 1 : 5)) {
      const pool_case c{.x = {2, 3, 5, w}, .kernel = {2, 2}};
      std::vector<double> xv(static_cast<std::size_t>(c.x.num_elements()));
      const std::vector<double> palette{-inf, 0.5, 0.5, -2.0, with_nan ? nan : -inf, 3.0, 1.0};
      for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = palette[(i * 5 + i / 3) % palette.size()];
      // A whole window of NaN in float32/float64, of -inf in float16 and bfloat16 (loom's
      // own loop in every float type: -inf, where oneDNN's would give the lowest finite
      // value; docs/training.md).
      const auto row = static_cast<std::size_t>(w);
      xv.at(0) = xv.at(1) = xv.at(row) = xv.at(row + 1) = with_nan ? nan : -inf;
      SCOPED_TRACE(::testing::Message() << "width " << w);
      check_with(true, c, make(t, c.x, xv));
    }
  }
}

TEST(NnPool, AvgAgainstReference) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& c : cases()) check_with(false, c, random(t, c.x, seed++));
  }
}

TEST(NnPool, PaddingNeverWinsAMax) {
  // All values negative: a padded zero would win a max if padding took part.
  const pool_case c{.x = {1, 1, 3, 3}, .kernel = {2, 2}, .strides = {2, 2}, .padding = {1, 1}};
  const tensor x = random(dtype::f32, c.x, 3, -5.0, -1.0);
  check_with(true, c, x);
  const tensor got = run_op1("max_pool2d", {x}, attrs_of(true, c));
  for (const double v : values(got)) EXPECT_LT(v, 0.0);
}

TEST(NnPool, NonContiguousInput) {
  for (const dtype t : float_types) {
    const pool_case c{.x = {2, 3, 6, 7}, .kernel = {2, 3}, .strides = {1, 2}, .padding = {1, 1}};
    const tensor x = non_contiguous(random(t, c.x, 9));
    check_with(true, c, x);
    check_with(false, c, x);
  }
}

TEST(NnPool, Empty) {
  for (const char* op : {"max_pool2d", "avg_pool2d"}) {
    expect_close(run_op1(op, {random(dtype::f32, {0, 3, 4, 4}, 1)}, {{"kernel", {2, 2}}}),
                 {0, 3, 2, 2}, {});
    expect_close(run_op1(op, {random(dtype::f64, {2, 0, 4, 4}, 1)}, {{"kernel", {2, 2}}}),
                 {2, 0, 2, 2}, {});
  }
}

TEST(NnPool, BadInput) {
  const auto pool = [](const char* op, shape xs, attr_map attrs) {
    return [=] { (void)run_op(op, {random(dtype::f32, xs, 1)}, attrs); };
  };
  for (const char* op : {"max_pool2d", "max_pool2d_with_indices", "avg_pool2d"}) {
    expect_invalid_argument(pool(op, {1, 1, 4, 4}, {}), {"under_test", "kernel"});
    expect_invalid_argument(pool(op, {1, 1, 4, 4}, {{"kernel", {2}}}), {"under_test", "kernel"});
    expect_invalid_argument(pool(op, {1, 1, 4, 4}, {{"kernel", {0, 2}}}), {"under_test", "kernel"});
    expect_invalid_argument(pool(op, {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"strides", {0, 1}}}),
                            {"under_test", "strides"});
    expect_invalid_argument(pool(op, {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"padding", {2, 2}}}),
                            {"under_test", "padding", "smaller"});
    expect_invalid_argument(pool(op, {1, 1, 2, 2}, {{"kernel", {3, 3}}}), {"under_test", "larger"});
    expect_invalid_argument(pool(op, {1, 4, 4}, {{"kernel", {2, 2}}}), {"under_test", "rank 4"});
    expect_invalid_argument(pool(op, {1, 1, 0, 4}, {{"kernel", {1, 1}}, {"padding", {0, 0}}}),
                            {"under_test", "empty"});
    expect_invalid_argument(
        [op] {
          (void)run_op(op, {random(dtype::i32, {1, 1, 4, 4}, 1)}, {{"kernel", {2, 2}}});
        },
        {"under_test", "int32"});
  }
  expect_invalid_argument(
      pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"count_include_pad", true}}),
      {"under_test", "count_include_pad"});
}

TEST(PoolCeilModeTest, RoundsUpAsPyTorchAndOnnx) {
  const std::vector<pool_case> ceil_cases{
      {.x = {1, 2, 8, 8}, .kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true},
      {.x = {2, 3, 7, 9}, .kernel = {2, 2}, .ceil_mode = true},
      {.x = {1, 2, 6, 7}, .kernel = {3, 2}, .strides = {2, 3}, .padding = {1, 0, 1, 1},
       .ceil_mode = true},
      // The last rounded-up window would start in the bottom padding: dropped.
      {.x = {1, 1, 5, 5}, .kernel = {2, 2}, .strides = {2, 2}, .padding = {1, 1},
       .ceil_mode = true},
      {.x = {1, 1, 4, 4}, .kernel = {2, 2}, .strides = {2, 2}, .ceil_mode = true},  // exact
  };
  std::uint64_t seed = 40;
  for (const pool_case& c : ceil_cases) {
    for (dtype t : float_types) {
      const tensor x = random(t, c.x, seed++);
      check_with(true, c, x);
      check_with(false, c, x);
    }
  }
  // 8 with a window of 3 and stride 2: 3 outputs rounding down, 4 rounding up.
  const tensor y = run_op1("max_pool2d", {random(dtype::f32, {1, 1, 8, 8}, 1)},
                           {{"kernel", std::vector<std::int64_t>{3, 3}},
                            {"strides", std::vector<std::int64_t>{2, 2}},
                            {"ceil_mode", true}});
  EXPECT_EQ(y.shape(), (shape{1, 1, 4, 4}));
  try {
    (void)run_op("avg_pool2d", {random(dtype::f32, {1, 1, 8, 8}, 2)},
                 {{"kernel", std::vector<std::int64_t>{3, 3}},
                  {"count_include_pad", true},
                  {"ceil_mode", true}});
    ADD_FAILURE() << "expected an error";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ceil_mode with count_include_pad"), std::string::npos)
        << e.what();
  }
}

TEST(PoolDilationsTest, MaxPoolWithTapsApart) {
  const std::vector<pool_case> dilated{
      {.x = {1, 2, 7, 7}, .kernel = {2, 2}, .dilations = {2, 2}},
      {.x = {2, 3, 9, 8}, .kernel = {3, 2}, .strides = {2, 1}, .padding = {2, 1, 0, 1},
       .dilations = {2, 3}},
      {.x = {1, 1, 8, 8}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1},
       .ceil_mode = true, .dilations = {2, 2}},
  };
  std::uint64_t seed = 60;
  for (const pool_case& c : dilated) {
    for (dtype t : float_types) check_with(true, c, random(t, c.x, seed++));
  }
  try {
    (void)run_op("avg_pool2d", {random(dtype::f32, {1, 1, 8, 8}, 2)},
                 {{"kernel", std::vector<std::int64_t>{2, 2}},
                  {"dilations", std::vector<std::int64_t>{2, 2}}});
    ADD_FAILURE() << "expected an error";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("avg_pool2d takes dilations of 1 only"),
              std::string::npos)
        << e.what();
  }
}

// ---- max_pool2d_with_indices ----------------------------------------------------------------

void check_indices(const pool_case& c, const tensor& x, std::int64_t storage_order) {
  SCOPED_TRACE(x.describe() + " storage_order " + std::to_string(storage_order));
  attr_map a = attrs_of(true, c);
  a.emplace("storage_order", storage_order);
  const auto outs = run_op("max_pool2d_with_indices", {x}, a);
  ASSERT_EQ(outs.size(), 2U);
  shape s;
  std::vector<double> want_indices;
  const auto want = reference(true, c, x, s, &want_indices, storage_order);
  EXPECT_EQ(outs[0].type(), x.type());
  EXPECT_EQ(outs[1].type(), dtype::i64);
  expect_close(outs[0], s, want, 0.0, 0.0);  // a maximum is exact in every dtype
  expect_close(outs[1], s, want_indices, 0.0, 0.0);
}

// Max pooling's windows, with rounded-up and dilated ones.
std::vector<pool_case> indices_cases() {
  std::vector<pool_case> c = cases();
  c.push_back({.x = {1, 3, 5, 5}, .kernel = {5, 5}, .strides = {1, 1}, .padding = {2, 2}});
  c.push_back({.x = {1, 2, 6, 7}, .kernel = {3, 2}, .strides = {2, 3}, .padding = {1, 0, 1, 1},
               .ceil_mode = true});
  c.push_back({.x = {1, 1, 5, 5}, .kernel = {2, 2}, .strides = {2, 2}, .padding = {1, 1},
               .ceil_mode = true});
  c.push_back({.x = {2, 3, 9, 8}, .kernel = {3, 2}, .strides = {2, 1}, .padding = {2, 1, 0, 1},
               .dilations = {2, 3}});
  c.push_back({.x = {1, 1, 8, 8}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1},
               .ceil_mode = true, .dilations = {2, 2}});
  return c;
}

// Values on a coarse grid (ties in most windows, zeros of both signs), some NaN, and -inf
// unless `nan_only`.
tensor tied(dtype t, const shape& s, std::uint64_t seed, bool nan_only) {
  auto v = values(random(dtype::f64, s, seed, -3.0, 3.0));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i]);
    if (v[i] == 0.0 && i % 2 == 0) v[i] = -0.0;
    if ((i * 7 + seed) % 11 == 0) v[i] = nan_only || (i / 11) % 2 == 0 ? nan : -INFINITY;
  }
  return make(t, s, v);
}

// Random values, then values with ties, NaN and -inf.
TEST(MaxPoolWithIndices, AgainstReferenceWithTiesNaNAndInfinity) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& c : indices_cases()) {
      for (const tensor& x : {random(t, c.x, seed), tied(t, c.x, seed, false)}) {
        check_indices(c, x, 0);
        check_indices(c, x, 1);
      }
      ++seed;
    }
    // A window of NaN and -inf alone: -inf, at its first element.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const pool_case c{.x = {1, 1, 2, 4}, .kernel = {2, 2}};
    const tensor x = make(t, c.x, {nan, -INFINITY, 1, 1, -INFINITY, nan, 1, 2});
    check_indices(c, x, 0);
    check_indices(c, x, 1);
  }
}

// The values are max_pool2d's, bit for bit (signed zeros, NaN skipped), wherever a window
// holds a number above -inf: there max_pool2d's oneDNN path gives the lowest finite value
// instead (docs/training.md), max_pool2d_with_indices -inf as max_pool2d's own loops.
TEST(MaxPoolWithIndices, ValuesAreMaxPool2ds) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 40;
    for (const auto& c : indices_cases()) {
      const tensor x = tied(t, c.x, seed++, true);
      const auto plain = values(run_op1("max_pool2d", {x}, attrs_of(true, c)));
      const auto with_indices =
          values(run_op("max_pool2d_with_indices", {x}, attrs_of(true, c))[0]);
      shape s;
      const auto want = reference(true, c, x, s);
      ASSERT_EQ(with_indices.size(), plain.size());
      for (std::size_t i = 0; i < plain.size(); ++i) {
        if (want[i] == -INFINITY) continue;
        EXPECT_EQ(with_indices[i], plain[i]) << to_string(t) << " " << i;
        EXPECT_EQ(std::signbit(with_indices[i]), std::signbit(plain[i]))
            << to_string(t) << " " << i;
      }
    }
  }
}

// ONNX's documented cases (onnx/backend/test/case/node/maxpool.py).
TEST(MaxPoolWithIndices, OnnxCases) {
  std::vector<double> x(25);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  const tensor in = make(dtype::f32, {1, 1, 5, 5}, x);
  const auto pads = run_op("max_pool2d_with_indices", {in},
                           {{"kernel", std::vector<std::int64_t>{5, 5}},
                            {"strides", std::vector<std::int64_t>{1, 1}},
                            {"padding", std::vector<std::int64_t>{2, 2, 2, 2}}});
  expect_close(pads[0], {1, 1, 5, 5},
               {13, 14, 15, 15, 15, 18, 19, 20, 20, 20, 23, 24, 25, 25, 25, 23, 24, 25, 25, 25,
                23, 24, 25, 25, 25});
  expect_close(pads[1], {1, 1, 5, 5},
               {12, 13, 14, 14, 14, 17, 18, 19, 19, 19, 22, 23, 24, 24, 24, 22, 23, 24, 24, 24,
                22, 23, 24, 24, 24});
  const auto strides = run_op("max_pool2d_with_indices", {in},
                              {{"kernel", std::vector<std::int64_t>{2, 2}},
                               {"strides", std::vector<std::int64_t>{2, 2}},
                               {"storage_order", std::int64_t{1}}});
  expect_close(strides[0], {1, 1, 2, 2}, {7, 9, 17, 19});
  expect_close(strides[1], {1, 1, 2, 2}, {6, 16, 8, 18});
}

// Dilated taps can step over a one-row input: the window holds padding alone.
TEST(MaxPoolWithIndices, WindowOverPaddingAlone) {
  const pool_case c{.x = {1, 1, 1, 3}, .kernel = {2, 2}, .padding = {1, 1, 0, 0},
                    .dilations = {2, 2}};
  const tensor x = make(dtype::f32, c.x, {1, 2, 3});
  const auto outs = run_op("max_pool2d_with_indices", {x}, attrs_of(true, c));
  expect_close(outs[0], {1, 1, 1, 1}, {-INFINITY});
  expect_close(outs[1], {1, 1, 1, 1}, {-1});
  check_indices(c, x, 1);
}

TEST(MaxPoolWithIndices, NonContiguousInput) {
  const pool_case c{.x = {2, 3, 6, 7}, .kernel = {2, 3}, .strides = {1, 2}, .padding = {1, 1}};
  for (const dtype t : float_types) {
    const tensor x = non_contiguous(random(t, c.x, 9));
    check_indices(c, x, 0);
    check_indices(c, x, 1);
  }
}

TEST(MaxPoolWithIndices, Empty) {
  for (const shape& s : {shape{0, 3, 4, 4}, shape{2, 0, 4, 4}}) {
    const auto outs = run_op("max_pool2d_with_indices", {random(dtype::f32, s, 1)},
                             {{"kernel", std::vector<std::int64_t>{2, 2}}});
    expect_close(outs[0], {s[0], s[1], 2, 2}, {});
    expect_close(outs[1], {s[0], s[1], 2, 2}, {});
    EXPECT_EQ(outs[1].type(), dtype::i64);
  }
}

// The window errors are NnPool.BadInput's; here the storage order, and the kernel's own
// check where inference saw unknown dimensions.
TEST(MaxPoolWithIndices, BadInput) {
  const std::vector<std::int64_t> k2{2, 2};
  expect_invalid_argument(
      [&] {
        (void)run_op("max_pool2d_with_indices", {random(dtype::f32, {1, 1, 4, 4}, 1)},
                     {{"kernel", k2}, {"storage_order", std::int64_t{2}}});
      },
      {"under_test", "storage_order", "column-major"});
  try {
    (void)run_op_declared("max_pool2d_with_indices", {random(dtype::f32, {1, 1, 1, 1}, 1)},
                          {shape{-1, -1, -1, -1}}, {{"kernel", k2}});
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the padded input"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("under_test"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::testing
