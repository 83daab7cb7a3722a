// The element-wise math and activation kernels (sin ... atanh, log1p, expm1, floor, ceil,
// round, sign, softplus, softsign, silu, mish, hard_swish, elu, selu, celu, leaky_relu,
// hard_sigmoid, thresholded_relu), the predicates isnan / isinf / isfinite and mod, against
// float64 references written here: every dtype claimed, shapes from scalar to empty to
// strided and broadcast views, NaN, infinities, signed zeros and domain edges, and errors.
// ops::clamp runs through a session.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>

#include "kernels/elementwise_test_util.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using ew::expect_throw_naming;
using ew::float_dtypes;
using ew::manual_run;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// ---- float64 references -------------------------------------------------------------------

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
// log(1 + e^x) from its definition where that does not overflow, else x + log(1 + e^-x).
double softplus(double x) {
  if (std::isnan(x)) return x;
  return x > 30.0 ? x + std::log(1.0 + std::exp(-x)) : std::log(1.0 + std::exp(x));
}
// At the infinities the formulas give NaN where ONNX's definitions and PyTorch do (inf / inf,
// -inf * 0), and these references say so explicitly.
double softsign(double x) {
  if (std::isinf(x)) return nan;
  return x / (1.0 + std::fabs(x));
}
double silu(double x) {
  if (x == -inf) return nan;
  return x * sigmoid(x);
}
double mish(double x) {
  if (x == -inf) return nan;
  return x * std::tanh(softplus(x));
}
double hard_swish(double x) {
  if (std::isnan(x) || x == -inf) return nan;
  if (x <= -3.0) return 0.0;
  if (x >= 3.0) return x;
  return x * (x + 3.0) / 6.0;
}
double elu(double x, double alpha) {
  return x > 0 ? x : alpha * (std::exp(x) - 1.0);
}
double hard_sigmoid(double x, double alpha, double beta) {
  if (std::isnan(x)) return x;
  return std::min(1.0, std::max(0.0, alpha * x + beta));
}
double sign(double x) {
  if (std::isnan(x)) return x;
  return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}
// Round half to even, from floor: an exact tie goes to the even neighbour.
double round_even(double x) {
  if (!std::isfinite(x)) return x;
  const double f = std::floor(x);
  const double d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1.0;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}
// NumPy's mod: x - y floor(x / y), the quotient's floor taken exactly for the small values
// of these tests.
double floor_mod(double x, double y) {
  if (y == 0.0 || std::isnan(x) || std::isnan(y) || std::isinf(x)) return nan;
  if (std::isinf(y)) return (x == 0.0 || (x < 0) == (y < 0)) ? x : y;
  return x - y * std::floor(x / y);
}

constexpr double selu_alpha = 1.67326319217681884765625;
constexpr double selu_gamma = 1.05070102214813232421875;

struct unary_case {
  const char* op;
  std::function<double(double)> ref;
  double lo;
  double hi;
  attr_map attrs = {};
  std::vector<dtype> types = float_dtypes();
};

