// cast, where, the generators (fill, zeros, ones, range, random_uniform, random_normal) and
// the element-wise builder API, against references computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "../../src/backends/cpu/elementwise_philox.hpp"
#include "kernels/elementwise_test_util.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::testing {
namespace {

using ew::all_dtypes;
using ew::broadcast_values;
using ew::expect_throw_naming;
using ew::manual_run;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

// ---- cast --------------------------------------------------------------------------------------

std::vector<double> cast_inputs(dtype t) {
  switch (t) {
    case dtype::f32:
    case dtype::f64:
    case dtype::f16:
    case dtype::bf16:
      return {0.0,   -0.0,  0.4,   -0.6, 1.5, -1.5, 2.7,  -2.7,  100.25, -129.5, 255.9,
              300.9, 65504, -1e10, 1e10, 3e9, -3e9, 1e19, -1e19, nan,    inf,    -inf};
    case dtype::i32:
      return {0, 1, -1, 127, 128, -129, 255, 256, 70000, 2147483647.0, -2147483648.0, 16777217};
    case dtype::i64:
      return {0,
              1,
              -1,
              255,
              256,
              -129,
              1099511627777.0,
              4611686018427387904.0,
              -9223372036854775808.0,
              16777217};
    case dtype::i8:
      return {0, 1, -1, 127, -128, 5};
    case dtype::u8:
      return {0, 1, 127, 128, 255};
    case dtype::boolean:
      return {0, 1, 1, 0};
  }
  return {};
}

// NumPy's astype where it is defined; saturation where it is not (out of range, NaN -> 0).
double cast_ref(dtype from, dtype to, double v) {
  if (to == dtype::boolean) return v != 0.0 ? 1.0 : 0.0;
  if (is_integer(to)) {
    if (is_floating(from)) {
      if (std::isnan(v)) return 0.0;
      const double t = std::trunc(v);
      double lo = 0;
      double hi = 0;
      switch (to) {
        case dtype::i32:
          lo = -2147483648.0, hi = 2147483647.0;
          break;
        case dtype::i64:
          lo = -9223372036854775808.0, hi = 9223372036854775807.0;
          break;
        case dtype::i8:
          lo = -128, hi = 127;
          break;
        default:
          lo = 0, hi = 255;
          break;
      }
      return std::min(std::max(t, lo), hi);
    }
    return ew::wrap_to(to, v);
  }
  switch (to) {
    case dtype::f32:
      return static_cast<float>(v);
    case dtype::f64:
      return v;
    case dtype::f16:
      return static_cast<float>(half(static_cast<float>(v)));
    default:
      return static_cast<float>(bfloat16(static_cast<float>(v)));
  }
}

TEST(ElementwiseCast, EveryPairOfDtypes) {
  for (dtype from : all_dtypes()) {
    const auto in = cast_inputs(from);
    const tensor x = make(from, {static_cast<std::int64_t>(in.size())}, in);
    const auto stored = values(x);
    for (dtype to : all_dtypes()) {
      SCOPED_TRACE(fmt::format("{} -> {}", to_string(from), to_string(to)));
      const tensor y = run_op1("cast", {x}, {{"to", to}});
      EXPECT_EQ(y.type(), to);
      std::vector<double> expected;
      for (double v : stored) expected.push_back(cast_ref(from, to, v));
      expect_close(y, x.shape(), expected, 0.0, 0.0);
    }
  }
}

TEST(ElementwiseCast, StridedScalarAndEmpty) {
  const tensor x = non_contiguous(make(dtype::f32, {2, 3}, {1.5, -2.5, 3.9, 4, -5.1, 6}));
  expect_close(run_op1("cast", {x}, {{"to", dtype::i32}}), {2, 3}, {1, -2, 3, 4, -5, 6}, 0, 0);
  expect_close(run_op1("cast", {broadcast_view(make(dtype::i8, {1, 2}, {-3, 7}), {3, 2})},
                       {{"to", dtype::f16}}),
               {3, 2}, {-3, 7, -3, 7, -3, 7}, 0, 0);
  expect_close(run_op1("cast", {make(dtype::f64, {}, {2.5})}, {{"to", dtype::u8}}), {}, {2}, 0, 0);
  expect_close(run_op1("cast", {make(dtype::f64, {0, 2}, {})}, {{"to", dtype::boolean}}), {0, 2},
               {}, 0, 0);
  // Same dtype: the input itself.
  const tensor same = make(dtype::f32, {2}, {1, 2});
  EXPECT_EQ(run_op1("cast", {same}, {{"to", dtype::f32}}).buf(), same.buf());
}

TEST(ElementwiseCast, InPlaceWhenTheElementSizeMatches) {
  manual_run m("cast", {{dtype::f32, {4}}}, {{"to", dtype::i32}});
  tensor x = make(dtype::f32, {4}, {1.5, -2.5, 1e12, nan});
  const buffer* storage = x.buf().get();
  auto outs = m.run(ew::inputs(std::move(x)));
  EXPECT_EQ(outs[0].buf().get(), storage);
  expect_close(outs[0], {4}, {1, -2, 2147483647.0, 0}, 0, 0);

  manual_run wide("cast", {{dtype::f32, {4}}}, {{"to", dtype::f64}});
  tensor w = make(dtype::f32, {4}, {1, 2, 3, 4});
  const buffer* w_storage = w.buf().get();
  auto wide_outs = wide.run(ew::inputs(std::move(w)));
  EXPECT_NE(wide_outs[0].buf().get(), w_storage);
  expect_close(wide_outs[0], {4}, {1, 2, 3, 4}, 0, 0);
}

TEST(ElementwiseCast, Float16AndBfloat16ConversionsMatchTheStorageTypes) {
  // The kernels convert with their own branch-free code: bit-identical to loom::half and
  // loom::bfloat16 for every float16 / bfloat16 value, and for a sweep of float32 values.
  for (dtype t : {dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(to_string(t));
    tensor all = memory::host_tensor(t, {65536});
    auto* bits = static_cast<std::uint16_t*>(all.raw_data());
    for (std::uint32_t b = 0; b < 65536; ++b) bits[b] = static_cast<std::uint16_t>(b);
    const tensor f = run_op1("cast", {all}, {{"to", dtype::f32}});
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto v = static_cast<std::uint16_t>(b);
      const float want = t == dtype::f16 ? static_cast<float>(half::from_bits(v))
                                         : static_cast<float>(bfloat16::from_bits(v));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f.data<float>()[b]),
                std::bit_cast<std::uint32_t>(want))
          << std::hex << b;
    }
  }
  // Every 4099th float32 bit pattern, plus the values around float16's rounding boundaries.
  std::vector<float> floats;
  for (std::uint64_t b = 0; b < 0x100000000ull; b += 4099) {
    floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  }
  for (std::uint32_t h = 0; h < 0x7c00; h += 7) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(
        static_cast<float>(half::from_bits(static_cast<std::uint16_t>(h))));
    for (std::uint32_t d : {0u, 0xfffu, 0x1000u, 0x1001u, 0x2000u})
      floats.push_back(std::bit_cast<float>(f + d));
  }
  tensor src = memory::host_tensor(dtype::f32, {static_cast<std::int64_t>(floats.size())});
  std::copy(floats.begin(), floats.end(), src.data<float>());
  const tensor h = run_op1("cast", {src}, {{"to", dtype::f16}});
  const tensor bf = run_op1("cast", {src}, {{"to", dtype::bf16}});
  for (std::size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(h.data<half>()[i].bits, half(floats[i]).bits) << floats[i];
    ASSERT_EQ(bf.data<bfloat16>()[i].bits, bfloat16(floats[i]).bits) << floats[i];
  }
}

