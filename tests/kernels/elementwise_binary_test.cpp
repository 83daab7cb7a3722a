// Binary element-wise kernels against float64 references with an independent broadcasting
// reference: arithmetic, pow, maximum/minimum, comparisons and logic, over every dtype each
// claims and shapes from scalar and empty to two-sided broadcasts and strided views; integer
// semantics (truncating division, wrapping, division by zero), NaN rules, in-place reuse,
// and construction errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/elementwise_test_util.hpp"
#include "kernels/kernel_test_support.hpp"

namespace loom::testing {
namespace {

using ew::all_dtypes;
using ew::broadcast_values;
using ew::expect_throw_naming;
using ew::float_dtypes;
using ew::manual_run;
using ew::numeric_dtypes;
using ew::wrap_to;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

struct binary_case {
  const char* op;
  std::function<double(double, double)> ref;
  std::vector<dtype> types;
  bool bool_out = false;
};

double maximum_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? nan : std::max(a, b);
}
double minimum_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? nan : std::min(a, b);
}

std::vector<binary_case> cases() {
  const auto num = numeric_dtypes();
  const auto all = all_dtypes();
  return {
      {"add", [](double a, double b) { return a + b; }, num},
      {"sub", [](double a, double b) { return a - b; }, num},
      {"mul", [](double a, double b) { return a * b; }, num},
      {"div", [](double a, double b) { return a / b; }, num},
      {"pow", [](double a, double b) { return std::pow(a, b); }, float_dtypes()},
      {"maximum", maximum_ref, num},
      {"minimum", minimum_ref, num},
      {"equal", [](double a, double b) { return double(a == b); }, all, true},
      {"not_equal", [](double a, double b) { return double(a != b); }, all, true},
      {"less", [](double a, double b) { return double(a < b); }, num, true},
      {"less_equal", [](double a, double b) { return double(a <= b); }, num, true},
      {"greater", [](double a, double b) { return double(a > b); }, num, true},
      {"greater_equal", [](double a, double b) { return double(a >= b); }, num, true},
      // relu's gradient: x (dy) where y (relu's output) > 0.
      {"relu_grad", [](double dy, double y) { return y > 0 ? dy : 0.0; }, num},
  };
}

// Operands for `op`: x anywhere in the op's domain, y nonzero for div (and positive bases
// for pow); integers small enough not to overflow except where wrapping is the point.
tensor operand(const binary_case& c, dtype t, const shape& s, std::uint64_t seed, bool second) {
  const std::string op = c.op;
  if (op == "pow") return second ? random(t, s, seed, -2.0, 2.0) : random(t, s, seed, 0.25, 3.0);
  if (op == "div" && second) {
    // |y| in [1, 5), either sign where the dtype has one.
    tensor mag = random(t, s, seed, 1.0, 5.0);
    auto v = values(mag);
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i % 3 == 1 && t != dtype::u8) v[i] = -v[i];
    }
    return make(t, s, v);
  }
  if (t == dtype::boolean) return random(t, s, seed, 0.0, 1.0);
  const double span = t == dtype::i8 || t == dtype::u8 ? 9.0 : 40.0;
  return random(t, s, seed, -span, span);
}

double reference(const binary_case& c, dtype t, double a, double b) {
  double r = c.ref(a, b);
  if (c.bool_out) return r;
  if (is_integer(t)) {
    if (std::string(c.op) == "div") r = std::trunc(a / b);
    return wrap_to(t, r);
  }
  return r;
}

void check(const binary_case& c, const tensor& x, const tensor& y, const std::string& what) {
  SCOPED_TRACE(what);
  const tensor z = run_op1(c.op, {x, y});
  const shape s = broadcast_shapes(x.shape(), y.shape());
  const auto xa = broadcast_values(x, s);
  const auto ya = broadcast_values(y, s);
  std::vector<double> expected(xa.size());
  for (std::size_t i = 0; i < xa.size(); ++i) expected[i] = reference(c, x.type(), xa[i], ya[i]);
  const dtype out = c.bool_out ? dtype::boolean : x.type();
  EXPECT_EQ(z.type(), out);
  expect_close(z, s, expected, c.bool_out ? 0.0 : rtol_for(out), c.bool_out ? 0.0 : atol_for(out));
}