std::vector<unary_case> cases() {
  const std::vector<dtype> sig{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                               dtype::i32, dtype::i64, dtype::i8};
  auto f = [](double (*fn)(double)) { return std::function<double(double)>(fn); };
  return {
      {"sin", f(std::sin), -10, 10},
      {"cos", f(std::cos), -10, 10},
      {"tan", f(std::tan), -1.4, 1.4},
      {"asin", f(std::asin), -1, 1},
      {"acos", f(std::acos), -1, 1},
      {"atan", f(std::atan), -20, 20},
      {"sinh", f(std::sinh), -5, 5},
      {"cosh", f(std::cosh), -5, 5},
      {"asinh", f(std::asinh), -50, 50},
      {"acosh", f(std::acosh), 1, 50},
      {"atanh", f(std::atanh), -0.95, 0.95},
      {"log1p", [](double x) { return std::log(1.0 + x); }, -0.9, 20},
      {"expm1", [](double x) { return std::exp(x) - 1.0; }, -5, 5},
      {"floor", f(std::floor), -20, 20},
      {"ceil", f(std::ceil), -20, 20},
      {"round", round_even, -20, 20},
      {"sign", sign, -20, 20, {}, sig},
      {"softplus", softplus, -20, 20},
      {"softsign", softsign, -20, 20},
      {"silu", silu, -10, 10},
      {"mish", mish, -10, 10},
      {"hard_swish", hard_swish, -5, 5},
      {"elu", [](double x) { return elu(x, 1.0); }, -5, 5},
      {"elu", [](double x) { return elu(x, 0.5); }, -5, 5, {{"alpha", 0.5}}},
      {"selu", [](double x) { return selu_gamma * elu(x, selu_alpha); }, -5, 5},
      {"selu", [](double x) { return 2.0 * elu(x, 1.5); }, -5, 5, {{"alpha", 1.5}, {"gamma", 2.0}}},
      {"celu", [](double x) { return x > 0 ? x : std::exp(x) - 1.0; }, -5, 5},
      {"celu",
       [](double x) { return x > 0 ? x : 2.0 * (std::exp(x / 2.0) - 1.0); },
       -5,
       5,
       {{"alpha", 2.0}}},
      {"leaky_relu", [](double x) { return x < 0 ? 0.01 * x : x; }, -5, 5},
      {"leaky_relu", [](double x) { return x < 0 ? 0.25 * x : x; }, -5, 5, {{"alpha", 0.25}}},
      {"hard_sigmoid", [](double x) { return hard_sigmoid(x, 0.2, 0.5); }, -5, 5},
      {"hard_sigmoid",
       [](double x) { return hard_sigmoid(x, 0.5, 0.25); },
       -5,
       5,
       {{"alpha", 0.5}, {"beta", 0.25}}},
      {"thresholded_relu", [](double x) { return x > 1.0 || std::isnan(x) ? x : 0.0; }, -3, 3},
      {"thresholded_relu",
       [](double x) { return x > -0.5 || std::isnan(x) ? x : 0.0; },
       -3,
       3,
       {{"alpha", -0.5}}},
  };
}

std::string label(const unary_case& c, dtype t, const std::string& what) {
  std::string a;
  for (const auto& [k, v] : c.attrs) a += fmt::format(" {}={}", k, v.to_string());
  return fmt::format("{}{} {} {}", c.op, a, to_string(t), what);
}

void check(const unary_case& c, const tensor& x, const std::string& what) {
  SCOPED_TRACE(what);
  ew::expect_unary_matches(c.op, x, c.attrs, c.ref);
}

TEST(ElementwiseMath, EveryOpEveryDtypeEveryShape) {
  const std::vector<shape> shapes{{}, {0}, {0, 3}, {7}, {3, 4}, {2, 3, 5}};
  std::uint64_t seed = 1;
  for (const auto& c : cases()) {
    for (dtype t : c.types) {
      for (const auto& s : shapes) {
        check(c, random(t, s, seed++, c.lo, c.hi), label(c, t, to_string(s)));
      }
      check(c, non_contiguous(random(t, {5, 6}, seed++, c.lo, c.hi)), label(c, t, "transposed"));
      check(c, broadcast_view(random(t, {1, 6}, seed++, c.lo, c.hi), {4, 6}),
            label(c, t, "broadcast view"));
      // Large enough to split across threads.
      if (t == dtype::f32) {
        check(c, random(t, {301, 257}, seed++, c.lo, c.hi), label(c, t, "large"));
      }
    }
  }
}

// The references at special values, every float dtype: NaN, ±inf, ±0, the domain edges.
TEST(ElementwiseMath, SpecialValuesEveryFloatDtype) {
  const std::vector<double> in{nan, inf,  -inf, 0.0,  -0.0, 1.0,  -1.0, 2.0,  -2.0,
                               0.5, -0.5, 2.5,  -2.5, 3.0,  -3.0, 40.0, -40.0};
  for (const auto& c : cases()) {
    for (dtype t : float_dtypes()) {
      SCOPED_TRACE(label(c, t, "special values"));
      const shape s{static_cast<std::int64_t>(in.size())};
      const tensor x = make(t, s, in);
      std::vector<double> expected;
      for (double v : values(x)) expected.push_back(c.ref(v));
      // Results outside the dtype's range are infinite in it: compare as the dtype holds them.
      expected = values(make(t, s, expected));
      expect_close(run_op1(c.op, {x}, c.attrs), s, expected, rtol_for(t), atol_for(t));
    }
  }
}