// ---- where ------------------------------------------------------------------------------------

TEST(ElementwiseWhere, EveryDtypeThreeWayBroadcast) {
  std::uint64_t seed = 1;
  const std::vector<std::array<shape, 3>> shapes{
      {shape{3, 1}, shape{1, 4}, shape{}},        {shape{3, 4}, shape{3, 4}, shape{3, 4}},
      {shape{}, shape{2, 3}, shape{3}},           {shape{4}, shape{}, shape{}},
      {shape{2, 1, 4}, shape{3, 1}, shape{1, 4}}, {shape{0, 3}, shape{3}, shape{}},
  };
  for (dtype t : all_dtypes()) {
    for (const auto& s : shapes) {
      SCOPED_TRACE(fmt::format("{} {} {} {}", to_string(t), to_string(s[0]), to_string(s[1]),
                               to_string(s[2])));
      const tensor c = random(dtype::boolean, s[0], seed++);
      const tensor x = random(t, s[1], seed++, -10, 10);
      const tensor y = random(t, s[2], seed++, -10, 10);
      const shape out = broadcast_shapes(broadcast_shapes(s[0], s[1]), s[2]);
      const auto cv = broadcast_values(c, out);
      const auto xv = broadcast_values(x, out);
      const auto yv = broadcast_values(y, out);
      std::vector<double> expected;
      for (std::size_t i = 0; i < cv.size(); ++i) expected.push_back(cv[i] != 0 ? xv[i] : yv[i]);
      const tensor z = run_op1("where", {c, x, y});
      EXPECT_EQ(z.type(), t);
      expect_close(z, out, expected, 0, 0);
    }
  }
}

