// batch_norm (src/backends/cpu/normalization_batch_norm.cpp) and the normalization and
// statistics builders composed of other ops (batch_norm_training, group_norm, instance_norm,
// rms_norm, var, std, logsumexp) against float64 loops written here: every float dtype,
// ranks 2 to 5, non-contiguous inputs, empty tensors, NaN, and bad input at graph build time
// and at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/builder_run_support.hpp"
#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using namespace reduction;

// x [N, C, ...] as (outer, channels, inner).
struct nci {
  std::int64_t n, c, inner;
};
nci split_nc(const shape& s) {
  std::int64_t inner = 1;
  for (std::size_t k = 2; k < s.rank(); ++k) inner *= s[k];
  return {s[0], s[1], inner};
}

std::vector<double> batch_norm_reference(const tensor& x, const tensor& scale, const tensor& bias,
                                         const tensor& mean, const tensor& var, double eps) {
  const auto xv = values(x);
  const auto sc = values(scale);
  const auto bi = values(bias);
  const auto mu = values(mean);
  const auto va = values(var);
  const nci g = split_nc(x.shape());
  std::vector<double> y(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / g.inner) % g.c);
    y[i] = (xv[i] - mu[c]) / std::sqrt(va[c] + eps) * sc[c] + bi[c];
  }
  return y;
}

TEST(BatchNormTest, MatchesTheFloat64FormulaForEveryDtypeAndRank) {
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    for (const shape& s : {shape{4, 3}, shape{2, 3, 5}, shape{2, 4, 3, 5}, shape{1, 2, 2, 3, 2},
                           shape{3, 1, 7, 1}}) {
      SCOPED_TRACE(::testing::Message() << to_string(t) << " " << to_string(s));
      const shape c{s[1]};
      const tensor x = random(t, s, seed++, -3.0, 3.0);
      const tensor scale = random(t, c, seed++, -2.0, 2.0);
      const tensor bias = random(t, c, seed++, -1.0, 1.0);
      const tensor mean = random(t, c, seed++, -1.0, 1.0);
      const tensor var = random(t, c, seed++, 0.1, 2.0);
      for (double eps : {1e-5, 0.5}) {
        const tensor y =
            run_op1("batch_norm", {x, scale, bias, mean, var}, {{"epsilon", eps}});
        expect_close(y, s, batch_norm_reference(x, scale, bias, mean, var, eps), rtol_for(t),
                     4 * atol_for(t));
      }
    }
  }
}

TEST(BatchNormTest, DefaultEpsilonNonContiguousEmptyAndNaN) {
  const tensor x = random(dtype::f32, {2, 3, 4, 5}, 7);
  const tensor scale = random(dtype::f32, {3}, 8);
  const tensor bias = random(dtype::f32, {3}, 9);
  const tensor mean = random(dtype::f32, {3}, 10);
  const tensor var = random(dtype::f32, {3}, 11, 0.0, 1.0);
  // The default epsilon is ONNX's 1e-5 (var may be 0: only epsilon keeps it finite).
  expect_close(run_op1("batch_norm", {x, scale, bias, mean, var}), x.shape(),
               batch_norm_reference(x, scale, bias, mean, var, 1e-5), 1e-5, 1e-5);
  const tensor xt = non_contiguous(x);
  expect_close(run_op1("batch_norm", {xt, scale, bias, mean, var}), xt.shape(),
               batch_norm_reference(xt, scale, bias, mean, var, 1e-5), 1e-5, 1e-5);
  const tensor sv = strided_view(scale);
  expect_close(run_op1("batch_norm", {x, sv, bias, mean, var}), x.shape(),
               batch_norm_reference(x, sv, bias, mean, var, 1e-5), 1e-5, 1e-5);
  // Empty batches and empty images.
  for (const shape& s : {shape{0, 3, 2}, shape{2, 3, 0}}) {
    EXPECT_EQ(run_op1("batch_norm", {make(dtype::f32, s, {}), scale, bias, mean, var}).shape(), s);
  }
  EXPECT_EQ(run_op1("batch_norm", {make(dtype::f32, {2, 0}, {}), make(dtype::f32, {0}, {}),
                                   make(dtype::f32, {0}, {}), make(dtype::f32, {0}, {}),
                                   make(dtype::f32, {0}, {})})
                .shape(),
            (shape{2, 0}));
  // NaN in x stays where it is; a negative variance below -eps makes its channel NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const tensor xn = make(dtype::f64, {1, 2, 2}, {nan, 1.0, 2.0, 3.0});
  const tensor one = make(dtype::f64, {2}, {1.0, 1.0});
  const tensor zero = make(dtype::f64, {2}, {0.0, 0.0});
  const tensor v = make(dtype::f64, {2}, {1.0, -2.0});
  const auto y = values(run_op1("batch_norm", {xn, one, zero, zero, v}, {{"epsilon", 0.0}}));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 1.0);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_TRUE(std::isnan(y[3]));
}

