// reduce_sum / mean / max / min / prod against float64 loops: every axes combination on
// ranks 0..4 with and without keepdims, empty tensors, strided, transposed and broadcast
// inputs, every dtype, large reductions along inner and outer axes, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using namespace reduction;

enum class kind { sum, mean, max, min, prod };
constexpr kind all_kinds[] = {kind::sum, kind::mean, kind::max, kind::min, kind::prod};

const char* op_of(kind k) {
  switch (k) {
    case kind::sum:
      return "reduce_sum";
    case kind::mean:
      return "reduce_mean";
    case kind::max:
      return "reduce_max";
    case kind::min:
      return "reduce_min";
    case kind::prod:
      return "reduce_prod";
  }
  return "";
}

// The float64 reduction of x over axes (empty: all), as NumPy computes it.
expected_reduction reference(kind k, const tensor& x, const std::vector<std::int64_t>& axes, bool keepdims) {
  const output_groups og = group_by_output(x, axes, keepdims);
  expected_reduction e;
  e.s = og.out;
  double init = 0.0;
  if (k == kind::prod) init = 1.0;
  if (k == kind::max) init = -INFINITY;
  if (k == kind::min) init = INFINITY;
  for (const auto& g : og.groups) {
    double acc = init;
    double mag = 0.0;
    for (const double v : g) {
      mag += std::fabs(v);
      switch (k) {
        case kind::sum:
        case kind::mean:
          acc += v;
          break;
        case kind::prod:
          acc *= v;
          break;
        case kind::max:
          if (!std::isnan(acc) && (std::isnan(v) || v > acc)) acc = v;
          break;
        case kind::min:
          if (!std::isnan(acc) && (std::isnan(v) || v < acc)) acc = v;
          break;
      }
    }
    const auto count = static_cast<double>(g.size());
    if (k == kind::mean) {
      acc = g.empty() ? std::nan("") : acc / count;
      mag = g.empty() ? 0 : mag / count;
    }
    e.v.push_back(acc);
    e.scale.push_back(k == kind::sum || k == kind::mean ? mag : std::fabs(acc));
  }
  return e;
}

attr_map reduce_attrs(const std::vector<std::int64_t>& axes, bool keepdims) {
  return {{"axes", axes}, {"keepdims", keepdims}};
}

// Runs op k on x and checks it against the reference.
void check(kind k, const tensor& x, const std::vector<std::int64_t>& axes, bool keepdims,
           double rtol = -1, double atol = -1) {
  const dtype t = x.type();
  expect_reduction(op_of(k), x, axes, keepdims, reference(k, x, axes, keepdims),
                   rtol < 0 ? rtol_for(t) : rtol, atol < 0 ? atol_for(t) : atol);
}

// Values that keep every kind exact or well-conditioned for dtype t: products near 1, and
// integer products of ±1 with few 2s (so they never overflow).
tensor input_for(kind k, dtype t, const shape& s, std::uint64_t seed) {
  if (k != kind::prod) return random(t, s, seed, -4.0, 4.0);
  if (!is_integer(t)) return random(t, s, seed, 0.8, 1.2);
  std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = i % 17 == 3 ? 2.0 : ((i * 7 + seed) % 3 == 0 ? -1.0 : 1.0);
  return make(t, s, v);
}

const shape test_shapes[] = {{}, {5}, {3, 4}, {2, 3, 4}, {2, 3, 1, 5}, {1, 4, 1, 3}};

TEST(ReduceTest, EveryAxesCombinationEveryKindFloat32) {
  std::uint64_t seed = 1;
  for (const auto& s : test_shapes) {
    for (const auto& axes : axis_subsets(s.rank())) {
      for (bool keepdims : {false, true}) {
        for (kind k : all_kinds) check(k, input_for(k, dtype::f32, s, seed++), axes, keepdims);
      }
    }
  }
}

TEST(ReduceTest, EveryAxesCombinationOtherDtypes) {
  std::uint64_t seed = 100;
  for (dtype t : {dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64}) {
    for (const auto& s : test_shapes) {
      for (const auto& axes : axis_subsets(s.rank())) {
        for (bool keepdims : {false, true}) {
          for (kind k : all_kinds) {
            if (k == kind::mean && is_integer(t)) continue;
            check(k, input_for(k, t, s, seed++), axes, keepdims);
          }
        }
      }
    }
  }
}