TEST(ElementwiseWhere, StridedInputsAndLargeTensors) {
  const tensor c = non_contiguous(random(dtype::boolean, {40, 50}, 1));
  const tensor x = random(dtype::f32, {40, 50}, 2);
  const tensor y = broadcast_view(random(dtype::f32, {1, 50}, 3), {40, 50});
  const auto cv = values(c);
  const auto xv = values(x);
  const auto yv = values(y);
  std::vector<double> expected;
  for (std::size_t i = 0; i < cv.size(); ++i) expected.push_back(cv[i] != 0 ? xv[i] : yv[i]);
  expect_close(run_op1("where", {c, x, y}), {40, 50}, expected, 0, 0);

  const tensor bc = random(dtype::boolean, {300, 1}, 4);
  const tensor bx = random(dtype::f64, {300, 400}, 5);
  const tensor by = random(dtype::f64, {400}, 6);
  const auto bcv = broadcast_values(bc, {300, 400});
  const auto bxv = values(bx);
  const auto byv = broadcast_values(by, {300, 400});
  std::vector<double> big;
  for (std::size_t i = 0; i < bcv.size(); ++i) big.push_back(bcv[i] != 0 ? bxv[i] : byv[i]);
  expect_close(run_op1("where", {bc, bx, by}), {300, 400}, big, 0, 0);
}

TEST(ElementwiseWhere, InPlaceIntoXOrY) {
  manual_run m("where", {{dtype::boolean, {3}}, {dtype::f32, {}}, {dtype::f32, {3}}});
  tensor y = make(dtype::f32, {3}, {10, 20, 30});
  const buffer* storage = y.buf().get();
  auto outs = m.run(
      ew::inputs(make(dtype::boolean, {3}, {1, 0, 1}), make(dtype::f32, {}, {-1}), std::move(y)));
  EXPECT_EQ(outs[0].buf().get(), storage);
  expect_close(outs[0], {3}, {-1, 20, -1}, 0, 0);
}