TEST(ElementwiseBinary, EveryOpEveryDtypeWithBroadcasting) {
  const std::vector<std::pair<shape, shape>> shapes{
      {{3, 4}, {3, 4}},     // same shape
      {{3, 4}, {4}},        // row broadcast (bias)
      {{4}, {3, 4}},        // from the left
      {{3, 1}, {1, 4}},     // both sides
      {{3, 4}, {3, 1}},     // column broadcast
      {{}, {2, 3}},         // scalar and tensor
      {{2, 3}, {}},         // tensor and scalar
      {{}, {}},             // scalars
      {{0, 4}, {4}},        // empty
      {{0}, {}},            // empty and scalar
      {{2, 1, 3}, {4, 1}},  // rank 3 from rank 2
      {{2, 3, 4, 5}, {3, 1, 5}},
  };
  std::uint64_t seed = 1;
  for (const auto& c : cases()) {
    for (dtype t : c.types) {
      for (const auto& [sx, sy] : shapes) {
        check(c, operand(c, t, sx, seed, false), operand(c, t, sy, seed + 1, true),
              fmt::format("{} {} {} {}", c.op, to_string(t), to_string(sx), to_string(sy)));
        seed += 2;
      }
      // Strided operands: a transposed view against a dense one, and a stride-0 view.
      const tensor xt = non_contiguous(operand(c, t, {4, 5}, seed++, false));
      const tensor yd = operand(c, t, {4, 5}, seed++, true);
      check(c, xt, yd, fmt::format("{} {} transposed x", c.op, to_string(t)));
      check(c, operand(c, t, {4, 5}, seed++, false), non_contiguous(yd),
            fmt::format("{} {} transposed y", c.op, to_string(t)));
      const tensor yb = broadcast_view(operand(c, t, {1, 5}, seed++, true), {4, 5});
      check(c, xt, yb, fmt::format("{} {} transposed x, stride-0 y", c.op, to_string(t)));
    }
  }
}

TEST(ElementwiseBinary, LargeTensorsSplitAcrossThreads) {
  std::uint64_t seed = 1000;
  for (const auto& c : cases()) {
    for (dtype t : {dtype::f32, dtype::i32}) {
      if (std::find(c.types.begin(), c.types.end(), t) == c.types.end()) continue;
      const std::string name = fmt::format("{} {}", c.op, to_string(t));
      check(c, operand(c, t, {257, 700}, seed, false), operand(c, t, {700}, seed + 1, true),
            name + " [257, 700] x [700]");
      check(c, operand(c, t, {257, 1}, seed + 2, false), operand(c, t, {1, 701}, seed + 3, true),
            name + " [257, 1] x [1, 701]");
      check(c, non_contiguous(operand(c, t, {300, 310}, seed + 4, false)),
            operand(c, t, {300, 310}, seed + 5, true), name + " transposed [300, 310]");
      seed += 6;
    }
  }
}

TEST(ElementwiseBinary, IntegerDivisionTruncatesTowardZero) {
  const double i32_min = std::numeric_limits<std::int32_t>::min();
  expect_close(run_op1("div", {make(dtype::i32, {6}, {-7, 7, -7, 7, i32_min, 0}),
                               make(dtype::i32, {6}, {2, -2, -2, 2, -1, 5})}),
               {6}, {-3, -3, 3, 3, i32_min, 0}, 0, 0);
  expect_close(
      run_op1("div", {make(dtype::i8, {3}, {-128, -7, 100}), make(dtype::i8, {3}, {-1, 3, 7})}),
      {3}, {-128, -2, 14}, 0, 0);
  expect_close(run_op1("div", {make(dtype::u8, {2}, {255, 7}), make(dtype::u8, {}, {2})}), {2},
               {127, 3}, 0, 0);
}