TEST(ReduceTest, ExplicitFullAxesListEqualsEmptyList) {
  const tensor x = random(dtype::f32, {2, 3, 4}, 7);
  for (kind k : all_kinds) {
    check(k, x, {0, 1, 2}, false);
    check(k, x, {-1, 0, -2}, true);
  }
}

TEST(ReduceTest, ScalarInput) {
  const tensor x = make(dtype::f32, {}, {2.5});
  for (kind k : all_kinds) {
    const tensor y = run_op1(op_of(k), {x});
    expect_close(y, {}, {2.5});
  }
  const tensor y = run_op1("reduce_sum", {make(dtype::i32, {}, {-7})}, reduce_attrs({}, true));
  expect_close(y, {}, {-7});
}

TEST(ReduceTest, EmptyReductionsGiveIdentities) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64}) {
    const tensor x = make(t, {3, 0, 2}, {});
    expect_close(run_op1("reduce_sum", {x}, reduce_attrs({1}, false)), {3, 2},
                 std::vector<double>(6, 0.0));
    expect_close(run_op1("reduce_prod", {x}, reduce_attrs({1}, true)), {3, 1, 2},
                 std::vector<double>(6, 1.0));
    expect_close(run_op1("reduce_sum", {x}, reduce_attrs({}, false)), {}, {0.0});
    expect_close(run_op1("reduce_prod", {x}, reduce_attrs({}, false)), {}, {1.0});
    if (is_floating(t)) {
      expect_close(run_op1("reduce_mean", {x}, reduce_attrs({1}, false)), {3, 2},
                   std::vector<double>(6, std::nan("")));
    }
    // Reducing a non-empty axis of an empty tensor gives an empty result, for max too.
    for (kind k : all_kinds) {
      if (k == kind::mean && is_integer(t)) continue;
      expect_close(run_op1(op_of(k), {x}, reduce_attrs({0, 2}, false)), {0}, {});
      expect_close(run_op1(op_of(k), {x}, reduce_attrs({2}, true)), {3, 0, 1}, {});
    }
  }
}

TEST(ReduceTest, MaxMinOfAnEmptyAxisFail) {
  for (const char* op : {"reduce_max", "reduce_min"}) {
    // As NumPy: an empty reduced axis fails even when the result would be empty too.
    for (const auto& axes : {std::vector<std::int64_t>{1}, std::vector<std::int64_t>{},
                             std::vector<std::int64_t>{0, 1}}) {
      expect_error<node_error>(
          [&] {
            (void)run_op1(op, {make(dtype::f32, {3, 0}, {})}, reduce_attrs(axes, false));
          },
          {"under_test", op, "empty axis", "[3, 0]"});
    }
    expect_error<node_error>(
        [&] {
          (void)run_op1(op, {make(dtype::i32, {0, 0}, {})}, reduce_attrs({0}, false));
        },
        {"under_test", "empty axis"});
  }
}

TEST(ReduceTest, NanPropagatesThroughMaxAndMinAndSums) {
  const double nan = std::nan("");
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    // NaN first, in the middle, last; along the inner axis and along the outer axis.
    const tensor x = make(t, {3, 20}, [&] {
      std::vector<double> v(60);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 7) - 3.0;
      v[0] = nan;
      v[20 + 9] = nan;
      v[40 + 19] = nan;
      return v;
    }());
    for (kind k : all_kinds) {
      check(k, x, {1}, false);
      check(k, x, {0}, false);
      check(k, non_contiguous(x), {1}, true);
    }
    // Infinities: max/min pick them, sums follow IEEE.
    const tensor inf = make(t, {4}, {1.0, INFINITY, -2.0, 3.0});
    expect_close(run_op1("reduce_max", {inf}), {}, {INFINITY});
    expect_close(run_op1("reduce_sum", {inf}), {}, {INFINITY});
    expect_close(run_op1("reduce_min", {make(t, {3}, {-INFINITY, 0.0, -INFINITY})}), {},
                 {-INFINITY});
  }
}