TEST(ElementwiseMath, DomainEdges) {
  struct special {
    const char* op;
    std::vector<double> in;
    std::vector<double> out;
  };
  const std::vector<special> specials{
      {"asin",
       {1.0, -1.0, 1.5, -1.5, inf},
       {std::numbers::pi / 2, -std::numbers::pi / 2, nan, nan, nan}},
      {"acos", {1.0, -1.0, 1.5, -1.5, -inf}, {0.0, std::numbers::pi, nan, nan, nan}},
      {"acosh", {1.0, 0.5, -1.0, inf}, {0.0, nan, nan, inf}},
      {"atanh", {1.0, -1.0, 1.5, -2.0}, {inf, -inf, nan, nan}},
      {"log1p", {-1.0, -1.5, inf, 1e-30}, {-inf, nan, inf, 1e-30}},
      {"expm1", {-inf, inf, 1e-30, 1000.0}, {-1.0, inf, 1e-30, inf}},
      {"atan", {inf, -inf}, {std::numbers::pi / 2, -std::numbers::pi / 2}},
      {"sinh", {inf, -inf, 1000.0}, {inf, -inf, inf}},
      {"cosh", {inf, -inf, -1000.0}, {inf, inf, inf}},
      {"sin", {inf, -inf}, {nan, nan}},
      {"cos", {inf}, {nan}},
      {"softplus", {1000.0, -1000.0, 1e-20}, {1000.0, 0.0, std::log(2.0)}},
      {"silu", {-1000.0, 1000.0}, {0.0, 1000.0}},
      {"mish", {-1000.0, 1000.0}, {0.0, 1000.0}},
      // At the infinities the formulas' IEEE values, as ONNX defines and PyTorch computes
      // them: inf / inf and -inf * 0 are NaN.
      {"silu", {-inf, inf}, {nan, inf}},
      {"mish", {-inf, inf}, {nan, inf}},
      {"softsign", {-inf, inf}, {nan, nan}},
      {"hard_swish", {-inf, inf}, {nan, inf}},
  };
  for (const auto& sp : specials) {
    for (dtype t : {dtype::f32, dtype::f64}) {
      SCOPED_TRACE(fmt::format("{} {}", sp.op, to_string(t)));
      const shape s{static_cast<std::int64_t>(sp.in.size())};
      const auto expected = values(make(t, s, sp.out));
      expect_close(run_op1(sp.op, {make(t, s, sp.in)}), s, expected, rtol_for(t), 1e-37);
    }
  }
}

TEST(ElementwiseMath, SignedZerosAndTiesToEven) {
  for (dtype t : float_dtypes()) {
    SCOPED_TRACE(to_string(t));
    // round: halves to even, as NumPy and ONNX.
    expect_close(run_op1("round", {make(t, {8}, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49})}),
                 {8}, {0, 2, 2, 0, -2, -2, 4, 0}, 0, 0);
    auto signbits = [](const tensor& y) {
      std::vector<bool> b;
      for (double v : values(y)) b.push_back(std::signbit(v));
      return b;
    };
    // -0 passes through the rounding functions and the activations that are x for x <= 0.
    const tensor nz = make(t, {1}, {-0.0});
    for (const char* op :
         {"floor", "ceil", "round", "sin", "tan", "asin", "atan", "sinh", "asinh", "atanh", "log1p",
          "expm1", "softsign", "leaky_relu", "elu", "celu", "hard_swish", "silu"}) {
      SCOPED_TRACE(op);
      EXPECT_EQ(signbits(run_op1(op, {nz})), std::vector<bool>{true});
    }
    // sign: both zeros give +0 (np.sign); round(-0.4) is -0.
    EXPECT_EQ(signbits(run_op1("sign", {make(t, {2}, {-0.0, 0.0})})),
              (std::vector<bool>{false, false}));
    EXPECT_EQ(signbits(run_op1("round", {make(t, {1}, {-0.25})})), std::vector<bool>{true});
    // hard_swish at and below -3 gives -0, as x * 0 does.
    EXPECT_EQ(signbits(run_op1("hard_swish", {make(t, {2}, {-3.0, -1e4})})),
              (std::vector<bool>{true, true}));
  }
}

