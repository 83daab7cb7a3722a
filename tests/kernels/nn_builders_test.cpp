// The nn builders composed of other ops (src/graph/ops/nn_builders.cpp) run in a session
// against float64 loops written here: conv1d, lp_pool2d, global_avg_pool / global_max_pool,
// depth_to_space (both modes) and space_to_depth, and their bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/builder_run_support.hpp"
#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using reduction::expect_error;

TEST(Conv1dTest, MatchesADirectLoop) {
  const std::int64_t n = 2, c = 4, l = 9, o = 6, k = 3, groups = 2;
  const std::int64_t stride = 2, dil = 2, pl = 2, pr = 1;
  const tensor x = random(dtype::f64, {n, c, l}, 1);
  const tensor w = random(dtype::f64, {o, c / groups, k}, 2);
  const auto xv = values(x);
  const auto wv = values(w);
  const std::int64_t ol = (l + pl + pr - dil * (k - 1) - 1) / stride + 1;
  std::vector<double> want(static_cast<std::size_t>(n * o * ol), 0.0);
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t f = 0; f < o; ++f) {
      const std::int64_t g = f / (o / groups);
      for (std::int64_t p = 0; p < ol; ++p) {
        double acc = 0.0;
        for (std::int64_t cc = 0; cc < c / groups; ++cc) {
          for (std::int64_t t = 0; t < k; ++t) {
            const std::int64_t i = p * stride - pl + t * dil;
            if (i < 0 || i >= l) continue;
            acc += xv[static_cast<std::size_t>((b * c + g * (c / groups) + cc) * l + i)] *
                   wv[static_cast<std::size_t>((f * (c / groups) + cc) * k + t)];
          }
        }
        want[static_cast<std::size_t>((b * o + f) * ol + p)] = acc;
      }
    }
  }
  const tensor y = run_builder({x, w}, [&](const std::vector<output>& in) {
    return ops::conv1d(in[0], in[1], stride, {pl, pr}, dil, groups);
  });
  expect_close(y, {n, o, ol}, want, 1e-12, 1e-12);
}

TEST(GlobalPoolTest, MeanAndMaxOverTheSpatialDims) {
  const tensor x = random(dtype::f32, {2, 3, 4, 5}, 3);
  const auto xv = values(x);
  std::vector<double> mean(6, 0.0), mx(6, -1e300);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    mean[i / 20] += xv[i] / 20.0;
    mx[i / 20] = std::max(mx[i / 20], xv[i]);
  }
  expect_close(run_builder({x}, [](const std::vector<output>& in) {
                 return ops::global_avg_pool(in[0]);
               }),
               {2, 3, 1, 1}, mean, 1e-6, 1e-6);
  expect_close(run_builder({x}, [](const std::vector<output>& in) {
                 return ops::global_max_pool(in[0]);
               }),
               {2, 3, 1, 1}, mx, 0, 0);
  graph g;
  graph_builder b(g);
  expect_error<invalid_argument>(
      [&] { (void)ops::global_avg_pool(ops::placeholder(b, "v", dtype::f32, {2, 3})); },
      {"global_avg_pool", "rank >= 3"});
}

TEST(LpPoolTest, MatchesADirectLoopWithZeroPadding) {
  const tensor x = random(dtype::f64, {2, 2, 5, 6}, 8);
  const auto xv = values(x);
  for (const double p : {1.0, 2.0, 3.0}) {
    // kernel 3x2, strides 2x2, padding top 1, bottom 0, left 1, right 1.
    const std::int64_t oh = (5 + 1 - 3) / 2 + 1, ow = (6 + 2 - 2) / 2 + 1;
    std::vector<double> want;
    for (std::int64_t plane = 0; plane < 4; ++plane) {
      for (std::int64_t y = 0; y < oh; ++y) {
        for (std::int64_t z = 0; z < ow; ++z) {
          double acc = 0.0;
          for (std::int64_t i = 0; i < 3; ++i) {
            for (std::int64_t j = 0; j < 2; ++j) {
              const std::int64_t iy = y * 2 - 1 + i, ix = z * 2 - 1 + j;
              if (iy < 0 || iy >= 5 || ix < 0 || ix >= 6) continue;
              acc += std::pow(std::fabs(xv[static_cast<std::size_t>((plane * 5 + iy) * 6 + ix)]), p);
            }
          }
          want.push_back(std::pow(acc, 1.0 / p));
        }
      }
    }
    ops::pool_options o;
    o.kernel = {3, 2};
    o.strides = {2, 2};
    o.padding = {1, 0, 1, 1};
    expect_close(run_builder({x}, [&](const std::vector<output>& in) {
                   return ops::lp_pool2d(in[0], p, o);
                 }),
                 {2, 2, oh, ow}, want, 1e-12, 1e-12);
  }
  graph g;
  graph_builder gb(g);
  expect_error<invalid_argument>(
      [&] {
        (void)ops::lp_pool2d(ops::placeholder(gb, "p", dtype::f32, {1, 1, 4, 4}), 0.5, {{2, 2}});
      },
      {"lp_pool2d", "p must be >= 1"});
}

