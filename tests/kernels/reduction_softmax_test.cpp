// softmax, log_softmax, layer_norm, softmax_cross_entropy and argmax against float64 loops:
// every axis on ranks 1..4, empty tensors, strided and transposed inputs, every float dtype,
// large-magnitude logits, rows of every length around the vector widths, NaN and infinities,
// and bad input at construction and at run time (run once per instruction-set cap too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using namespace reduction;

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// Calls f(base, stride, n) for every lane along `axis` of shape s (flat offsets, row-major).
template <class F>
void for_each_lane(const shape& s, std::size_t axis, F&& f) {
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (k < axis) outer *= s[k];
    if (k > axis) inner *= s[k];
  }
  const std::int64_t n = s[axis];
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < inner; ++j) f(o * n * inner + j, inner, n);
  }
}

std::vector<double> softmax_ref(const std::vector<double>& x, const shape& s, std::size_t axis,
                                bool log) {
  std::vector<double> y(x.size());
  for_each_lane(s, axis, [&](std::int64_t base, std::int64_t stride, std::int64_t n) {
    auto at = [&](std::int64_t i) { return static_cast<std::size_t>(base + i * stride); };
    double m = -INFINITY;
    for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[at(i)]);
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum += std::exp(x[at(i)] - m);
    for (std::int64_t i = 0; i < n; ++i) {
      y[at(i)] = log ? x[at(i)] - m - std::log(sum) : std::exp(x[at(i)] - m) / sum;
    }
  });
  return y;
}

std::size_t wrap(std::int64_t axis, std::size_t rank) {
  return static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis);
}

void check_softmax(const tensor& x, std::int64_t axis, bool log) {
  SCOPED_TRACE(::testing::Message()
               << (log ? "log_softmax " : "softmax ") << x.describe() << " axis " << axis);
  const tensor y = run_op1(log ? "log_softmax" : "softmax", {x}, {{"axis", axis}});
  const auto want = softmax_ref(values(x), x.shape(), wrap(axis, x.rank()), log);
  expect_close(y, x.shape(), want, rtol_for(x.type()), atol_for(x.type()));
}

TEST(SoftmaxTest, EveryAxisEveryRankEveryDtype) {
  const shape shapes[] = {{5}, {3, 4}, {2, 3, 4}, {2, 3, 1, 5}, {3, 100, 70}, {4, 1000}};
  std::uint64_t seed = 1;
  for (dtype t : float_types) {
    for (const auto& s : shapes) {
      for (std::int64_t a = -static_cast<std::int64_t>(s.rank());
           a < static_cast<std::int64_t>(s.rank()); ++a) {
        const tensor x = random(t, s, seed++, -5.0, 5.0);
        check_softmax(x, a, false);
        check_softmax(x, a, true);
        if (s.rank() >= 2) {
          check_softmax(non_contiguous(x), a, a % 2 == 0);
          check_softmax(strided_view(x), a, a % 2 != 0);
        }
      }
    }
  }
}

TEST(SoftmaxTest, DefaultAxisIsLast) {
  const tensor x = random(dtype::f32, {3, 4}, 5);
  expect_close(run_op1("softmax", {x}), {3, 4}, softmax_ref(values(x), {3, 4}, 1, false));
  expect_close(run_op1("log_softmax", {x}), {3, 4}, softmax_ref(values(x), {3, 4}, 1, true));
}

