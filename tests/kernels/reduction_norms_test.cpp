// reduce_l1 / l2 / sum_square / log_sum / log_sum_exp and reduce_any / all against float64
// (and bool) loops written here, as ONNX's reference implementations compute them: every axes
// combination on ranks 0..3 with and without keepdims, every dtype each op takes, strided
// inputs, large rows (the vectorised sums), empty reductions, NaN and infinities, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"

namespace loom::testing {
namespace {

using namespace reduction;

enum class kind { l1, l2, sum_square, log_sum, log_sum_exp, any, all };
constexpr kind float_kinds[] = {kind::l1, kind::l2, kind::sum_square, kind::log_sum,
                                kind::log_sum_exp};

const char* op_of(kind k) {
  switch (k) {
    case kind::l1:
      return "reduce_l1";
    case kind::l2:
      return "reduce_l2";
    case kind::sum_square:
      return "reduce_sum_square";
    case kind::log_sum:
      return "reduce_log_sum";
    case kind::log_sum_exp:
      return "reduce_log_sum_exp";
    case kind::any:
      return "reduce_any";
    case kind::all:
      return "reduce_all";
  }
  return "";
}

// The float64 reduction of x over axes (empty: all). log_sum_exp is the direct
// log Σ exp(x - max) + max of the NumPy reference, with the max taken first.
expected_reduction reference(kind k, const tensor& x, const std::vector<std::int64_t>& axes, bool keepdims) {
  const output_groups og = group_by_output(x, axes, keepdims);
  expected_reduction e;
  e.s = og.out;
  for (const auto& g : og.groups) {
    double v = 0.0;
    double scale = 0.0;
    switch (k) {
      case kind::l1:
        for (double a : g) v += std::fabs(a);
        scale = v;
        break;
      case kind::l2:
      case kind::sum_square:
        for (double a : g) v += a * a;
        scale = v;
        if (k == kind::l2) {
          v = std::sqrt(v);
          scale = v;
        }
        break;
      case kind::log_sum:
        for (double a : g) v += a;
        v = std::log(v);
        scale = std::fabs(v) + 1.0;
        break;
      case kind::log_sum_exp: {
        double m = -INFINITY;
        bool nan = false;
        for (double a : g) {
          nan = nan || std::isnan(a);
          m = std::max(m, a);
        }
        if (nan) {
          v = std::nan("");
        } else if (std::isinf(m)) {
          v = m;
        } else {
          double sum = 0.0;
          for (double a : g) sum += std::exp(a - m);
          v = m + std::log(sum);
        }
        scale = std::fabs(v) + 1.0;
        break;
      }
      case kind::any:
        for (double a : g) v = (v != 0.0 || a != 0.0) ? 1.0 : 0.0;
        break;
      case kind::all:
        v = 1.0;
        for (double a : g) v = (v != 0.0 && a != 0.0) ? 1.0 : 0.0;
        break;
    }
    e.v.push_back(v);
    e.scale.push_back(scale);
  }
  return e;
}

void check(kind k, const tensor& x, const std::vector<std::int64_t>& axes, bool keepdims) {
  expect_reduction(op_of(k), x, axes, keepdims, reference(k, x, axes, keepdims), rtol_for(x.type()),
                   atol_for(x.type()));
}

// Positive values for log_sum (its sums must be > 0), signed ones otherwise.
tensor input_for(kind k, dtype t, const shape& s, std::uint64_t seed) {
  if (k == kind::log_sum) return random(t, s, seed, 0.1, 3.0);
  if (k == kind::any || k == kind::all) {
    std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = ((i * 7 + seed) % 5 != 0) ? 1.0 : 0.0;
    return make(dtype::boolean, s, v);
  }
  return random(t, s, seed, -4.0, 4.0);
}

const shape test_shapes[] = {{}, {5}, {3, 4}, {2, 3, 4}, {1, 4, 1}};

TEST(ReduceNormsTest, EveryAxesCombinationEveryFloatDtype) {
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    for (const auto& s : test_shapes) {
      for (const auto& axes : axis_subsets(s.rank())) {
        for (bool keepdims : {false, true}) {
          for (kind k : float_kinds) check(k, input_for(k, t, s, seed++), axes, keepdims);
        }
      }
    }
  }
}

TEST(ReduceNormsTest, IntegerL1AndSumSquare) {
  std::uint64_t seed = 50;
  for (dtype t : {dtype::i32, dtype::i64}) {
    for (const auto& s : test_shapes) {
      for (const auto& axes : axis_subsets(s.rank())) {
        check(kind::l1, input_for(kind::l1, t, s, seed++), axes, false);
        check(kind::sum_square, input_for(kind::sum_square, t, s, seed++), axes, true);
      }
    }
  }
}

TEST(ReduceNormsTest, AnyAndAllOverBool) {
  std::uint64_t seed = 3;
  for (const auto& s : test_shapes) {
    for (const auto& axes : axis_subsets(s.rank())) {
      for (bool keepdims : {false, true}) {
        check(kind::any, input_for(kind::any, dtype::boolean, s, seed++), axes, keepdims);
        check(kind::all, input_for(kind::all, dtype::boolean, s, seed++), axes, keepdims);
      }
    }
  }
  // Rows of all-false and all-true, long enough for the vectorised loops.
  std::vector<double> v(2 * 1000, 0.0);
  for (std::size_t i = 1000; i < v.size(); ++i) v[i] = 1.0;
  v[999] = 1.0;
  const tensor x = make(dtype::boolean, {2, 1000}, v);
  check(kind::any, x, {1}, false);
  check(kind::all, x, {1}, false);
  check(kind::any, x, {0}, false);
  check(kind::all, x, {0}, false);
  EXPECT_EQ(values(run_op1("reduce_all", {x}, {{"axes", std::vector<std::int64_t>{1}}})),
            (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(values(run_op1("reduce_any", {make(dtype::boolean, {2, 3}, {0, 0, 0, 0, 1, 0})},
                           {{"axes", std::vector<std::int64_t>{-1}}})),
            (std::vector<double>{0.0, 1.0}));
}

TEST(ReduceNormsTest, LargeReductionsAlongInnerAndOuterAxes) {
  // Inner (contiguous) and outer reductions take different loops; the parallel chunking too.
  for (kind k : float_kinds) {
    const tensor x = input_for(k, dtype::f32, {3, 5000}, 11);
    check(k, x, {1}, false);
    check(k, x, {0}, true);
    check(k, x, {}, false);
    check(k, input_for(k, dtype::f64, {4000, 3}, 12), {0}, false);
  }
}

TEST(ReduceNormsTest, StridedAndTransposedInputs) {
  for (kind k : float_kinds) {
    const tensor x = input_for(k, dtype::f32, {3, 7}, 21);
    check(k, strided_view(x), {1}, false);
    check(k, non_contiguous(x), {0}, true);
    check(k, non_contiguous(x), {}, false);
  }
}

TEST(ReduceNormsTest, EmptyReductionsGiveTheIdentities) {
  // ONNX: the sums of nothing are 0, their logs -inf; any is false, all is true.
  const tensor x = make(dtype::f32, {2, 0}, {});
  const auto ax = std::vector<std::int64_t>{1};
  for (kind k : float_kinds) {
    const auto got = values(run_op1(op_of(k), {x}, {{"axes", ax}}));
    const double want = (k == kind::log_sum || k == kind::log_sum_exp) ? -INFINITY : 0.0;
    EXPECT_EQ(got, (std::vector<double>{want, want})) << op_of(k);
  }
  const tensor b = make(dtype::boolean, {2, 0}, {});
  EXPECT_EQ(values(run_op1("reduce_any", {b}, {{"axes", ax}})), (std::vector<double>{0, 0}));
  EXPECT_EQ(values(run_op1("reduce_all", {b}, {{"axes", ax}})), (std::vector<double>{1, 1}));
  // No outputs at all.
  EXPECT_EQ(run_op1("reduce_l2", {make(dtype::f32, {0, 3}, {})}, {{"axes", ax}}).shape(),
            (shape{0}));
}

TEST(ReduceNormsTest, LogSumExpIsStableAndHandlesSpecialValues) {
  // Large values: exp overflows without the shift (and in float even in double).
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (dtype t : {dtype::f32, dtype::f64}) {
    const tensor x = make(t, {5, 3},
                          {1000, 1000, 999,     //
                           -1000, -1001, -1e30, //
                           -inf, -inf, -inf,    //
                           inf, 1, 2,           //
                           nan, 1, 2});
    const auto got = values(run_op1("reduce_log_sum_exp", {x},
                                    {{"axes", std::vector<std::int64_t>{1}}}));
    ASSERT_EQ(got.size(), 5u);
    EXPECT_NEAR(got[0], 1000 + std::log(2 + std::exp(-1.0)), 1e-4);
    EXPECT_NEAR(got[1], -1000 + std::log(1 + std::exp(-1.0)), 1e-4);
    EXPECT_EQ(got[2], -inf);
    EXPECT_EQ(got[3], inf);
    EXPECT_TRUE(std::isnan(got[4]));
    // Every row reduced across a long axis with the large value last: the online maximum
    // rescales what came before it.
    std::vector<double> long_row(3000, 0.0);
    long_row.back() = 800.0;
    const auto one = values(run_op1("reduce_log_sum_exp", {make(t, {3000}, long_row)}, {}));
    EXPECT_NEAR(one[0], 800.0 + std::log1p(2999 * std::exp(-800.0)), 1e-3);
  }
  // NaN propagates through the other float reductions too.
  for (kind k : float_kinds) {
    const auto got = values(run_op1(op_of(k), {make(dtype::f32, {3}, {1, nan, 2})}, {}));
    EXPECT_TRUE(std::isnan(got[0])) << op_of(k);
  }
}

TEST(ReduceNormsTest, BadInputIsATypedError) {
  // Dtypes: l2 / log_sum / log_sum_exp take floats only; any / all bool only.
  const tensor xi = random(dtype::i32, {2, 3}, 1);
  for (const char* op : {"reduce_l2", "reduce_log_sum", "reduce_log_sum_exp", "reduce_any"}) {
    expect_error<invalid_argument>([&] { (void)run_op(op, {xi}); }, {"under_test", "int32"});
  }
  const tensor xf = random(dtype::f32, {2, 3}, 2);
  expect_error<invalid_argument>([&] { (void)run_op("reduce_all", {xf}); },
                                 {"under_test", "float32"});
  // Axes out of range or repeated.
  for (kind k : float_kinds) {
    expect_error<invalid_argument>(
        [&] { (void)run_op(op_of(k), {xf}, {{"axes", std::vector<std::int64_t>{2}}}); },
        {"under_test", "axis 2 is out of range"});
    expect_error<invalid_argument>(
        [&] { (void)run_op(op_of(k), {xf}, {{"axes", std::vector<std::int64_t>{1, -1}}}); },
        {"under_test", "twice"});
  }
}

}  // namespace
}  // namespace loom::testing