TEST(ReduceTest, NonContiguousStridedAndBroadcastInputs) {
  std::uint64_t seed = 500;
  const shape shapes[] = {{4, 5}, {3, 4, 6}, {2, 3, 4, 5}};
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::i32}) {
    for (const auto& s : shapes) {
      for (const auto& axes : axis_subsets(s.rank())) {
        for (kind k : all_kinds) {
          if (k == kind::mean && is_integer(t)) continue;
          const tensor x = input_for(k, t, s, seed++);
          check(k, non_contiguous(x), axes, (seed % 2) == 0);
          check(k, strided_view(x), axes, (seed % 2) == 1);
        }
      }
    }
  }
  // Stride 0: a row broadcast to 7 rows; reducing over the broadcast axis and the other.
  const tensor row = random(dtype::f32, {1, 9}, 3);
  const tensor b = broadcast_view(row, {7, 9});
  for (kind k : all_kinds) {
    check(k, b, {0}, false);
    check(k, b, {1}, true);
    check(k, b, {}, false);
  }
}

TEST(ReduceTest, LargeReductionsAlongInnerAndOuterAxes) {
  // Inner (contiguous) and outer (strided) axes, output blocks wider than one row block
  // (300 > 256), reduced counts not multiples of 8 or 128, and few-output splits.
  const std::vector<std::pair<shape, std::vector<std::int64_t>>> cases = {
      {{37, 300}, {0}},       {{37, 300}, {1}},       {{300, 37}, {0}},      {{5, 1000, 7}, {1}},
      {{5, 1000, 7}, {0, 2}}, {{70000, 2}, {0}},      {{2, 70000}, {1}},     {{3, 129, 513}, {1}},
      {{200003}, {}},         {{64, 3, 341}, {0, 2}}, {{3, 41, 600}, {0, 1}}};
  std::uint64_t seed = 900;
  for (const auto& [s, axes] : cases) {
    for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::i64}) {
      for (kind k : {kind::sum, kind::mean, kind::max, kind::min}) {
        if (k == kind::mean && is_integer(t)) continue;
        check(k, random(t, s, seed++, -4.0, 4.0), axes, false);
      }
    }
    const tensor x = random(dtype::f32, s, seed++, -4.0, 4.0);
    if (s.rank() >= 2) check(kind::sum, non_contiguous(x), axes, true);
    check(kind::max, strided_view(x), axes, false);
  }
}