TEST(ElementwiseMath, SignOfIntegers) {
  for (dtype t : {dtype::i32, dtype::i64, dtype::i8}) {
    SCOPED_TRACE(to_string(t));
    const double lo = t == dtype::i8 ? -128 : -2147483648.0;
    expect_close(run_op1("sign", {make(t, {5}, {lo, -3, 0, 7, 127})}), {5}, {-1, -1, 0, 1, 1}, 0,
                 0);
  }
  expect_throw_naming<invalid_argument>([] { (void)run_op1("sign", {make(dtype::u8, {1}, {1})}); },
                                        {"under_test", "uint8"});
}

// ---- predicates ---------------------------------------------------------------------------

TEST(ElementwiseMath, Predicates) {
  const std::vector<double> in{nan, inf, -inf, 0.0, -0.0, 1.5, -65504.0, 1e30};
  struct pred {
    const char* op;
    attr_map attrs;
    std::function<bool(double)> ref;
  };
  const std::vector<pred> preds{
      {"isnan", {}, [](double v) { return std::isnan(v); }},
      {"isfinite", {}, [](double v) { return std::isfinite(v); }},
      {"isinf", {}, [](double v) { return std::isinf(v); }},
      {"isinf", {{"detect_negative", false}}, [](double v) { return v == inf; }},
      {"isinf", {{"detect_positive", false}}, [](double v) { return v == -inf; }},
      {"isinf",
       {{"detect_positive", false}, {"detect_negative", false}},
       [](double) { return false; }},
  };
  for (const auto& p : preds) {
    for (dtype t : float_dtypes()) {
      SCOPED_TRACE(fmt::format("{} {} {}", p.op, p.attrs.size(), to_string(t)));
      // 1e30 is infinite in float16; the reference sees the stored values.
      for (const tensor& x :
           {make(t, {8}, in), non_contiguous(make(t, {2, 4}, in)),
            broadcast_view(make(t, {1, 8}, in), {3, 8}), make(t, {0, 2}, {}), make(t, {}, {nan})}) {
        const tensor y = run_op1(p.op, {x}, p.attrs);
        EXPECT_EQ(y.type(), dtype::boolean);
        std::vector<double> expected;
        for (double v : values(x)) expected.push_back(p.ref(v) ? 1.0 : 0.0);
        expect_close(y, x.shape(), expected, 0, 0);
      }
    }
  }
}

// ---- mod ----------------------------------------------------------------------------------

TEST(ElementwiseMath, ModEveryDtypeAndBroadcast) {
  const std::vector<std::pair<shape, shape>> shapes{
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{}, {5}}, {{0, 4}, {4}}};
  std::uint64_t seed = 500;
  for (dtype t : ew::numeric_dtypes()) {
    const bool integer = !is_floating(t);
    const double lo = t == dtype::u8 ? 0.0 : -50.0;
    for (bool fmod : {false, true}) {
      for (const auto& [sa, sb] : shapes) {
        SCOPED_TRACE(
            fmt::format("{} fmod={} {} {}", to_string(t), fmod, to_string(sa), to_string(sb)));
        const tensor x = random(t, sa, seed++, lo, 50.0);
        // Divisors away from 0 (and nonzero integers), of both signs.
        tensor y = random(t, sb, seed++, 1.0, 9.0);
        if (t != dtype::u8) {
          std::vector<double> v = values(y);
          for (std::size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
          y = make(t, sb, v);
        }
        const tensor z = run_op1("mod", {x, y}, {{"fmod", fmod}});
        const shape s = broadcast_shapes(sa, sb);
        const auto xv = ew::broadcast_values(x, s);
        const auto yv = ew::broadcast_values(y, s);
        std::vector<double> expected;
        for (std::size_t i = 0; i < xv.size(); ++i) {
          expected.push_back(fmod ? std::fmod(xv[i], yv[i]) : floor_mod(xv[i], yv[i]));
        }
        EXPECT_EQ(z.type(), t);
        expect_close(z, s, expected, integer ? 0 : rtol_for(t), integer ? 0 : atol_for(t));
      }
    }
  }
}