TEST(SoftmaxTest, LargeMagnitudesStayFinite) {
  for (dtype t : float_types) {
    const double big = t == dtype::bf16 ? 1024 : 1000;  // bf16 holds 1024 and 1032 exactly
    const double next = t == dtype::bf16 ? 1032 : 1001;
    const tensor x = make(t, {3, 2}, {big, next, -big, -next, 0, 3.0e4});
    const auto want = softmax_ref(values(x), {3, 2}, 1, false);
    for (double v : want) ASSERT_TRUE(std::isfinite(v));
    const tensor y = run_op1("softmax", {x});
    for (double v : values(y)) EXPECT_TRUE(std::isfinite(v)) << to_string(t);
    expect_close(y, {3, 2}, want, rtol_for(t), atol_for(t));
    const tensor ly = run_op1("log_softmax", {x});
    expect_close(ly, {3, 2}, softmax_ref(values(x), {3, 2}, 1, true), rtol_for(t), atol_for(t));
    // Along axis 0 (the strided path) as well.
    const tensor y0 = run_op1("softmax", {x}, {{"axis", std::int64_t{0}}});
    expect_close(y0, {3, 2}, softmax_ref(values(x), {3, 2}, 0, false), rtol_for(t), atol_for(t));
  }
  // softmax([1000, 1001]) exactly as in the brief.
  expect_close(run_op1("softmax", {make(dtype::f32, {2}, {1000, 1001})}), {2},
               {0.2689414213699951, 0.7310585786300049});
  expect_close(run_op1("log_softmax", {make(dtype::f32, {2}, {1000, 1001})}), {2},
               {-1.3132616875182228, -0.31326168751822286});
}

// Rows of every length around the vector widths (Note [softmax instruction sets]: the row
// loop runs in 4, 8 or 16 lanes and a scalar tail), and the rules for values that are not
// finite: NaN is left out of the maximum and makes its row NaN through the sum, -inf gives
// 0 (log_softmax: -inf), a row of -inf only or with a +inf is NaN (x - max is NaN); the
// same lanes as columns (softmax along axis 0) follow the same rules.
TEST(SoftmaxTest, RowLengthsAndNonFiniteValues) {
  constexpr double inf = INFINITY;
  const double nan = std::nan("");
  for (dtype t : float_types) {
    for (const std::int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 127, 128, 129, 200}) {
      const tensor x = random(t, {3, n}, static_cast<std::uint64_t>(n), -8.0, 8.0);
      check_softmax(x, -1, false);
      check_softmax(x, -1, true);
    }
    std::vector<double> v(5 * 37);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 11) - 5.0;
    v[20] = nan;   // row 0
    v[37] = -inf;  // row 1: first and last in the tail
    v[37 + 36] = -inf;
    for (std::size_t i = 74; i < 111; ++i) v[i] = -inf;  // row 2
    v[111 + 34] = inf;                                   // row 3
    v[148 + 35] = nan;                                   // row 4: NaN in the tail
    const tensor x = make(t, {5, 37}, v);
    for (const bool log : {false, true}) {
      const tensor y = run_op1(log ? "log_softmax" : "softmax", {x});
      const auto got = values(y);
      expect_close(y, x.shape(), softmax_ref(values(x), x.shape(), 1, log), rtol_for(t),
                   atol_for(t));
      for (std::size_t r : {0U, 2U, 3U, 4U}) {
        for (std::size_t i = 0; i < 37; ++i) {
          EXPECT_TRUE(std::isnan(got[r * 37 + i])) << r << " " << i;
        }
      }
      EXPECT_EQ(got[37], log ? -inf : 0.0);
      EXPECT_EQ(got[37 + 36], log ? -inf : 0.0);
      EXPECT_TRUE(std::isfinite(got[38]));
      // The same lanes as columns ([37, 5], axis 0): the column-block loop, whose sums
      // round otherwise than a row's (double per column), against the reference too.
      std::vector<double> vt(v.size());
      for (std::size_t r = 0; r < 5; ++r) {
        for (std::size_t i = 0; i < 37; ++i) vt[i * 5 + r] = v[r * 37 + i];
      }
      const tensor xt = make(t, {37, 5}, vt);
      const tensor yt = run_op1(log ? "log_softmax" : "softmax", {xt}, {{"axis", std::int64_t{0}}});
      expect_close(yt, xt.shape(), softmax_ref(values(xt), xt.shape(), 0, log), rtol_for(t),
                   atol_for(t));
      EXPECT_TRUE(std::isnan(values(yt)[20 * 5]));  // row 0's NaN, now a column's
    }
  }
}