TEST(ElementwiseWhere, Errors) {
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("where", {make(dtype::f32, {1}, {1}), make(dtype::f32, {1}, {1}),
                                make(dtype::f32, {1}, {1})});
      },
      {"under_test", "bool"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("where", {make(dtype::boolean, {1}, {1}), make(dtype::f32, {1}, {1}),
                                make(dtype::i32, {1}, {1})});
      },
      {"under_test", "int32"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("where", {make(dtype::boolean, {2}, {1, 0}), make(dtype::f32, {3}, {1, 2, 3}),
                                make(dtype::f32, {}, {1})});
      },
      {"under_test", "[2]", "[3]"});
}

// ---- fill, zeros, ones, range -------------------------------------------------------------------

TEST(ElementwiseFill, EveryDtypeAndShape) {
  for (dtype t : all_dtypes()) {
    for (const shape& s : {shape{2, 3}, shape{}, shape{0, 5}, shape{1000, 300}}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(t), to_string(s)));
      const auto n = static_cast<std::size_t>(s.num_elements());
      for (double v : {2.5, -1.5}) {
        const tensor y = run_op1("fill", {}, {{"dtype", t}, {"shape", s}, {"value", v}});
        EXPECT_EQ(y.type(), t);
        expect_close(y, s, std::vector<double>(n, cast_ref(dtype::f64, t, v)), 0, 0);
      }
      expect_close(run_op1("zeros", {}, {{"dtype", t}, {"shape", s}}), s,
                   std::vector<double>(n, 0.0), 0, 0);
      expect_close(run_op1("ones", {}, {{"dtype", t}, {"shape", s}}), s,
                   std::vector<double>(n, 1.0), 0, 0);
    }
  }
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("zeros", {}, {{"dtype", dtype::f32}, {"shape", shape{-1, 2}}});
      },
      {"under_test", "shape"});
}