TEST(ElementwiseMath, ModSpecialValues) {
  for (dtype t : float_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const std::vector<double> x{5.0, -5.0, 5.0, -5.0, inf, nan, 1.0, 5.0, -5.0, 0.0, -0.0};
    const std::vector<double> y{3.0, 3.0, -3.0, -3.0, 3.0, 3.0, 0.0, inf, inf, -3.0, 3.0};
    const shape s{static_cast<std::int64_t>(x.size())};
    std::vector<double> floor_expected;
    std::vector<double> c_expected;
    for (std::size_t i = 0; i < x.size(); ++i) {
      floor_expected.push_back(floor_mod(x[i], y[i]));
      c_expected.push_back(std::fmod(x[i], y[i]));
    }
    const tensor zf = run_op1("mod", {make(t, s, x), make(t, s, y)});
    const tensor zc = run_op1("mod", {make(t, s, x), make(t, s, y)}, {{"fmod", true}});
    expect_close(zf, s, floor_expected, 0, 0);
    expect_close(zc, s, c_expected, 0, 0);
    // Zero remainders take the divisor's sign (np.mod), or the dividend's (fmod).
    const auto vf = values(zf);
    const auto vc = values(zc);
    EXPECT_TRUE(std::signbit(vf[9]));
    EXPECT_FALSE(std::signbit(vf[10]));
    EXPECT_FALSE(std::signbit(vc[9]));
    EXPECT_TRUE(std::signbit(vc[10]));
  }
  // Integers: the wrap-around case and the examples of both conventions.
  expect_close(run_op1("mod", {make(dtype::i32, {3}, {-2147483648.0, -7, 7}),
                               make(dtype::i32, {3}, {-1, 3, -3})}),
               {3}, {0, 2, -2}, 0, 0);
  expect_close(
      run_op1("mod", {make(dtype::i8, {3}, {-128, -7, 7}), make(dtype::i8, {3}, {-1, 3, -3})},
              {{"fmod", true}}),
      {3}, {0, -1, 1}, 0, 0);
}

TEST(ElementwiseMath, ModByIntegerZeroFailsAsDivDoes) {
  for (bool fmod : {false, true}) {
    expect_throw_naming<node_error>(
        [&] {
          (void)run_op1("mod", {make(dtype::i32, {2}, {1, 2}), make(dtype::i32, {2}, {1, 0})},
                        {{"fmod", fmod}});
        },
        {"under_test", "division by zero"});
  }
  // Nothing divided: no error.
  EXPECT_EQ(run_op1("mod", {make(dtype::i64, {0}, {}), make(dtype::i64, {1}, {0})}).shape(),
            shape{0});
}

// ---- attributes, in-place, errors ----------------------------------------------------------

TEST(ElementwiseMath, AttributeKernelsWriteInPlace) {
  manual_run m("elu", {{dtype::f32, {32}}}, {{"alpha", 0.5}});
  tensor x = random(dtype::f32, {32}, 77, -3, 3);
  const auto in = values(x);
  const buffer* storage = x.buf().get();
  auto outs = m.run(ew::inputs(std::move(x)));
  EXPECT_EQ(outs[0].buf().get(), storage);
  std::vector<double> expected;
  for (double v : in) expected.push_back(elu(v, 0.5));
  expect_close(outs[0], {32}, expected);
}