TEST(SoftmaxTest, EmptyTensorsAndBadAxes) {
  for (const shape& s : {shape{0, 5}, shape{3, 0}, shape{2, 0, 3}}) {
    for (std::int64_t a = 0; a < static_cast<std::int64_t>(s.rank()); ++a) {
      expect_close(run_op1("softmax", {make(dtype::f32, s, {})}, {{"axis", a}}), s, {});
      expect_close(run_op1("log_softmax", {make(dtype::f16, s, {})}, {{"axis", a}}), s, {});
    }
  }
  const tensor x = random(dtype::f32, {2, 3}, 1);
  for (const char* op : {"softmax", "log_softmax"}) {
    expect_error<invalid_argument>(
        [&] {
          (void)run_op1(op, {x}, {{"axis", std::int64_t{2}}});
        },
        {"under_test", op, "axis 2", "out of range"});
    expect_error<invalid_argument>([&] { (void)run_op1(op, {make(dtype::f32, {}, {1})}); },
                                   {"under_test", "out of range"});
    expect_error<invalid_argument>([&] { (void)run_op1(op, {random(dtype::i32, {3}, 1)}); },
                                   {"under_test", "int32"});
  }
}

// ---- layer_norm -------------------------------------------------------------------------

struct ln_ref {
  std::vector<double> y, mean, rstd;
};

ln_ref layer_norm_ref(const std::vector<double>& x, const shape& s, std::size_t axis,
                      const std::vector<double>& g, const std::vector<double>& b, double eps) {
  std::int64_t outer = 1;
  for (std::size_t k = 0; k < axis; ++k) outer *= s[k];
  const std::int64_t n = outer == 0 ? 0 : static_cast<std::int64_t>(x.size()) / outer;
  ln_ref r;
  r.y = std::vector<double>(x.size(), 0.0);
  for (std::int64_t o = 0; o < outer; ++o) {
    double mean = 0;
    for (std::int64_t i = 0; i < n; ++i) mean += x[static_cast<std::size_t>(o * n + i)];
    mean /= static_cast<double>(n);
    double var = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double d = x[static_cast<std::size_t>(o * n + i)] - mean;
      var += d * d;
    }
    var /= static_cast<double>(n);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(o * n + i);
      r.y[k] =
          (x[k] - mean) * rstd * g[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)];
    }
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
  }
  return r;
}

double ln_rtol(dtype t) {
  return t == dtype::f32 ? 1e-4 : rtol_for(t) * 2;
}
double ln_atol(dtype t) {
  switch (t) {
    case dtype::f32:
      return 1e-5;
    case dtype::f16:
      return 1e-2;
    case dtype::bf16:
      return 6e-2;
    default:
      return 1e-10;
  }
}

void check_layer_norm(const tensor& x, const tensor& g, const tensor& b, std::int64_t axis,
                      double eps) {
  SCOPED_TRACE(::testing::Message()
               << "layer_norm " << x.describe() << " axis " << axis << " eps " << eps);
  const auto out = run_op("layer_norm", {x, g, b}, {{"axis", axis}, {"epsilon", eps}});
  ASSERT_EQ(out.size(), 3u);
  const std::size_t a = wrap(axis, x.rank());
  const auto want = layer_norm_ref(values(x), x.shape(), a, values(g), values(b), eps);
  shape lead;
  for (std::size_t k = 0; k < a; ++k) lead.push_back(x.dim(k));
  const dtype t = x.type();
  expect_close(out[0], x.shape(), want.y, ln_rtol(t), ln_atol(t));
  expect_close(out[1], lead, want.mean, ln_rtol(t), ln_atol(t));
  expect_close(out[2], lead, want.rstd, ln_rtol(t), ln_atol(t));
}