// Note [sums in any layout]: a float sum over elements lying along the contiguous axis (inner
// mode) and over the same elements lying along a strided axis (outer mode) gives the same bits
// (checked against float64 by the tests above; here the two layouts against each other):
// counts around the 8-lane groups and 128-row blocks, outputs beyond one lane block (300 >
// 256), every float sum kind, every float dtype, and several runs (a reduced dim that does not
// merge with the innermost one). The mean over the pixels of a channel-blocked tensor is the
// mean of the plain one, so the channel-blocks pass may take a global average in blocks.
TEST(ReduceTest, AFloatSumHasTheSameBitsAlongAnyAxis) {
  const auto same_bits = [](const tensor& a, const tensor& b, const std::string& what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    ASSERT_EQ(a.type(), b.type()) << what;
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), static_cast<std::size_t>(a.nbytes())), 0) << what;
  };
  std::uint64_t seed = 1300;
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    for (const std::int64_t outputs : {3, 37, 300}) {
      for (const std::int64_t n : {1, 7, 8, 49, 127, 128, 136, 300, 1000}) {
        const tensor x = random(t, {outputs, n}, seed++, -4.0, 4.0);
        for (const char* op : {"reduce_sum", "reduce_mean", "reduce_l1", "reduce_l2", "reduce_sum_square"}) {
          same_bits(run_op1(op, {x}, reduce_attrs({1}, false)), run_op1(op, {non_contiguous(x)}, reduce_attrs({1}, false)),
                    fmt::format("{} of {}[{}, {}]", op, to_string(t), outputs, n));
        }
      }
    }
  }
  // Three runs of 200: [37, 3, 200] over its last two axes as a view of [37, 3, 201] (inner
  // mode) and of [3, 201, 37] (outer mode), so that the reduced dims merge in neither.
  const tensor inner_store = random(dtype::f32, {37, 3, 201}, seed++, -4.0, 4.0);
  std::vector<double> outer_values(static_cast<std::size_t>(inner_store.num_elements()));
  const std::vector<double> iv = values(inner_store);
  for (std::int64_t c = 0; c < 37; ++c) {
    for (std::int64_t a = 0; a < 3; ++a) {
      for (std::int64_t i = 0; i < 201; ++i) outer_values[static_cast<std::size_t>((a * 201 + i) * 37 + c)] = iv[(c * 3 + a) * 201 + i];
    }
  }
  const tensor outer_store = make(dtype::f32, {3, 201, 37}, outer_values);
  const tensor inner_view = tensor::strided(inner_store.buf(), dtype::f32, {37, 3, 200}, {603, 201, 1}, 0);
  const tensor outer_view = tensor::strided(outer_store.buf(), dtype::f32, {37, 3, 200}, {1, 201 * 37, 37}, 0);
  same_bits(run_op1("reduce_sum", {inner_view}, reduce_attrs({1, 2}, false)),
            run_op1("reduce_sum", {outer_view}, reduce_attrs({1, 2}, false)), "reduce_sum of three runs of 200");
  // A global average of [1, 40, 7, 7] and of the same values in 16-channel blocks
  // [1, 3, 7, 7, 16] (the padding channels hold NaN: they are dropped, never mixed in).
  const tensor plain = random(dtype::f32, {1, 40, 7, 7}, seed++, -4.0, 4.0);
  std::vector<double> blocked(3 * 49 * 16, std::numeric_limits<double>::quiet_NaN());
  const std::vector<double> v = values(plain);
  for (std::int64_t c = 0; c < 40; ++c) {
    for (std::int64_t p = 0; p < 49; ++p) blocked[static_cast<std::size_t>((c / 16 * 49 + p) * 16 + c % 16)] = v[c * 49 + p];
  }
  const tensor mean_plain = run_op1("reduce_mean", {plain}, reduce_attrs({2, 3}, true));
  const tensor mean_blocked =
      run_op1("reduce_mean", {make(dtype::f32, {1, 3, 7, 7, 16}, blocked)}, reduce_attrs({2, 3}, true));
  for (std::int64_t c = 0; c < 40; ++c) {
    const float a = mean_plain.data<float>()[c];
    const float b = mean_blocked.data<float>()[c / 16 * 16 + c % 16];
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "channel " << c << ": " << a << " vs " << b;
  }
}

TEST(ReduceTest, MillionElementFloatSumMatchesFloat64) {
  for (auto [lo, hi] : {std::pair{-2.0, 2.0}, std::pair{0.0, 1.0}, std::pair{-1.0, 3.0}}) {
    const tensor x = random(dtype::f32, {1000000}, 42, lo, hi);
    const auto xs = values(x);
    double want = 0.0;
    for (double v : xs) want += v;
    const double got = values(run_op1("reduce_sum", {x}))[0];
    EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want)) << got << " vs " << want;
    // The same values as [1000, 1000] reduced over the outer axis, then the inner.
    const tensor m = x.reshaped({1000, 1000});
    const auto cols = values(run_op1("reduce_sum", {m}, reduce_attrs({0}, false)));
    double total = 0.0;
    for (double c : cols) total += c;
    EXPECT_LE(std::fabs(total - want), 1e-5 * std::fabs(want));
    const double mean = values(run_op1("reduce_mean", {x}))[0];
    EXPECT_LE(std::fabs(mean - want / 1e6), 1e-5 * std::fabs(want / 1e6));
  }
}

TEST(ReduceTest, IntegerSumsAccumulateInInt64) {
  // i32 partial sums past 2^31 come back as long as the total fits.
  std::vector<double> v(64, 2.0e9);
  for (std::size_t i = 32; i < 64; ++i) v[i] = -2.0e9;
  v[5] = 7;
  const tensor x = make(dtype::i32, {64}, std::vector<double>(v.begin(), v.end()));
  // 31 × 2e9 + 7 − 32 × 2e9 = −2e9 + 7.
  expect_close(run_op1("reduce_sum", {x}), {}, {-2.0e9 + 7});
  const tensor big = make(dtype::i64, {3}, {4.0e18, 4.0e18, -5.0e18});
  expect_close(run_op1("reduce_sum", {big}), {}, {3.0e18}, 0, 1024);
  expect_close(run_op1("reduce_max", {make(dtype::i64, {2}, {-9.0e18, -8.0e18})}), {}, {-8.0e18}, 0,
               1024);
  // Products wrap modulo 2^32 for i32, as TF's.
  expect_close(run_op1("reduce_prod", {make(dtype::i32, {2}, {65536, 65537})}), {}, {65536});
}