TEST(ElementwiseBinary, IntegerDivisionByZeroFailsTheNode) {
  for (dtype t : {dtype::i32, dtype::i64, dtype::i8, dtype::u8}) {
    SCOPED_TRACE(to_string(t));
    expect_throw_naming<node_error>(
        [&] {
          (void)run_op1("div", {make(t, {2, 3}, {1, 2, 3, 4, 5, 6}), make(t, {3}, {1, 0, 2})});
        },
        {"under_test", "division by zero"});
    // A zero in a broadcast, strided divisor is found too.
    expect_throw_naming<node_error>(
        [&] {
          (void)run_op1("div", {make(t, {2, 2}, {1, 2, 3, 4}),
                                non_contiguous(make(t, {2, 2}, {1, 1, 0, 1}))});
        },
        {"under_test"});
  }
  // Nothing is divided when the output is empty.
  const tensor z = run_op1("div", {make(dtype::i32, {0, 2}, {}), make(dtype::i32, {2}, {0, 0})});
  EXPECT_EQ(z.shape(), (shape{0, 2}));
  // Floats divide by zero as IEEE says.
  expect_close(run_op1("div", {make(dtype::f32, {3}, {1, -1, 0}), make(dtype::f32, {}, {0})}), {3},
               {inf, -inf, nan});
}

TEST(ElementwiseBinary, IntegerArithmeticWraps) {
  const double i32_max = std::numeric_limits<std::int32_t>::max();
  const double i32_min = std::numeric_limits<std::int32_t>::min();
  expect_close(run_op1("add", {make(dtype::i32, {1}, {i32_max}), make(dtype::i32, {1}, {1})}), {1},
               {i32_min}, 0, 0);
  expect_close(run_op1("sub", {make(dtype::i32, {1}, {i32_min}), make(dtype::i32, {1}, {1})}), {1},
               {i32_max}, 0, 0);
  expect_close(run_op1("mul", {make(dtype::i8, {2}, {64, -128}), make(dtype::i8, {2}, {2, -1})}),
               {2}, {-128, -128}, 0, 0);
  expect_close(run_op1("sub", {make(dtype::u8, {2}, {0, 5}), make(dtype::u8, {2}, {1, 3})}), {2},
               {255, 2}, 0, 0);
  const tensor big = run_op1(
      "mul", {make(dtype::i64, {1}, {4294967296.0}), make(dtype::i64, {1}, {4294967296.0})});
  EXPECT_EQ(big.data<std::int64_t>()[0], 0);
}

TEST(ElementwiseBinary, NaNRules) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(to_string(t));
    const tensor a = make(t, {4}, {nan, 1, nan, 2});
    const tensor b = make(t, {4}, {1, nan, nan, 1});
    expect_close(run_op1("maximum", {a, b}), {4}, {nan, nan, nan, 2});
    expect_close(run_op1("minimum", {a, b}), {4}, {nan, nan, nan, 1});
    expect_close(run_op1("equal", {a, b}), {4}, {0, 0, 0, 0}, 0, 0);
    expect_close(run_op1("not_equal", {a, b}), {4}, {1, 1, 1, 1}, 0, 0);
    expect_close(run_op1("less", {a, b}), {4}, {0, 0, 0, 0}, 0, 0);
    expect_close(run_op1("greater_equal", {a, b}), {4}, {0, 0, 0, 1}, 0, 0);
  }
  expect_close(
      run_op1("pow", {make(dtype::f32, {3}, {0, -8, 2}), make(dtype::f32, {3}, {-1, 1.0 / 3, 0})}),
      {3}, {inf, nan, 1});
}

TEST(ElementwiseBinary, Logic) {
  const tensor a = make(dtype::boolean, {2, 1}, {0, 1});
  const tensor b = make(dtype::boolean, {1, 2}, {0, 1});
  expect_close(run_op1("logical_and", {a, b}), {2, 2}, {0, 0, 0, 1}, 0, 0);
  expect_close(run_op1("logical_or", {a, b}), {2, 2}, {0, 1, 1, 1}, 0, 0);
  expect_close(
      run_op1("logical_or", {make(dtype::boolean, {}, {0}), make(dtype::boolean, {0}, {})}), {0},
      {}, 0, 0);
  const tensor c = non_contiguous(make(dtype::boolean, {2, 3}, {1, 0, 1, 1, 1, 0}));
  const tensor d = make(dtype::boolean, {2, 3}, {1, 1, 0, 0, 1, 0});
  expect_close(run_op1("logical_and", {c, d}), {2, 3}, {1, 0, 0, 0, 1, 0}, 0, 0);
  expect_close(run_op1("equal", {c, d}), {2, 3}, {1, 0, 0, 0, 1, 1}, 0, 0);
}