TEST(LayerNormTest, EveryAxisEveryDtype) {
  const shape shapes[] = {{7}, {3, 8}, {2, 3, 5}, {2, 3, 4, 6}, {4, 1000}};
  std::uint64_t seed = 10;
  for (dtype t : float_types) {
    for (const auto& s : shapes) {
      for (std::size_t a = 0; a < s.rank(); ++a) {
        shape ns;
        for (std::size_t k = a; k < s.rank(); ++k) ns.push_back(s[k]);
        const tensor x = random(t, s, seed++, -3.0, 5.0);
        const tensor g = random(t, ns, seed++, 0.5, 2.0);
        const tensor b = random(t, ns, seed++, -1.0, 1.0);
        check_layer_norm(x, g, b, static_cast<std::int64_t>(a), 1e-5);
        check_layer_norm(x, g, b,
                         static_cast<std::int64_t>(a) - static_cast<std::int64_t>(s.rank()), 0.25);
        if (s.rank() >= 2)
          check_layer_norm(non_contiguous(x), g, b, static_cast<std::int64_t>(a), 1e-5);
        if (ns.rank() >= 2)
          check_layer_norm(x, non_contiguous(g), strided_view(b), static_cast<std::int64_t>(a),
                           1e-3);
      }
    }
  }
}

TEST(LayerNormTest, ConstantRowsGiveBetaAndLargeOffsetsStayAccurate) {
  const tensor x = make(dtype::f32, {2, 4}, {3, 3, 3, 3, -1, -1, -1, -1});
  const tensor g = make(dtype::f32, {4}, {1, 2, 3, 4});
  const tensor b = make(dtype::f32, {4}, {0.5, -0.5, 1, 2});
  const auto out = run_op("layer_norm", {x, g, b});
  expect_close(out[0], {2, 4}, {0.5, -0.5, 1, 2, 0.5, -0.5, 1, 2});
  expect_close(out[1], {2}, {3, -1});
  expect_close(out[2], {2}, {1 / std::sqrt(1e-5), 1 / std::sqrt(1e-5)}, 1e-5);
  // A large mean and a small spread: two-pass statistics keep the variance.
  std::vector<double> v(256);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1000.0 + static_cast<double>(i % 4) * 0.25;
  check_layer_norm(make(dtype::f32, {2, 128}, v), random(dtype::f32, {128}, 1, 0.5, 1.5),
                   random(dtype::f32, {128}, 2), -1, 1e-5);
}

TEST(LayerNormTest, EmptyTensors) {
  const auto out =
      run_op("layer_norm", {make(dtype::f32, {0, 4}, {}), make(dtype::f32, {4}, {1, 1, 1, 1}),
                            make(dtype::f32, {4}, {0, 0, 0, 0})});
  expect_close(out[0], {0, 4}, {});
  expect_close(out[1], {0}, {});
  expect_close(out[2], {0}, {});
  // Nothing to normalise over: an empty y, and NaN statistics (the mean of nothing).
  const auto none = run_op("layer_norm", {make(dtype::f32, {3, 0}, {}), make(dtype::f32, {0}, {}),
                                          make(dtype::f32, {0}, {})});
  expect_close(none[0], {3, 0}, {});
  expect_close(none[1], {3}, std::vector<double>(3, std::nan("")));
}

TEST(LayerNormTest, BadShapesAndAttributes) {
  const tensor x = random(dtype::f32, {2, 3, 4}, 1);
  const tensor g4 = random(dtype::f32, {4}, 2);
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, random(dtype::f32, {3}, 2), g4});
      },
      {"under_test", "layer_norm", "gamma", "[3]", "[4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, g4, g4}, {{"axis", std::int64_t{1}}});
      },
      {"under_test", "gamma", "[3, 4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, g4, random(dtype::f32, {1, 4}, 3)});
      },
      {"under_test", "beta"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, g4, g4}, {{"axis", std::int64_t{3}}});
      },
      {"under_test", "out of range"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, g4, g4}, {{"epsilon", -1.0}});
      },
      {"under_test", "epsilon"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm", {x, random(dtype::f64, {4}, 2), g4});
      },
      {"under_test", "float64"});
}

// ---- softmax_cross_entropy --------------------------------------------------------------