TEST(BatchNormTest, BadInputIsATypedError) {
  const tensor v3 = random(dtype::f32, {3}, 1);
  const tensor x = random(dtype::f32, {2, 3, 4}, 2);
  expect_error<invalid_argument>(
      [&] { (void)run_op("batch_norm", {random(dtype::f32, {3}, 3), v3, v3, v3, v3}); },
      {"under_test", "rank >= 2", "[3]"});
  expect_error<invalid_argument>(
      [&] { (void)run_op("batch_norm", {x, v3, v3, random(dtype::f32, {4}, 4), v3}); },
      {"under_test", "mean of shape [4] must be [C] = [3]", "[2, 3, 4]"});
  expect_error<invalid_argument>(
      [&] { (void)run_op("batch_norm", {x, random(dtype::f32, {3, 1}, 4), v3, v3, v3}); },
      {"under_test", "scale of shape [3, 1]"});
  expect_error<invalid_argument>(
      [&] {
        const tensor xi = random(dtype::i32, {2, 3}, 5);
        const tensor vi = random(dtype::i32, {3}, 6);
        (void)run_op("batch_norm", {xi, vi, vi, vi, vi});
      },
      {"under_test", "int32"});
  expect_error<invalid_argument>(
      [&] { (void)run_op("batch_norm", {x, v3, v3, v3, v3}, {{"epsilon", -1.0}}); },
      {"epsilon must be >= 0"});
  // At run time: declared with unknown dims, the kernel's rule names the vector.
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("batch_norm", {x, v3, random(dtype::f32, {5}, 7), v3, v3},
                              {shape{-1, -1, -1}, shape{-1}, shape{-1}, shape{-1}, shape{-1}});
      },
      {"under_test", "batch_norm", "bias of shape [5] must be [C] = [3]"});
}

// ---- builders composed of other ops --------------------------------------------------------

// Normalises x (values xv) over the index sets given by `key` (elements with the same key
// share statistics): (x - mean) / sqrt(biased var + eps), then · scale[c] + bias[c].
template <class Key, class Chan>
std::vector<double> normalize_groups(const std::vector<double>& xv, Key key, Chan chan,
                                     const std::vector<double>& scale,
                                     const std::vector<double>& bias, double eps, bool rms) {
  std::vector<double> sum(xv.size(), 0.0), sq(xv.size(), 0.0), cnt(xv.size(), 0.0);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    sum[key(i)] += xv[i];
    cnt[key(i)] += 1;
  }
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const double m = rms ? 0.0 : sum[key(i)] / cnt[key(i)];
    sq[key(i)] += (xv[i] - m) * (xv[i] - m);
  }
  std::vector<double> y(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const std::size_t k = key(i);
    const double m = rms ? 0.0 : sum[k] / cnt[k];
    const double v = sq[k] / cnt[k];
    const std::size_t c = chan(i);
    y[i] = (xv[i] - m) / std::sqrt(v + eps) * scale[c] + (rms ? 0.0 : bias[c]);
  }
  return y;
}

TEST(NormalizationBuilders, GroupInstanceBatchTrainingAndRmsNormAgainstFloat64) {
  const shape s{2, 6, 3, 2};
  const nci g = split_nc(s);
  for (dtype t : {dtype::f64, dtype::f32}) {
    SCOPED_TRACE(to_string(t));
    const double tol = t == dtype::f64 ? 1e-12 : 1e-5;
    const tensor x = random(t, s, 1, -3.0, 3.0);
    const tensor scale = random(t, {6}, 2);
    const tensor bias = random(t, {6}, 3);
    const auto xv = values(x);
    const auto sc = values(scale);
    const auto bi = values(bias);
    const auto chan = [&](std::size_t i) {
      return static_cast<std::size_t>((static_cast<std::int64_t>(i) / g.inner) % g.c);
    };
    const auto batch = [&](std::size_t i) {
      return static_cast<std::size_t>(static_cast<std::int64_t>(i) / (g.inner * g.c));
    };
    for (std::int64_t groups : {1, 2, 3, 6}) {
      const std::int64_t per = g.c / groups;
      const auto key = [&](std::size_t i) {
        return batch(i) * static_cast<std::size_t>(groups) +
               chan(i) / static_cast<std::size_t>(per);
      };
      const tensor y = run_builder({x, scale, bias}, [&](const std::vector<output>& in) {
        return ops::group_norm(in[0], in[1], in[2], groups, 1e-3);
      });
      expect_close(y, s, normalize_groups(xv, key, chan, sc, bi, 1e-3, false), tol, tol);
    }
    const auto inst_key = [&](std::size_t i) {
      return batch(i) * static_cast<std::size_t>(g.c) + chan(i);
    };
    expect_close(run_builder({x, scale, bias},
                             [&](const std::vector<output>& in) {
                               return ops::instance_norm(in[0], in[1], in[2]);
                             }),
                 s, normalize_groups(xv, inst_key, chan, sc, bi, 1e-5, false), tol, tol);
    expect_close(run_builder({x, scale, bias},
                             [&](const std::vector<output>& in) {
                               return ops::batch_norm_training(in[0], in[1], in[2], 1e-2);
                             }),
                 s, normalize_groups(xv, chan, chan, sc, bi, 1e-2, false), tol, tol);
    // rms_norm over the last dim and over the last two.
    const tensor g2 = random(t, {2}, 4);
    const auto g2v = values(g2);
    expect_close(
        run_builder({x, g2},
                    [&](const std::vector<output>& in) { return ops::rms_norm(in[0], in[1]); }),
        s,
        normalize_groups(
            xv, [](std::size_t i) { return i / 2; }, [](std::size_t i) { return i % 2; }, g2v,
            {}, 1e-5, true),
        tol, tol);
    const tensor g32 = random(t, {3, 2}, 5);
    const auto g32v = values(g32);
    expect_close(run_builder({x, g32},
                             [&](const std::vector<output>& in) {
                               return ops::rms_norm(in[0], in[1], -2, 0.1);
                             }),
                 s,
                 normalize_groups(
                     xv, [](std::size_t i) { return i / 6; }, [](std::size_t i) { return i % 6; },
                     g32v, {}, 0.1, true),
                 tol, tol);
  }
}