TEST(ElementwiseMath, BadInputIsATypedErrorNamingTheNode) {
  const tensor i = make(dtype::i32, {2}, {1, 2});
  const tensor f = make(dtype::f32, {2}, {1, 2});
  for (const char* op : {"sin", "log1p", "floor", "softplus", "elu", "isnan", "isinf"}) {
    SCOPED_TRACE(op);
    expect_throw_naming<invalid_argument>([&] { (void)run_op1(op, {i}); }, {"under_test", "int32"});
  }
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("elu", {f}, {{"alpha", nan}});
      },
      {"under_test", "alpha"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("celu", {f}, {{"alpha", 0.0}});
      },
      {"under_test", "alpha"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("leaky_relu", {f}, {{"alpha", "big"}});
      },
      {"under_test", "alpha"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("isinf", {f}, {{"detect_positive", 1.0}});
      },
      {"under_test", "detect_positive"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("mod", {f, make(dtype::f64, {2}, {1, 2})});
      },
      {"under_test"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("mod", {f, make(dtype::f32, {3}, {1, 2, 3})});
      },
      {"under_test", "[2]", "[3]"});
  expect_throw_naming<invalid_argument>(
      [&] {
        (void)run_op1("mod", {make(dtype::boolean, {1}, {1}), make(dtype::boolean, {1}, {1})});
      },
      {"under_test", "bool"});
}

// ---- clamp (a builder over maximum and minimum) ------------------------------------------------

TEST(ElementwiseMath, ClampThroughASession) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::i32}) {
    SCOPED_TRACE(to_string(t));
    const bool fl = is_floating(t);
    graph g;
    graph_builder b(g);
    const output x = ops::placeholder(b, "x", t, {6});
    const output y = ops::clamp(x, -1.0, 2.0, {.name = "clamped"});
    const output z = ops::clamp(x, 3.0, 1.0, {.name = "crossed"});
    EXPECT_EQ(y.dtype_of(), t);
    const std::vector<std::string> fetches{y.name(), z.name()};
    session s(std::move(g));
    const std::vector<double> in{-5, -1, 0.5, 2, 7, fl ? nan : 1.0};
    const auto out = s.run({{"x", make(t, {6}, in)}}, fetches);
    std::vector<double> expected;
    std::vector<double> crossed;
    for (double v : values(make(t, {6}, in))) {
      expected.push_back(std::isnan(v) ? v : std::min(2.0, std::max(-1.0, v)));
      crossed.push_back(std::isnan(v) ? v : 1.0);  // lo > hi: every element is hi
    }
    const auto host = [](const tensor& v) {
      return memory::contiguous_copy(v, memory::host_resource::instance(), device_id{});
    };
    expect_close(host(out[0]), {6}, expected, 0, 0);
    expect_close(host(out[1]), {6}, crossed, 0, 0);
  }
}

// Mixed with ops the element-wise fusion takes (mul, add), the new ops stay their own nodes
// and the graph computes what the references do.
TEST(ElementwiseMath, InAGraphWithTheStandardPasses) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f32, {2, 8});
  const output y = ops::elu(x * 2.0, 0.5) + ops::sin(x) * ops::softplus(x) +
                   ops::mod(x, ops::scalar(b, 0.75, dtype::f32));
  const std::string fetch = y.name();
  session s(std::move(g));
  const tensor in = random(dtype::f32, {2, 8}, 42, -3, 3);
  const tensor out = memory::contiguous_copy(s.run({{"x", in}}, {fetch})[0],
                                             memory::host_resource::instance(), device_id{});
  std::vector<double> expected;
  for (double v : values(in)) {
    expected.push_back(elu(2.0 * v, 0.5) + std::sin(v) * softplus(v) + floor_mod(v, 0.75));
  }
  expect_close(out, {2, 8}, expected, 1e-5, 1e-5);
  // The fusion pass took the arithmetic and left each new op a node of its own.
  const graph& planned = s.planned_graph({"x"}, {fetch});
  auto count = [&](std::string_view op) {
    std::size_t n = 0;
    for (const node& nd : planned.nodes()) n += nd.op() == op;
    return n;
  };
  EXPECT_GE(count("fused_elementwise"), 1u);
  for (const char* op : {"elu", "sin", "softplus", "mod"}) EXPECT_EQ(count(op), 1u) << op;
}

}  // namespace
}  // namespace loom::testing