void check_xent(const tensor& logits, const tensor& labels) {
  SCOPED_TRACE(::testing::Message() << "xent " << logits.describe() << " " << labels.describe());
  const auto out = run_op("softmax_cross_entropy", {logits, labels});
  ASSERT_EQ(out.size(), 2u);
  const std::int64_t n = logits.dim(0);
  const std::int64_t c = logits.dim(1);
  const auto x = values(logits);
  const auto l = values(labels);
  const auto sm = softmax_ref(x, logits.shape(), 1, false);
  const auto lsm = softmax_ref(x, logits.shape(), 1, true);
  std::vector<double> loss(static_cast<std::size_t>(n));
  std::vector<double> back(sm);
  for (std::int64_t r = 0; r < n; ++r) {
    const auto label = static_cast<std::int64_t>(l[static_cast<std::size_t>(r)]);
    loss[static_cast<std::size_t>(r)] = -lsm[static_cast<std::size_t>(r * c + label)];
    back[static_cast<std::size_t>(r * c + label)] -= 1.0;
  }
  const dtype t = logits.type();
  expect_close(out[0], {n}, loss, rtol_for(t), atol_for(t) * 4);
  expect_close(out[1], {n, c}, back, rtol_for(t), atol_for(t));
}

tensor labels_for(dtype lt, std::int64_t n, std::int64_t c, std::uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<double>((i * 7 + seed) % static_cast<std::uint64_t>(c));
  }
  return make(lt, {n}, v);
}

TEST(SoftmaxCrossEntropyTest, MatchesReferenceForEveryDtypeAndLabelType) {
  const std::pair<std::int64_t, std::int64_t> sizes[] = {{1, 1}, {4, 3}, {17, 10}, {64, 1000}};
  std::uint64_t seed = 3;
  for (dtype t : float_types) {
    for (dtype lt : {dtype::i32, dtype::i64}) {
      for (auto [n, c] : sizes) {
        const tensor x = random(t, {n, c}, seed++, -6.0, 6.0);
        const tensor l = labels_for(lt, n, c, seed++);
        check_xent(x, l);
        if (c >= 2) check_xent(non_contiguous(x), strided_view(l));
      }
    }
  }
}

TEST(SoftmaxCrossEntropyTest, LargeLogitsAndEmptyBatch) {
  for (dtype t : float_types) {
    const double big = t == dtype::bf16 ? 1024 : 1000;
    const tensor x = make(t, {2, 3}, {big, 0, -big, -big, big, 2});
    check_xent(x, make(dtype::i64, {2}, {2, 1}));
    const auto out = run_op("softmax_cross_entropy", {x, make(dtype::i32, {2}, {2, 0})});
    for (double v : values(out[0])) EXPECT_TRUE(std::isfinite(v));
    for (double v : values(out[1])) EXPECT_TRUE(std::isfinite(v));
  }
  const auto empty =
      run_op("softmax_cross_entropy", {make(dtype::f32, {0, 5}, {}), make(dtype::i32, {0}, {})});
  expect_close(empty[0], {0}, {});
  expect_close(empty[1], {0, 5}, {});
}

TEST(SoftmaxCrossEntropyTest, LabelsOutOfRangeFailAtRunTime) {
  const tensor x = random(dtype::f32, {3, 4}, 1);
  for (dtype lt : {dtype::i32, dtype::i64}) {
    expect_error<node_error>(
        [&] {
          (void)run_op("softmax_cross_entropy", {x, make(lt, {3}, {0, 4, 1})});
        },
        {"under_test", "softmax_cross_entropy", "label 4", "row 1", "[0, 4)"});
    expect_error<node_error>(
        [&] {
          (void)run_op("softmax_cross_entropy", {x, make(lt, {3}, {0, 1, -1})});
        },
        {"under_test", "label -1", "row 2"});
  }
  // No class at all: every label is out of range.
  expect_error<node_error>(
      [&] {
        (void)run_op("softmax_cross_entropy",
                     {make(dtype::f32, {2, 0}, {}), make(dtype::i32, {2}, {0, 0})});
      },
      {"under_test", "label 0", "row 0"});
}

