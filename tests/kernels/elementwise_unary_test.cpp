// Unary element-wise kernels against float64 references: every op, every dtype it claims,
// shapes from scalar to empty to strided and broadcast views, special values, integer
// wrapping, in-place reuse of the input's buffer, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "kernels/elementwise_test_util.hpp"
#include "kernels/kernel_test_support.hpp"

namespace loom::testing {
namespace {

using ew::float_dtypes;
using ew::manual_run;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

double gelu_erf(double x) {
  return 0.5 * x * std::erfc(-x / std::numbers::sqrt2);
}
double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

struct unary_case {
  const char* op;
  std::function<double(double)> ref;
  double lo;
  double hi;
  std::vector<dtype> types;
  attr_map attrs;
};

std::vector<unary_case> cases() {
  const std::vector<dtype> sig{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                               dtype::i32, dtype::i64, dtype::i8};
  auto num = sig;
  num.push_back(dtype::u8);
  const auto fl = float_dtypes();
  return {
      {"neg", [](double x) { return -x; }, -50, 50, sig, {}},
      {"abs", [](double x) { return std::fabs(x); }, -50, 50, sig, {}},
      {"exp", [](double x) { return std::exp(x); }, -10, 10, fl, {}},
      {"log", [](double x) { return std::log(x); }, 0.01, 100, fl, {}},
      {"sqrt", [](double x) { return std::sqrt(x); }, 0, 100, fl, {}},
      {"rsqrt", [](double x) { return 1.0 / std::sqrt(x); }, 0.01, 100, fl, {}},
      {"tanh", [](double x) { return std::tanh(x); }, -6, 6, fl, {}},
      {"sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -12, 12, fl, {}},
      {"relu", [](double x) { return x < 0 ? 0.0 : x; }, -50, 50, num, {}},
      {"gelu", gelu_erf, -6, 6, fl, {}},
      {"gelu", gelu_erf, -6, 6, fl, {{"approximate", "none"}}},
      {"gelu", gelu_tanh, -6, 6, fl, {{"approximate", "tanh"}}},
      {"erf", [](double x) { return std::erf(x); }, -3, 3, fl, {}},
      {"square", [](double x) { return x * x; }, -11, 11, sig, {}},
      {"reciprocal", [](double x) { return 1.0 / x; }, 0.05, 20, fl, {}},
  };
}

std::string label(const unary_case& c, dtype t, const shape& s) {
  return fmt::format("{}{} {}{}", c.op,
                     c.attrs.empty() ? "" : " " + c.attrs.begin()->second.to_string(), to_string(t),
                     to_string(s));
}

void check(const unary_case& c, const tensor& x, const std::string& what) {
  SCOPED_TRACE(what);
  ew::expect_unary_matches(c.op, x, c.attrs, c.ref);
}

TEST(ElementwiseUnary, EveryOpEveryDtypeEveryShape) {
  const std::vector<shape> shapes{{}, {0}, {0, 3}, {7}, {3, 4}, {2, 3, 5}};
  std::uint64_t seed = 1;
  for (const auto& c : cases()) {
    for (dtype t : c.types) {
      // u8 holds only the non-negative part of the range.
      const double lo = t == dtype::u8 ? 0.0 : c.lo;
      for (const auto& s : shapes) {
        check(c, random(t, s, seed++, lo, c.hi), label(c, t, s));
      }
      // Strided: a transposed view, and a view broadcasting a row with stride 0.
      check(c, non_contiguous(random(t, {5, 6}, seed++, lo, c.hi)),
            label(c, t, {5, 6}) + " transposed");
      check(c, broadcast_view(random(t, {1, 6}, seed++, lo, c.hi), {4, 6}),
            label(c, t, {4, 6}) + " broadcast view");
    }
  }
}

TEST(ElementwiseUnary, LargeTensorsSplitAcrossThreads) {
  // Big enough for parallel_for to split even the cheapest op's work (about 20 us per range),
  // into ranges that start mid-row, also for a strided input.
  std::uint64_t seed = 100;
  for (const auto& c : cases()) {
    if (std::string(c.op) == "gelu" && c.attrs.empty()) continue;
    for (dtype t : {dtype::f32, dtype::f64}) {
      check(c, random(t, {301, 557}, seed++, c.lo, c.hi), label(c, t, {301, 557}));
      check(c, non_contiguous(random(t, {300, 310}, seed++, c.lo, c.hi)),
            label(c, t, {300, 310}) + " transposed");
    }
  }
}

TEST(ElementwiseUnary, SpecialValues) {
  struct special {
    const char* op;
    std::vector<double> in;
    std::vector<double> out;
  };
  const std::vector<special> specials{
      {"exp", {inf, -inf, nan, 100.0, -200.0, 0.0}, {inf, 0.0, nan, std::exp(100.0), 0.0, 1.0}},
      {"log", {0.0, -1.0, inf, nan, 1.0}, {-inf, nan, inf, nan, 0.0}},
      {"sqrt", {-1.0, 0.0, inf, nan}, {nan, 0.0, inf, nan}},
      {"rsqrt", {0.0, inf, -1.0}, {inf, 0.0, nan}},
      {"tanh", {inf, -inf, nan, 30.0, -30.0, 1e-30}, {1.0, -1.0, nan, 1.0, -1.0, 1e-30}},
      {"sigmoid", {inf, -inf, nan, 100.0, -50.0}, {1.0, 0.0, nan, 1.0, std::exp(-50.0)}},
      {"relu", {nan, -inf, inf}, {nan, 0.0, inf}},
      {"gelu", {inf, nan, -40.0}, {inf, nan, 0.0}},
      {"erf", {inf, -inf, nan}, {1.0, -1.0, nan}},
      {"abs", {-inf, nan}, {inf, nan}},
      {"neg", {inf, nan}, {-inf, nan}},
      {"reciprocal", {0.0, inf}, {inf, 0.0}},
  };
  for (const auto& sp : specials) {
    for (dtype t : {dtype::f32, dtype::f64}) {
      SCOPED_TRACE(fmt::format("{} {}", sp.op, to_string(t)));
      auto expected = sp.out;
      if (t == dtype::f32) {
        for (auto& e : expected) e = static_cast<double>(static_cast<float>(e));
      }
      const shape s{static_cast<std::int64_t>(sp.in.size())};
      expect_close(run_op1(sp.op, {make(t, s, sp.in)}), s, expected, rtol_for(t), 1e-30);
    }
  }
}

TEST(ElementwiseUnary, Float32TranscendentalsAreAccurateOverTheirRange) {
  // exp, tanh and sigmoid on float32 use loom's own vectorisable code: check them densely
  // against float64 to within a few float32 ulps.
  std::vector<double> in;
  for (double x = -87.0; x <= 88.0; x += 0.0137) in.push_back(x);
  const shape s{static_cast<std::int64_t>(in.size())};
  const tensor x = make(dtype::f32, s, in);
  const auto xs = values(x);
  struct fn {
    const char* op;
    double (*ref)(double);
  };
  for (const fn& f : {fn{"exp", [](double v) { return std::exp(v); }},
                      fn{"tanh", [](double v) { return std::tanh(v); }},
                      fn{"sigmoid", [](double v) { return 1.0 / (1.0 + std::exp(-v)); }}}) {
    SCOPED_TRACE(f.op);
    std::vector<double> expected;
    for (double v : xs) expected.push_back(f.ref(v));
    // 4 ulps relative; results below float's normal range may lose relative precision.
    expect_close(run_op1(f.op, {x}), s, expected, 4.8e-7, 1e-37);
  }
}

TEST(ElementwiseUnary, IntegersWrapLikeTwosComplement) {
  const double i32_min = std::numeric_limits<std::int32_t>::min();
  expect_close(run_op1("neg", {make(dtype::i32, {2}, {i32_min, 5})}), {2}, {i32_min, -5}, 0, 0);
  expect_close(run_op1("abs", {make(dtype::i8, {3}, {-128, -5, 7})}), {3}, {-128, 5, 7}, 0, 0);
  expect_close(run_op1("square", {make(dtype::i8, {3}, {16, -12, 11})}), {3}, {0, -112, 121}, 0, 0);
  const double big = 3037000500.0;  // big^2 > 2^63
  const tensor sq = run_op1("square", {make(dtype::i64, {1}, {big})});
  const auto u = static_cast<std::uint64_t>(big);
  EXPECT_EQ(sq.data<std::int64_t>()[0], static_cast<std::int64_t>(u * u));
  expect_close(run_op1("relu", {make(dtype::u8, {3}, {0, 7, 255})}), {3}, {0, 7, 255}, 0, 0);
}

TEST(ElementwiseUnary, LogicalNot) {
  expect_close(run_op1("logical_not", {make(dtype::boolean, {2, 2}, {1, 0, 0, 1})}), {2, 2},
               {0, 1, 1, 0}, 0, 0);
  expect_close(
      run_op1("logical_not", {non_contiguous(make(dtype::boolean, {2, 3}, {1, 0, 0, 1, 1, 0}))}),
      {2, 3}, {0, 1, 1, 0, 0, 1}, 0, 0);
}

TEST(ElementwiseUnary, WritesInPlaceWhenTheNodeAloneHoldsTheInput) {
  for (const char* op : {"relu", "exp", "neg"}) {
    SCOPED_TRACE(op);
    manual_run m(op, {{dtype::f32, {64}}});
    tensor x = random(dtype::f32, {64}, 7);
    const auto in = values(x);
    const buffer* storage = x.buf().get();
    auto outs = m.run(ew::inputs(std::move(x)));
    EXPECT_EQ(outs[0].buf().get(), storage) << "the output should reuse the input's buffer";
    std::vector<double> expected;
    for (double v : in) {
      expected.push_back(std::string(op) == "relu"  ? std::max(v, 0.0)
                         : std::string(op) == "exp" ? std::exp(v)
                                                    : -v);
    }
    expect_close(outs[0], {64}, expected);
  }
}

TEST(ElementwiseUnary, LeavesASharedInputAlone) {
  manual_run m("neg", {{dtype::f32, {8}}});
  const tensor x = random(dtype::f32, {8}, 8);
  const auto before = values(x);
  auto outs = m.run({x});  // the test keeps a reference: the buffer is shared
  EXPECT_NE(outs[0].buf().get(), x.buf().get());
  EXPECT_EQ(values(x), before);
  std::vector<double> expected;
  for (double v : before) expected.push_back(-v);
  expect_close(outs[0], {8}, expected);
}

TEST(ElementwiseUnary, NoInPlaceIntoAStridedInput) {
  manual_run m("neg", {{dtype::f32, {4, 5}}});
  tensor x = non_contiguous(random(dtype::f32, {4, 5}, 9));
  const auto in = values(x);
  const buffer* storage = x.buf().get();
  auto outs = m.run(ew::inputs(std::move(x)));
  EXPECT_NE(outs[0].buf().get(), storage);
  std::vector<double> expected;
  for (double v : in) expected.push_back(-v);
  expect_close(outs[0], {4, 5}, expected);
}

TEST(ElementwiseUnary, RejectsDtypesItDoesNotTake) {
  using ew::expect_throw_naming;
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("exp", {make(dtype::i32, {2}, {1, 2})});
      },
      {"under_test", "int32"});
  expect_throw_naming<invalid_argument>([] { (void)run_op1("neg", {make(dtype::u8, {1}, {1})}); },
                                        {"under_test", "uint8"});
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("relu", {make(dtype::boolean, {1}, {1})}); }, {"under_test", "bool"});
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("logical_not", {make(dtype::f32, {1}, {1})}); }, {"under_test"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("gelu", {make(dtype::f32, {1}, {1})}, {{"approximate", "fast"}});
      },
      {"under_test", "approximate"});
}

}  // namespace
}  // namespace loom::testing