TEST(DepthToSpaceTest, BothModesAndTheInverseAgainstOnnxIndexFormulas) {
  const std::int64_t n = 2, c = 8, h = 3, w = 2, b = 2, cb = c / (b * b);
  const tensor x = random(dtype::f32, {n, c, h, w}, 4);
  const auto xv = values(x);
  for (const std::string mode : {"DCR", "CRD"}) {
    SCOPED_TRACE(mode);
    std::vector<double> want(xv.size());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t k = 0; k < cb; ++k) {
        for (std::int64_t y = 0; y < h * b; ++y) {
          for (std::int64_t z = 0; z < w * b; ++z) {
            const std::int64_t i = y % b, j = z % b;
            const std::int64_t src_c = mode == "DCR" ? (i * b + j) * cb + k : k * b * b + i * b + j;
            want[static_cast<std::size_t>(((q * cb + k) * h * b + y) * w * b + z)] =
                xv[static_cast<std::size_t>(((q * c + src_c) * h + y / b) * w + z / b)];
          }
        }
      }
    }
    expect_close(run_builder({x}, [&](const std::vector<output>& in) {
                   return ops::depth_to_space(in[0], b, mode);
                 }),
                 {n, cb, h * b, w * b}, want, 0, 0);
  }
  // space_to_depth undoes depth_to_space "DCR".
  const tensor back = run_builder({x}, [&](const std::vector<output>& in) {
    return ops::space_to_depth(ops::depth_to_space(in[0], b), b);
  });
  expect_close(back, x.shape(), xv, 0, 0);
  graph g;
  graph_builder gb(g);
  const auto p = ops::placeholder(gb, "p", dtype::f32, {1, 6, 4, 4});
  expect_error<invalid_argument>([&] { (void)ops::depth_to_space(p, 2); },
                                 {"depth_to_space", "blocksize 2", "6 channels"});
  expect_error<invalid_argument>([&] { (void)ops::depth_to_space(p, 1, "XYZ"); }, {"mode"});
  expect_error<invalid_argument>([&] { (void)ops::space_to_depth(p, 3); },
                                 {"space_to_depth", "blocksize 3"});
}

}  // namespace
}  // namespace loom::testing

namespace loom::testing {
namespace {

// Inverted dropout: every output is 0 or x / (1 - rate); the kept fraction is near 1 - rate;
// rate 0 is x; the same seed gives the same first mask in a new session.
TEST(DropoutTest, KeepsAFractionScaledAndIsRepeatable) {
  const std::int64_t n = 20000;
  std::vector<float> xs(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) xs[static_cast<std::size_t>(i)] = 1.0F + static_cast<float>(i % 7);
  const tensor x = memory::host_tensor<float>({n}, xs);
  for (const double rate : {0.0, 0.25, 0.5}) {
    SCOPED_TRACE(rate);
    const auto run = [&] { return run_builder({x}, [&](const std::vector<output>& v) { return ops::dropout(v[0], rate, 7); }); };
    const tensor y = run();
    const auto yv = values(y);
    std::int64_t kept = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double want = static_cast<double>(xs[static_cast<std::size_t>(i)]) / (1.0 - rate);
      const double got = yv[static_cast<std::size_t>(i)];
      if (got != 0.0) {
        ++kept;
        EXPECT_NEAR(got, want, 1e-5 * want) << i;
      }
    }
    const double frac = static_cast<double>(kept) / static_cast<double>(n);
    EXPECT_NEAR(frac, 1.0 - rate, 0.02);  // 20000 draws: the standard error is below 0.004
    EXPECT_EQ(values(run()), yv);
  }
}

// In training every step draws a new mask (the passes do not fold it into a constant), each
// with the expected fraction kept; the gradient of a step goes through that step's mask; a
// new session repeats the same sequence of masks.
TEST(DropoutTest, EachRunDrawsANewMaskAndTheGradientFollowsIt) {
  const std::int64_t n = 4096;
  const double rate = 0.5;
  const auto masks = [&] {
    graph g;
    graph_builder b(g);
    const auto x = ops::placeholder(b, "x", dtype::f32, {n});
    const auto y = ops::dropout(x, rate, 11, {.name = "y", .device = {}});
    const std::string dx = gradients(ops::reduce_sum(y, {0}), {x}).at(0).name();
    session s(std::move(g));
    const tensor ones = memory::host_tensor<float>({n}, std::vector<float>(static_cast<std::size_t>(n), 1.0F));
    std::vector<std::vector<double>> out;
    for (int step = 0; step < 3; ++step) {
      const auto r = s.run({{"x", ones}}, {"y", dx});
      const auto yv = values(r[0]);
      const auto gv = values(r[1]);
      std::int64_t kept = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        EXPECT_TRUE(yv[k] == 0.0 || yv[k] == 2.0) << yv[k];
        EXPECT_EQ(gv[k], yv[k]) << "the gradient's mask is the step's: " << i;
        kept += yv[k] != 0.0 ? 1 : 0;
      }
      EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 1.0 - rate, 0.04);
      out.push_back(yv);
    }
    return out;
  };
  const auto first = masks();
  EXPECT_NE(first[0], first[1]);
  EXPECT_NE(first[1], first[2]);
  EXPECT_EQ(masks(), first);
}

// Bad rates and shapes the mask cannot be drawn for are typed errors.
TEST(DropoutTest, BadRatesAndShapes) {
  graph g;
  graph_builder b(g);
  const auto p = ops::placeholder(b, "x", dtype::f32, {4});
  EXPECT_THROW((void)ops::dropout(p, 1.0, 1), invalid_argument);
  EXPECT_THROW((void)ops::dropout(p, -0.1, 1), invalid_argument);
  const auto unknown = ops::placeholder(b, "u", dtype::f32, {-1});
  EXPECT_THROW((void)ops::dropout(unknown, 0.5, 1), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