TEST(SoftmaxCrossEntropyTest, ShapeAndTypeMismatchesFailAtConstruction) {
  const tensor x = random(dtype::f32, {3, 4}, 1);
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("softmax_cross_entropy", {x, make(dtype::i32, {2}, {0, 1})});
      },
      {"under_test", "labels", "[2]", "[3, 4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("softmax_cross_entropy", {random(dtype::f32, {12}, 1),
                                               make(dtype::i32, {12}, std::vector<double>(12, 0))});
      },
      {"under_test", "logits", "[N, C]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("softmax_cross_entropy", {x, make(dtype::i32, {3, 1}, {0, 1, 2})});
      },
      {"under_test", "labels", "[N]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("softmax_cross_entropy", {x, make(dtype::f32, {3}, {0, 1, 2})});
      },
      {"under_test", "Tlabels"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("softmax_cross_entropy",
                     {random(dtype::i32, {3, 4}, 1), make(dtype::i32, {3}, {0, 1, 2})});
      },
      {"under_test", "int32"});
}

// ---- argmax -----------------------------------------------------------------------------

std::vector<double> argmax_ref(const std::vector<double>& x, const shape& s, std::size_t axis) {
  std::vector<double> out;
  shape rest;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (k != axis) rest.push_back(s[k]);
  }
  out.resize(static_cast<std::size_t>(rest.num_elements()));
  std::size_t o = 0;
  std::vector<std::pair<std::int64_t, double>> lanes;
  for_each_lane(s, axis, [&](std::int64_t base, std::int64_t stride, std::int64_t n) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < n; ++i) {
      const double b = x[static_cast<std::size_t>(base + best * stride)];
      const double v = x[static_cast<std::size_t>(base + i * stride)];
      if (std::isnan(b)) break;
      if (std::isnan(v) || v > b) best = i;
    }
    lanes.push_back({base, static_cast<double>(best)});
  });
  // Lanes come in (outer, inner) order, which is the output's row-major order.
  for (const auto& lane : lanes) out[o++] = lane.second;
  return out;
}

void check_argmax(const tensor& x, std::int64_t axis, dtype out_t) {
  SCOPED_TRACE(::testing::Message()
               << "argmax " << x.describe() << " axis " << axis << " -> " << to_string(out_t));
  const tensor y = run_op1("argmax", {x}, {{"axis", axis}, {"output_type", out_t}});
  EXPECT_EQ(y.type(), out_t);
  const std::size_t a = wrap(axis, x.rank());
  shape rest;
  for (std::size_t k = 0; k < x.rank(); ++k) {
    if (k != a) rest.push_back(x.dim(k));
  }
  expect_close(y, rest, argmax_ref(values(x), x.shape(), a), 0, 0);
}

TEST(ArgmaxTest, EveryAxisEveryDtype) {
  const shape shapes[] = {{6}, {3, 4}, {2, 3, 4}, {2, 3, 1, 5}, {5, 100}, {3, 7, 130}};
  std::uint64_t seed = 20;
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                  dtype::i8, dtype::u8}) {
    for (const auto& s : shapes) {
      for (std::int64_t a = -static_cast<std::int64_t>(s.rank());
           a < static_cast<std::int64_t>(s.rank()); ++a) {
        // Few distinct values, so ties are common.
        const tensor x = random(t, s, seed++, 0.0, 6.0);
        const dtype out_t = seed % 2 == 0 ? dtype::i64 : dtype::i32;
        check_argmax(x, a, out_t);
        if (s.rank() >= 2) {
          check_argmax(non_contiguous(x), a, out_t);
          check_argmax(strided_view(x), a, out_t);
        }
      }
    }
  }
}

TEST(ArgmaxTest, TiesGiveFirstIndexAndNanWins) {
  const double nan = std::nan("");
  expect_close(run_op1("argmax", {make(dtype::f32, {4}, {1, 3, 3, 2})}), {}, {1});
  expect_close(run_op1("argmax", {make(dtype::f32, {4}, {1, nan, 5, nan})}), {}, {1});
  expect_close(run_op1("argmax", {make(dtype::f64, {3}, {nan, 9, 1})}), {}, {0});
  expect_close(run_op1("argmax", {make(dtype::f32, {3}, {-INFINITY, -INFINITY, -INFINITY})}), {},
               {0});
  // Column path (axis 0): the same rules per column.
  const tensor x = make(dtype::f32, {3, 4},
                        {1, nan, 2, 5,  //
                         1, 3, nan, 5,  //
                         0, 9, nan, 7});
  expect_close(run_op1("argmax", {x}, {{"axis", std::int64_t{0}}}), {4}, {0, 0, 1, 2});
  expect_close(run_op1("argmax", {x}), {3}, {1, 2, 2});
}