TEST(ElementwiseRange, MatchesNumPyArange) {
  struct range_case {
    double start, limit, delta;
    dtype t;
    std::vector<double> expected;
  };
  // Lengths and values of numpy.arange(start, limit, delta) in float64, then cast as loom
  // casts. (Element i is start + i * delta; NumPy's own fill steps by (start + delta) - start
  // and so ends range(1, 2, 0.3) at 1.9000000000000001, one ulp off.)
  const std::vector<range_case> cases{
      {0, 5, 1, dtype::f32, {0, 1, 2, 3, 4}},
      {1, 2, 0.3, dtype::f64, {1, 1.3, 1.6, 1.9}},
      {5, 0, -1.5, dtype::f32, {5, 3.5, 2, 0.5}},
      {0, -1, 1, dtype::f32, {}},
      {3, 3, 1, dtype::i64, {}},
      {0, 10, 3, dtype::i32, {0, 3, 6, 9}},
      {-2.5, 2, 1, dtype::i32, {-2, -1, 0, 0, 1}},
      {0,
       1,
       0.1,
       dtype::f64,
       {0, 0.1, 0.2, 0.30000000000000004, 0.4, 0.5, 0.6000000000000001, 0.7000000000000001, 0.8,
        0.9}},
      {250, 260, 2, dtype::u8, {250, 252, 254, 255, 255}},
      {0, 1, 0.25, dtype::f16, {0, 0.25, 0.5, 0.75}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(fmt::format("range({}, {}, {}) {}", c.start, c.limit, c.delta, to_string(c.t)));
    const tensor y = run_op1(
        "range", {}, {{"start", c.start}, {"limit", c.limit}, {"delta", c.delta}, {"dtype", c.t}});
    std::vector<double> expected;
    for (double v : c.expected) expected.push_back(cast_ref(dtype::f64, c.t, v));
    expect_close(y, {static_cast<std::int64_t>(c.expected.size())}, expected, 0, 0);
    // dynamic_range: the same bounds as tensors of the output's dtype (where they are
    // representable in it), read at run time.
    if (cast_ref(dtype::f64, c.t, c.start) == c.start && cast_ref(dtype::f64, c.t, c.limit) == c.limit &&
        cast_ref(dtype::f64, c.t, c.delta) == c.delta) {
      const tensor d = run_op1("dynamic_range", {make(c.t, {}, {c.start}), make(c.t, {1}, {c.limit}),
                                                 make(c.t, {}, {c.delta})});
      expect_close(d, {static_cast<std::int64_t>(c.expected.size())}, expected, 0, 0);
    }
  }
  // Long enough to be split across threads.
  const tensor big = run_op1("range", {}, {{"start", 3.0}, {"limit", 200003.0}, {"delta", 2.0}});
  std::vector<double> expected;
  for (int i = 0; i < 100000; ++i) expected.push_back(3.0 + 2.0 * i);
  expect_close(big, {100000}, expected, 0, 0);
}

TEST(ElementwiseRange, DynamicRangeErrorsNameTheNode) {
  const auto dyn = [](std::vector<double> start, double limit, double delta) {
    return [=] {
      (void)run_op1("dynamic_range",
                    {make(dtype::f32, {static_cast<std::int64_t>(start.size())}, start),
                     make(dtype::f32, {}, {limit}), make(dtype::f32, {}, {delta})});
    };
  };
  // Bounds are known at run time only: node errors.
  expect_throw_naming<node_error>(dyn({0.0}, 5.0, 0.0), {"under_test", "delta"});
  expect_throw_naming<node_error>(dyn({0.0}, inf, 1.0), {"under_test", "finite"});
  // Shapes and dtypes are known when the node is made.
  expect_throw_naming<invalid_argument>(dyn({0.0, 1.0}, 5.0, 1.0), {"under_test", "start", "one number"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("dynamic_range", {make(dtype::f32, {}, {0}), make(dtype::f64, {}, {3}),
                                        make(dtype::f32, {}, {1})});
      },
      {"under_test"});
}

TEST(ElementwiseRange, Errors) {
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("range", {}, {{"start", 0.0}, {"limit", 5.0}, {"delta", 0.0}});
      },
      {"under_test", "delta"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("range", {}, {{"start", 0.0}, {"limit", inf}});
      },
      {"under_test", "limit"});
  expect_throw_naming<invalid_argument>(
      [] {
        (void)run_op1("range", {}, {{"start", 0.0}, {"limit", 1.0}, {"dtype", dtype::boolean}});
      },
      {"under_test", "bool"});
}

// ---- random -------------------------------------------------------------------------------------