TEST(ElementwiseBinary, WritesInPlaceIntoAnInputOfTheOutputsShape) {
  // x is broadcast, so only y (which has the output's shape) can take the result.
  manual_run m("add", {{dtype::f32, {4}}, {dtype::f32, {3, 4}}});
  const tensor x = random(dtype::f32, {4}, 1);
  tensor y = random(dtype::f32, {3, 4}, 2);
  const auto expected_x = broadcast_values(x, {3, 4});
  const auto ys = values(y);
  const buffer* storage = y.buf().get();
  auto outs = m.run(ew::inputs(x, std::move(y)));
  EXPECT_EQ(outs[0].buf().get(), storage);
  std::vector<double> expected;
  for (std::size_t i = 0; i < ys.size(); ++i) {
    expected.push_back(static_cast<double>(static_cast<float>(expected_x[i] + ys[i])));
  }
  expect_close(outs[0], {3, 4}, expected);

  // Comparisons write bool: in place only into an input of one byte per element.
  manual_run eq("equal", {{dtype::i8, {5}}, {dtype::i8, {5}}});
  tensor a = make(dtype::i8, {5}, {1, 2, 3, 4, 5});
  const buffer* a_storage = a.buf().get();
  auto eq_outs = eq.run(ew::inputs(std::move(a), make(dtype::i8, {5}, {1, 0, 3, 0, 5})));
  EXPECT_EQ(eq_outs[0].buf().get(), a_storage);
  expect_close(eq_outs[0], {5}, {1, 0, 1, 0, 1}, 0, 0);

  manual_run lt("less", {{dtype::f32, {5}}, {dtype::f32, {5}}});
  tensor f = make(dtype::f32, {5}, {1, 2, 3, 4, 5});
  const buffer* f_storage = f.buf().get();
  auto lt_outs = lt.run(ew::inputs(std::move(f), make(dtype::f32, {5}, {2, 2, 2, 2, 2})));
  EXPECT_NE(lt_outs[0].buf().get(), f_storage);
  expect_close(lt_outs[0], {5}, {1, 0, 0, 0, 0}, 0, 0);
}

TEST(ElementwiseBinary, ConstructionErrorsNameTheNode) {
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("add", {random(dtype::f32, {2, 3}, 1), random(dtype::f32, {4}, 2)});
      },
      {"under_test", "[2, 3]", "[4]"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("mul", {random(dtype::f32, {3}, 1), random(dtype::f64, {3}, 2)});
      },
      {"under_test", "float64", "float32"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("add", {make(dtype::boolean, {1}, {1}), make(dtype::boolean, {1}, {1})});
      },
      {"under_test", "bool"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("pow", {make(dtype::i32, {1}, {1}), make(dtype::i32, {1}, {1})});
      },
      {"under_test", "int32"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("less", {make(dtype::boolean, {1}, {1}), make(dtype::boolean, {1}, {1})});
      },
      {"under_test", "bool"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("logical_and", {make(dtype::f32, {1}, {1}), make(dtype::boolean, {1}, {1})});
      },
      {"under_test"});
}

TEST(ElementwiseBinary, RunTimeShapeMismatchFailsTheNode) {
  // Placeholders of unknown length pass inference; the kernel finds the mismatch.
  manual_run m("add", {{dtype::f32, {-1}}, {dtype::f32, {-1}}});
  EXPECT_EQ(m.n().outputs[0].shape, (shape{-1}));
  expect_throw_naming<node_error>(
      [&] {
        (void)m.run({random(dtype::f32, {3}, 1), random(dtype::f32, {4}, 2)});
      },
      {"under_test", "[3]", "[4]"});
  auto ok = m.run({random(dtype::f32, {3}, 1), random(dtype::f32, {1}, 2)});
  EXPECT_EQ(ok[0].shape(), (shape{3}));
}

}  // namespace
}  // namespace loom::testing