TEST(NormalizationBuilders, VarStdAndLogsumexpAgainstFloat64) {
  const shape s{3, 4, 5};
  const tensor x = random(dtype::f64, s, 9, -2.0, 2.0);
  const auto xv = values(x);
  // Over axis 1 (keepdims) with each correction, and over everything.
  for (double corr : {0.0, 1.0, 2.5}) {
    std::vector<double> want;
    for (std::int64_t a = 0; a < 3; ++a) {
      for (std::int64_t c = 0; c < 5; ++c) {
        double m = 0.0;
        for (std::int64_t b = 0; b < 4; ++b) m += xv[static_cast<std::size_t>((a * 4 + b) * 5 + c)];
        m /= 4;
        double ss = 0.0;
        for (std::int64_t b = 0; b < 4; ++b) {
          const double d = xv[static_cast<std::size_t>((a * 4 + b) * 5 + c)] - m;
          ss += d * d;
        }
        want.push_back(ss / (4 - corr));
      }
    }
    expect_close(run_builder({x},
                             [&](const std::vector<output>& in) {
                               return ops::var(in[0], {-2}, true, corr);
                             }),
                 {3, 1, 5}, want, 1e-12, 1e-12);
    for (double& w : want) w = std::sqrt(w);
    expect_close(run_builder({x},
                             [&](const std::vector<output>& in) {
                               return ops::std(in[0], {1}, false, corr);
                             }),
                 {3, 5}, want, 1e-12, 1e-12);
  }
  double m = 0.0;
  for (double v : xv) m += v;
  m /= static_cast<double>(xv.size());
  double ss = 0.0;
  for (double v : xv) ss += (v - m) * (v - m);
  expect_close(run_builder({x}, [&](const std::vector<output>& in) { return ops::var(in[0]); }),
               {}, {ss / static_cast<double>(xv.size())}, 1e-12, 1e-12);
  // ddof = n: 0 / 0 and s / 0, as NumPy.
  const auto d = values(run_builder({make(dtype::f64, {2, 1}, {1.0, 2.0})},
                                    [&](const std::vector<output>& in) {
                                      return ops::var(in[0], {1}, false, 1.0);
                                    }));
  EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]));
  // logsumexp over the last axis, large values included.
  const tensor big = make(dtype::f64, {2, 2}, {1000.0, 1000.0, -3.0, 4.0});
  expect_close(
      run_builder({big},
                  [&](const std::vector<output>& in) { return ops::logsumexp(in[0], {-1}); }),
      {2}, {1000.0 + std::log(2.0), 4.0 + std::log1p(std::exp(-7.0))}, 1e-12, 1e-12);
}

TEST(NormalizationBuilders, BadArgumentsAreTypedErrors) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {2, 6, 3});
  const auto c = ops::placeholder(b, "c", dtype::f32, {6});
  expect_error<invalid_argument>([&] { (void)ops::group_norm(x, c, c, 4); },
                                 {"group_norm", "groups 4", "6 channels"});
  expect_error<invalid_argument>([&] { (void)ops::rms_norm(x, c, 3); },
                                 {"rms_norm", "axis 3 is out of range"});
  const auto v = ops::placeholder(b, "v", dtype::f32, {4});
  expect_error<invalid_argument>([&] { (void)ops::instance_norm(v, c, c); },
                                 {"instance_norm", "rank >= 3", "[4]"});
  expect_error<invalid_argument>([&] { (void)ops::var(x, {3}); }, {"out of range"});
  // batch_norm's own inference: the vectors must be [C].
  expect_error<invalid_argument>([&] { (void)ops::batch_norm(x, c, c, c, v); },
                                 {"var of shape [4] must be [C] = [6]"});
}

}  // namespace
}  // namespace loom::testing