TEST(ElementwiseRandom, PhiloxKnownAnswers) {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  using cpu::ew::philox4x32_10;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (cpu::ew::philox_block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (cpu::ew::philox_block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (cpu::ew::philox_block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

attr_map uniform_attrs(dtype t, shape s, std::int64_t seed, double lo, double hi) {
  return {{"dtype", t}, {"shape", std::move(s)}, {"seed", seed}, {"minval", lo}, {"maxval", hi}};
}
attr_map normal_attrs(dtype t, shape s, std::int64_t seed, double mean, double stddev) {
  return {
      {"dtype", t}, {"shape", std::move(s)}, {"seed", seed}, {"mean", mean}, {"stddev", stddev}};
}

struct moments {
  double mean = 0, var = 0, min = inf, max = -inf, skew = 0, kurt = 0;
};
moments moments_of(const std::vector<double>& v) {
  moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  double m3 = 0;
  double m4 = 0;
  for (double x : v) {
    const double d = x - m.mean;
    m.var += d * d;
    m3 += d * d * d;
    m4 += d * d * d * d;
  }
  const auto n = static_cast<double>(v.size());
  m.var /= n;
  m.skew = m3 / n / std::pow(m.var, 1.5);
  m.kurt = m4 / n / (m.var * m.var);
  return m;
}

TEST(ElementwiseRandom, UniformStatistics) {
  constexpr std::int64_t n = 100000;
  for (dtype t : ew::float_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const double lo = -1.0;
    const double hi = 3.0;
    const auto v = values(run_op1("random_uniform", {}, uniform_attrs(t, {n}, 42, lo, hi)));
    const moments m = moments_of(v);
    // Mean (b+a)/2, variance (b-a)^2/12; bounds five standard errors wide (rounding to
    // bfloat16 adds a little).
    const double slack = t == dtype::bf16 ? 0.01 : 0.0;
    EXPECT_NEAR(m.mean, 1.0, 5 * 4 / std::sqrt(12.0 * n) + slack);
    EXPECT_NEAR(m.var, 16.0 / 12.0, 0.02 + slack);
    EXPECT_GE(m.min, lo);
    EXPECT_LT(m.max, hi);
    EXPECT_LT(m.min, lo + 0.01);
    EXPECT_GT(m.max, hi - 0.02);
    // Ten equal bins, each near n/10 (chi-square-like bound, generous).
    std::vector<int> bins(10);
    for (double x : v) ++bins[std::min(9, static_cast<int>((x - lo) / (hi - lo) * 10))];
    if (t == dtype::f32 || t == dtype::f64) {
      for (int b : bins) EXPECT_NEAR(b, n / 10, 5 * std::sqrt(n * 0.1 * 0.9));
    }
  }
}

TEST(ElementwiseRandom, UniformStaysBelowMaxvalAfterRounding) {
  // In float16 and bfloat16 most of [0.999, 1) rounds to 1: those values must step down.
  for (dtype t : ew::float_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const auto v = values(run_op1("random_uniform", {}, uniform_attrs(t, {20000}, 3, 0.5, 1.0)));
    for (double x : v) {
      ASSERT_GE(x, 0.5);
      ASSERT_LT(x, 1.0);
    }
  }
  // minval == maxval: every value is minval.
  expect_close(run_op1("random_uniform", {}, uniform_attrs(dtype::f32, {5}, 1, 2.0, 2.0)), {5},
               std::vector<double>(5, 2.0), 0, 0);
}

TEST(ElementwiseRandom, NormalStatistics) {
  constexpr std::int64_t n = 100000;
  for (dtype t : ew::float_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const auto v = values(run_op1("random_normal", {}, normal_attrs(t, {n}, 7, 2.0, 0.5)));
    const moments m = moments_of(v);
    const double slack = t == dtype::bf16 ? 0.005 : 0.0;
    EXPECT_NEAR(m.mean, 2.0, 5 * 0.5 / std::sqrt(n) + slack);
    EXPECT_NEAR(m.var, 0.25, 5 * 0.25 * std::sqrt(2.0 / n) + slack);
    EXPECT_NEAR(m.skew, 0.0, 5 * std::sqrt(6.0 / n));
    EXPECT_NEAR(m.kurt, 3.0, 5 * std::sqrt(24.0 / n) + slack * 10);
    // The fraction within one standard deviation: 68.27%.
    std::int64_t within = 0;
    for (double x : v) within += std::fabs(x - 2.0) <= 0.5 ? 1 : 0;
    EXPECT_NEAR(static_cast<double>(within) / n, 0.6827, 0.01);
  }
}

TEST(ElementwiseRandom, DeterministicForASeedAndIndependentOfThreads) {
  for (const char* op : {"random_uniform", "random_normal"}) {
    for (dtype t : ew::float_dtypes()) {
      SCOPED_TRACE(fmt::format("{} {}", op, to_string(t)));
      const attr_map attrs = std::string(op) == "random_uniform"
                                 ? uniform_attrs(t, {301, 333}, 1234, -2, 2)
                                 : normal_attrs(t, {301, 333}, 1234, 0, 1);
      manual_run m(op, {}, attrs);
      const auto first = values(m.run({})[0]);
      EXPECT_EQ(values(m.run({})[0]), first);
      EXPECT_EQ(values(run_op1(op, {}, attrs)), first);
      for (int threads : {1, 3, 4}) {
        cpu_device d(0, threads, 0, "random test device");
        EXPECT_EQ(values(m.run({}, d)[0]), first) << threads << " threads";
      }
      // Another seed gives other values; a smaller tensor of the same seed is a prefix.
      attr_map other = attrs;
      other["seed"] = std::int64_t{1235};
      const auto second = values(run_op1(op, {}, other));
      std::size_t same = 0;
      for (std::size_t i = 0; i < first.size(); ++i) same += first[i] == second[i] ? 1 : 0;
      EXPECT_LT(same, first.size() / 50);
      attr_map small = attrs;
      small["shape"] = shape{7};
      const auto prefix = values(run_op1(op, {}, small));
      EXPECT_EQ(prefix, std::vector<double>(first.begin(), first.begin() + 7));
    }
  }
}

TEST(ElementwiseRandom, ScalarEmptyAndErrors) {
  EXPECT_EQ(run_op1("random_normal", {}, normal_attrs(dtype::f32, {}, 1, 0, 1)).shape(), shape{});
  EXPECT_EQ(run_op1("random_uniform", {}, uniform_attrs(dtype::f64, {0, 3}, 1, 0, 1)).shape(),
            (shape{0, 3}));
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("random_uniform", {}, uniform_attrs(dtype::f32, {2}, 1, 1.0, 0.0)); },
      {"under_test", "maxval"});
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("random_normal", {}, normal_attrs(dtype::f32, {2}, 1, 0.0, -1.0)); },
      {"under_test", "stddev"});
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("random_normal", {}, normal_attrs(dtype::i32, {2}, 1, 0.0, 1.0)); },
      {"under_test", "int32"});
  expect_throw_naming<invalid_argument>(
      [] { (void)run_op1("random_uniform", {}, uniform_attrs(dtype::f32, {-1}, 1, 0.0, 1.0)); },
      {"under_test", "shape"});
}