TEST(ReduceTest, BadAxesFailAtConstruction) {
  const tensor x = random(dtype::f32, {2, 3}, 1);
  for (kind k : all_kinds) {
    expect_error<invalid_argument>([&] { (void)run_op1(op_of(k), {x}, reduce_attrs({2}, false)); },
                                   {"under_test", op_of(k), "axis 2", "out of range", "[2, 3]"});
    expect_error<invalid_argument>([&] { (void)run_op1(op_of(k), {x}, reduce_attrs({-3}, false)); },
                                   {"under_test", "axis -3"});
    expect_error<invalid_argument>(
        [&] {
          (void)run_op1(op_of(k), {x}, reduce_attrs({1, -1}, false));
        },
        {"under_test", "twice"});
    expect_error<invalid_argument>(
        [&] {
          (void)run_op1(op_of(k), {x}, reduce_attrs({0, 0}, false));
        },
        {"under_test", "axes"});
  }
  // A scalar has no axis 0.
  expect_error<invalid_argument>(
      [&] { (void)run_op1("reduce_sum", {make(dtype::f32, {}, {1})}, reduce_attrs({0}, false)); },
      {"under_test", "out of range"});
  // Wrong attribute types and unsupported dtypes.
  expect_error<invalid_argument>(
      [&] {
        (void)run_op1("reduce_sum", {x}, {{"axes", std::string("0")}});
      },
      {"under_test", "axes"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op1("reduce_sum", {x}, {{"keepdims", std::int64_t{1}}});
      },
      {"under_test", "keepdims"});
  expect_error<invalid_argument>(
      [&] { (void)run_op1("reduce_mean", {random(dtype::i32, {2}, 1)}); }, {"under_test", "int32"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op1("reduce_sum", {make(dtype::boolean, {2}, {1, 0})});
      },
      {"under_test", "bool"});
}

TEST(ReduceTest, BuildersInferTypes) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {4, -1, 6});
  EXPECT_EQ(ops::reduce_sum(x).type(), (tensor_type{dtype::f32, shape{}}));
  EXPECT_EQ(ops::reduce_sum(x, {}, true).type(), (tensor_type{dtype::f32, shape{1, 1, 1}}));
  EXPECT_EQ(ops::reduce_mean(x, {0}).type(), (tensor_type{dtype::f32, shape{-1, 6}}));
  EXPECT_EQ(ops::reduce_max(x, {-1}, true).type(), (tensor_type{dtype::f32, shape{4, -1, 1}}));
  EXPECT_EQ(ops::reduce_min(x, {1}).type(), (tensor_type{dtype::f32, shape{4, 6}}));
  const auto p = ops::reduce_prod(x, {2, 0}, false, {.name = "p"});
  EXPECT_EQ(p.type(), (tensor_type{dtype::f32, shape{-1}}));
  EXPECT_EQ(p.producer().name, "p");
  EXPECT_EQ(p.producer().op(), "reduce_prod");
  const auto i = ops::placeholder(b, "i", dtype::i64, {3});
  EXPECT_EQ(ops::reduce_sum(i, {0}).type(), (tensor_type{dtype::i64, shape{}}));
  EXPECT_THROW((void)ops::reduce_mean(i), invalid_argument);
  EXPECT_THROW((void)ops::reduce_sum(x, {3}), invalid_argument);
}