TEST(ArgmaxTest, EmptyAxisFailsAndEmptyOutputsWork) {
  expect_close(run_op1("argmax", {make(dtype::f32, {0, 3}, {})}), {0}, {});
  expect_close(run_op1("argmax", {make(dtype::f32, {3, 4, 0}, {})}, {{"axis", std::int64_t{1}}}),
               {3, 0}, {});
  expect_error<node_error>(
      [&] {
        (void)run_op1("argmax", {make(dtype::f32, {3, 0}, {})});
      },
      {"under_test", "argmax", "empty axis", "[3, 0]"});
  expect_error<node_error>(
      [&] {
        (void)run_op1("argmax", {make(dtype::f32, {0, 0}, {})}, {{"axis", std::int64_t{0}}});
      },
      {"under_test", "empty axis"});
  expect_error<invalid_argument>([&] { (void)run_op1("argmax", {make(dtype::f32, {}, {1})}); },
                                 {"under_test", "out of range"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op1("argmax", {make(dtype::f32, {2}, {1, 2})}, {{"output_type", dtype::f32}});
      },
      {"under_test", "output_type"});
}

// ---- builders ---------------------------------------------------------------------------

TEST(ReductionBuildersTest, InferTypes) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f16, {-1, 8, 16});
  EXPECT_EQ(ops::softmax(x).type(), (tensor_type{dtype::f16, shape{-1, 8, 16}}));
  EXPECT_EQ(ops::log_softmax(x, 1, {.name = "ls"}).producer().name, "ls");
  const auto gamma = ops::placeholder(b, "gamma", dtype::f16, {8, 16});
  const auto beta = ops::placeholder(b, "beta", dtype::f16, {8, -1});
  const auto ln = ops::layer_norm(x, gamma, beta, 1, 1e-3);
  EXPECT_EQ(ln.y.type(), (tensor_type{dtype::f16, shape{-1, 8, 16}}));
  EXPECT_EQ(ln.mean.type(), (tensor_type{dtype::f16, shape{-1}}));
  EXPECT_EQ(ln.rstd.type(), (tensor_type{dtype::f16, shape{-1}}));
  EXPECT_EQ(ln.rstd.ep().index, 2);
  EXPECT_EQ(ln.y.producer().attr<double>("epsilon"), 1e-3);
  EXPECT_THROW((void)ops::layer_norm(x, gamma, beta, -1), invalid_argument);

  const auto logits = ops::placeholder(b, "logits", dtype::f32, {-1, 10});
  const auto labels = ops::placeholder(b, "labels", dtype::i32, {32});
  const auto xe = ops::softmax_cross_entropy(logits, labels);
  EXPECT_EQ(xe.loss.type(), (tensor_type{dtype::f32, shape{32}}));
  EXPECT_EQ(xe.backprop.type(), (tensor_type{dtype::f32, shape{32, 10}}));
  EXPECT_EQ(xe.loss.producer().attr<dtype>("Tlabels"), dtype::i32);
  const auto bad = ops::placeholder(b, "bad", dtype::i64, {16});
  EXPECT_THROW(
      (void)ops::softmax_cross_entropy(ops::placeholder(b, "l2", dtype::f32, {32, 10}), bad),
      invalid_argument);

  EXPECT_EQ(ops::argmax(x).type(), (tensor_type{dtype::i64, shape{-1, 8}}));
  EXPECT_EQ(ops::argmax(x, 0, dtype::i32).type(), (tensor_type{dtype::i32, shape{8, 16}}));
  EXPECT_THROW((void)ops::argmax(x, 3), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