// ---- the builder API ----------------------------------------------------------------------------

TEST(ElementwiseBuilder, InfersTypesAndShapes) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {2, 3});
  const auto y = ops::placeholder(b, "y", dtype::f32, {3});
  const auto z = x + y * 2.0;
  EXPECT_EQ(z.type(), (tensor_type{dtype::f32, shape{2, 3}}));
  EXPECT_EQ(z.producer().op(), "add");
  const auto w = 1.0 - x;
  EXPECT_EQ(w.producer().op(), "sub");
  const node& one = g.at(w.producer().inputs[0].node);
  EXPECT_EQ(one.op(), "const");
  EXPECT_EQ(one.outputs[0], (tensor_type{dtype::f32, shape{}}));
  EXPECT_EQ((-x).producer().op(), "neg");
  EXPECT_EQ((x / y).producer().op(), "div");
  EXPECT_EQ((x - y).producer().op(), "sub");
  EXPECT_EQ((x * y).producer().op(), "mul");
  EXPECT_EQ((2.0 * x).type().shape, (shape{2, 3}));
  EXPECT_EQ((x / 2.0).producer().op(), "div");
  EXPECT_EQ((3.0 / x).producer().op(), "div");
  EXPECT_EQ((x + 1.0).producer().op(), "add");
  EXPECT_EQ((1.0 + x).producer().op(), "add");

  const auto h = ops::gelu(ops::relu(z, {.name = "h"}), "tanh");
  EXPECT_EQ(g.get("h").op(), "relu");
  EXPECT_EQ(h.producer().attr<std::string>("approximate"), "tanh");
  EXPECT_EQ(ops::gelu(z).producer().attr<std::string>("approximate"), "none");
  for (auto f : {ops::exp, ops::log, ops::sqrt, ops::rsqrt, ops::tanh, ops::sigmoid, ops::erf,
                 ops::square, ops::reciprocal, ops::abs, ops::neg}) {
    EXPECT_EQ(f(z, {}).type(), z.type());
  }
  EXPECT_EQ(ops::cast(x, dtype::f16).type(), (tensor_type{dtype::f16, shape{2, 3}}));
  const auto eq = ops::equal(x, y);
  EXPECT_EQ(eq.type(), (tensor_type{dtype::boolean, shape{2, 3}}));
  for (auto f : {ops::not_equal, ops::less, ops::less_equal, ops::greater, ops::greater_equal}) {
    EXPECT_EQ(f(x, y, {}).type(), eq.type());
  }
  EXPECT_EQ(ops::logical_not(eq).type(), eq.type());
  EXPECT_EQ(ops::logical_and(eq, ops::logical_or(eq, eq)).type(), eq.type());
  EXPECT_EQ(ops::where(eq, x, y).type(), (tensor_type{dtype::f32, shape{2, 3}}));
  for (auto f : {ops::maximum, ops::minimum, ops::pow, ops::add, ops::sub, ops::mul, ops::div}) {
    EXPECT_EQ(f(x, y, {}).type(), z.type());
  }

  EXPECT_EQ(ops::fill(b, dtype::i8, {4}, 3.0).type(), (tensor_type{dtype::i8, shape{4}}));
  EXPECT_EQ(ops::zeros(b, dtype::f64, {2, 2}).type(), (tensor_type{dtype::f64, shape{2, 2}}));
  EXPECT_EQ(ops::ones(b, dtype::boolean, {}).type(), (tensor_type{dtype::boolean, shape{}}));
  EXPECT_EQ(ops::range(b, 0, 10, 2.5, dtype::i32).type(), (tensor_type{dtype::i32, shape{4}}));
  EXPECT_EQ(ops::range(b, 0, 3).type(), (tensor_type{dtype::f32, shape{3}}));
  const auto r = ops::random_uniform(b, dtype::bf16, {5, 6}, 9, -1.0, 1.0);
  EXPECT_EQ(r.type(), (tensor_type{dtype::bf16, shape{5, 6}}));
  EXPECT_EQ(r.producer().attr<std::int64_t>("seed"), 9);
  EXPECT_EQ(ops::random_normal(b, dtype::f64, {3}, 1, 0.0, 2.0).producer().attr<double>("stddev"),
            2.0);

  // Unknown dimensions and ranks propagate.
  const auto u = ops::placeholder(b, "u", dtype::f32, {-1, 3});
  EXPECT_EQ((u + y).type().shape, (shape{-1, 3}));
  EXPECT_EQ((u + ops::placeholder(b, "v", dtype::f32, {4, 1})).type().shape, (shape{4, 3}));
  // An integer tensor times a double: the constant takes the tensor's dtype.
  const auto i = ops::placeholder(b, "i", dtype::i32, {2});
  const auto i2 = i * 2.0;
  EXPECT_EQ(i2.type().type, dtype::i32);
  EXPECT_EQ(g.at(i2.producer().inputs[1].node).outputs[0].type, dtype::i32);

  // Mismatches fail at construction, naming the node.
  const auto d = ops::placeholder(b, "d", dtype::f64, {3});
  expect_throw_naming<invalid_argument>([&] { (void)ops::add(x, d, {.name = "bad_add"}); },
                                        {"bad_add", "float64"});
  expect_throw_naming<invalid_argument>(
      [&] { (void)ops::mul(x, ops::placeholder(b, "q", dtype::f32, {4}), {.name = "bad_mul"}); },
      {"bad_mul", "[2, 3]", "[4]"});
  expect_throw_naming<invalid_argument>([&] { (void)ops::exp(i, {.name = "bad_exp"}); },
                                        {"bad_exp", "int32"});
  expect_throw_naming<invalid_argument>(
      [&] { (void)ops::range(b, 0, 1, 0, dtype::f32, {.name = "r0"}); }, {"r0", "delta"});
}

}  // namespace
}  // namespace loom::testing