// reduce_sum's output_type float32 over float16 / bfloat16: the sum of cast(x, float32), bit
// for bit (the cast is exact and the accumulation the same), without the rounding to 16 bits.
TEST(ReduceTest, SumOfSixteenBitFloatsIntoFloat32IsTheSumOfTheCast) {
  const std::vector<std::pair<shape, std::vector<std::int64_t>>> cases = {
      {{}, {}},          {{5}, {}},          {{3, 4}, {0}},         {{3, 4}, {1}},
      {{2, 3, 4}, {0, 2}}, {{37, 300}, {0}}, {{5, 1000, 7}, {1}},   {{2, 70000}, {1}},
      {{64, 3, 341}, {0, 2}}, {{200003}, {}}, {{0, 4}, {0}}};
  std::uint64_t seed = 1300;
  for (dtype t : {dtype::f16, dtype::bf16}) {
    for (const auto& [s, axes] : cases) {
      for (bool keepdims : {false, true}) {
        SCOPED_TRACE(::testing::Message() << to_string(t) << " " << to_string(s) << " keepdims "
                                          << keepdims);
        const tensor x = random(t, s, seed++, -4.0, 4.0);
        attr_map widened = reduce_attrs(axes, keepdims);
        widened.emplace("output_type", dtype::f32);
        const tensor sum = run_op1("reduce_sum", {x}, widened);
        const tensor want = run_op1("reduce_sum", {run_op1("cast", {x}, {{"to", dtype::f32}})},
                                    reduce_attrs(axes, keepdims));
        ASSERT_EQ(sum.type(), dtype::f32);
        ASSERT_EQ(sum.shape(), want.shape());
        EXPECT_EQ(values(sum), values(want));
        // Not rounded to t: the 16-bit sum differs from it somewhere in most cases.
        if (s.num_elements() > 1000) {
          const std::vector<double> narrow = values(run_op1("reduce_sum", {x}, reduce_attrs(axes, keepdims)));
          const std::vector<double> wide = values(sum);
          EXPECT_NE(narrow, wide);
        }
        // Strided input: summed in another order (its own layout's), so equal within float
        // rounding.
        if (s.rank() >= 2 && s.num_elements() > 0) {
          const std::vector<double> strided =
              values(run_op1("reduce_sum", {non_contiguous(x)}, widened));
          const std::vector<double> w = values(want);
          ASSERT_EQ(strided.size(), w.size());
          for (std::size_t i = 0; i < w.size(); ++i) {
            EXPECT_NEAR(strided[i], w[i], 1e-5 * (1.0 + std::abs(w[i])));
          }
        }
      }
    }
  }
}

TEST(ReduceTest, SumOutputTypeIsCheckedAndDifferentiates) {
  // Any other output_type fails at construction, naming both types.
  const std::vector<std::pair<dtype, dtype>> bad = {
      {dtype::f32, dtype::f16}, {dtype::f32, dtype::f64}, {dtype::bf16, dtype::f64},
      {dtype::i32, dtype::f32}, {dtype::f16, dtype::bf16}, {dtype::i32, dtype::i64}};
  for (const auto& [in, out] : bad) {
    expect_error<invalid_argument>(
        [&, in = in, out = out] {
          (void)run_op1("reduce_sum", {random(in, {2, 3}, 1)},
                        {{"axes", std::vector<std::int64_t>{0}}, {"output_type", out}});
        },
        {"under_test", std::string("reduce_sum of ") + to_string(in),
         std::string("cannot give ") + to_string(out)});
  }
  // Given as the input's own type, it changes nothing; the builder infers float32; the
  // gradient comes back in x's dtype.
  const tensor x = random(dtype::f32, {3, 4}, 2);
  EXPECT_EQ(values(run_op1("reduce_sum", {x}, {{"axes", std::vector<std::int64_t>{1}},
                                               {"output_type", dtype::f32}})),
            values(run_op1("reduce_sum", {x}, reduce_attrs({1}, false))));
  graph g;
  graph_builder b(g);
  const auto h = ops::placeholder(b, "h", dtype::bf16, {4, 6});
  const auto s = ops::reduce_sum(h, {0}, false, dtype::f32);
  EXPECT_EQ(s.type(), (tensor_type{dtype::f32, shape{6}}));
  EXPECT_EQ(s.producer().attrs.at("output_type").as<dtype>(), dtype::f32);
  EXPECT_EQ(ops::reduce_sum(h, {0}).producer().attrs.at("output_type").as<dtype>(), dtype::bf16);
  const output dh = gradients(ops::reduce_sum(s), {h})[0];
  EXPECT_EQ(dh.type(), (tensor_type{dtype::bf16, shape{4, 6}}));
}

}  // namespace
}  // namespace loom::testing
