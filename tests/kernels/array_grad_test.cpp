// pad, gather_grad and broadcast_to against index-arithmetic references: every dtype they
// take, empty dims, zero paddings, scalars, non-contiguous and broadcast inputs; the
// adjoint identities <slice(y), x> == <y, pad(x)> and <gather(p), dy> == <p, gather_grad(dy)>
// with loom's own slice and gather; duplicate indices, axes other than 0, determinism
// across runs; broadcast_to's view (same buffer, stride 0); bad input at construction and
// at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/array_reference.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using namespace array_ref;

double dot(const doubles& a, const doubles& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- pad --------------------------------------------------------------------------------

// out[i] = x[i - before] inside the input, `value` elsewhere.
doubles pad_reference(const doubles& x, const ints& xs, const ints& p, double value,
                      ints* out_shape) {
  ints o(xs.size());
  for (std::size_t d = 0; d < xs.size(); ++d) o[d] = xs[d] + p[2 * d] + p[2 * d + 1];
  doubles out(static_cast<std::size_t>(count(o)), value);
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints io = unravel(f, o);
    bool inside = true;
    for (std::size_t d = 0; d < xs.size(); ++d) {
      io[d] -= p[2 * d];
      inside = inside && io[d] >= 0 && io[d] < xs[d];
    }
    if (inside) out[static_cast<std::size_t>(f)] = x[static_cast<std::size_t>(ravel(io, xs))];
  }
  *out_shape = o;
  return out;
}

// `stored`: the constant as x's dtype holds it (default: `value` itself).
void check_pad(const tensor& x, const ints& p, double value = 0.0,
               std::optional<double> stored = std::nullopt) {
  SCOPED_TRACE(::testing::Message() << x.describe() << " paddings " << ::testing::PrintToString(p)
                                    << " value " << value);
  ints os;
  const doubles want =
      pad_reference(values(x), x.shape().to_vector(), p, stored.value_or(value), &os);
  const tensor out = run_op1("pad", {x}, {{"paddings", p}, {"constant_value", value}});
  expect_exact(out, os, want);
}

TEST(Pad, EveryDtype) {
  for (const dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {3, 4}, 1);
    check_pad(x, {1, 2, 0, 3});
    check_pad(x, {0, 0, 2, 0}, 1.0);
    check_pad(random(t, {5}, 2), {3, 1}, t == dtype::boolean ? 1.0 : 2.0);
  }
}

TEST(Pad, RanksOneToFive) {
  check_pad(random(dtype::f32, {7}, 1), {2, 5}, -1.5);
  check_pad(random(dtype::f64, {2, 3, 4}, 2), {1, 0, 0, 2, 3, 1}, 0.25);
  check_pad(random(dtype::i32, {2, 1, 3, 2}, 3), {0, 1, 1, 1, 2, 0, 1, 1}, 7);
  check_pad(random(dtype::f16, {1, 2, 2, 3, 2}, 4), {1, 1, 0, 0, 1, 0, 0, 1, 2, 2}, 3);
}

TEST(Pad, ZeroPaddingsAndScalars) {
  const tensor x = random(dtype::f32, {2, 3}, 1);
  check_pad(x, {0, 0, 0, 0});
  check_pad(make(dtype::f64, {}, {4.5}), {});
  check_pad(non_contiguous(random(dtype::i64, {3, 2}, 2)), {0, 0, 0, 0});
}

TEST(Pad, EmptyDimensions) {
  // An empty input padded to a non-empty output: all constant.
  check_pad(random(dtype::f32, {0, 3}, 1), {1, 1, 0, 0}, 2.0);
  check_pad(random(dtype::i8, {2, 0}, 1), {0, 0, 2, 1}, 5.0);
  // An empty output.
  check_pad(random(dtype::f32, {0, 3}, 1), {0, 0, 1, 1});
  check_pad(random(dtype::f64, {3, 0, 2}, 1), {1, 1, 0, 0, 1, 0});
}

TEST(Pad, NonContiguousAndBroadcastInputs) {
  for (const dtype t : {dtype::f32, dtype::bf16, dtype::u8, dtype::i64}) {
    SCOPED_TRACE(to_string(t));
    check_pad(non_contiguous(random(t, {3, 5}, 1)), {1, 2, 2, 1}, 3.0);
    check_pad(non_contiguous(random(t, {2, 3, 4}, 2)), {0, 1, 1, 0, 0, 2});
    check_pad(broadcast_view(random(t, {1, 4}, 3), {3, 4}), {1, 0, 0, 2}, 1.0);
    check_pad(every_other(random(t, {6}, 4), 3), {2, 2}, 1.0);
  }
}

TEST(Pad, ConstantConversions) {
  // Integers truncate, bool is != 0, NaN and infinities pass to floats.
  check_pad(random(dtype::i32, {2}, 1), {1, 1}, 2.75, 2.0);
  check_pad(random(dtype::i64, {2}, 1), {1, 1}, -3.5, -3.0);
  check_pad(random(dtype::u8, {2}, 1), {1, 0}, 200.0);
  check_pad(random(dtype::boolean, {2}, 1), {1, 1}, 0.5, 1.0);
  check_pad(random(dtype::f16, {2}, 1), {1, 1}, 0.1,
            static_cast<double>(static_cast<float>(half(0.1f))));
  const tensor out = run_op1(
      "pad", {random(dtype::f16, {1}, 1)},
      {{"paddings", ints{1, 1}}, {"constant_value", std::numeric_limits<double>::quiet_NaN()}});
  const auto v = values(out);
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[2]));
  check_pad(random(dtype::f32, {2}, 1), {0, 1}, -std::numeric_limits<double>::infinity());
}

// pad is the adjoint of slice: <slice(y, before, x.shape), x> == <y, pad(x, paddings)>.
TEST(Pad, AdjointOfSlice) {
  const ints xs{3, 4, 2};
  const ints p{1, 2, 0, 3, 2, 1};
  const ints ys{6, 7, 5};
  const tensor x = random(dtype::f64, to_shape(xs), 1);
  const tensor y = random(dtype::f64, to_shape(ys), 2);
  const tensor sliced = run_op1("slice", {y}, {{"begin", ints{1, 0, 2}}, {"size", xs}});
  const tensor padded = run_op1("pad", {x}, {{"paddings", p}});
  EXPECT_NEAR(dot(values(sliced), values(x)), dot(values(y), values(padded)), 1e-12);
}

TEST(Pad, LargeRowsUseEveryThread) {
  // Enough rows to be split over the device's threads.
  check_pad(random(dtype::f32, {64, 300}, 1), {3, 5, 7, 1}, 9.0);
  check_pad(non_contiguous(random(dtype::f64, {200, 70}, 2)), {1, 1, 1, 1});
}

TEST(Pad, Errors) {
  const tensor x = random(dtype::f32, {2, 3}, 1);
  expect_invalid([&] { run_op1("pad", {x}, {{"paddings", ints{1, 1, 1}}}); }, "paddings");
  expect_invalid([&] { run_op1("pad", {x}, {{"paddings", ints{1, 1, 1}}}); }, "2 per dimension");
  expect_invalid(
      [&] {
        run_op1("pad", {x}, {{"paddings", ints{1, -1, 0, 0}}});
      },
      "padding -1 is below 0");
  expect_invalid(
      [&] {
        run_op1("pad", {x}, {{"paddings", ints{1, 1}}});
      },
      "for the rank-2 input float32[2, 3]");
  expect_invalid([&] { run_op1("pad", {x}); }, "paddings");
  // The rank known only at run time.
  expect_node_error(
      [&] {
        run_declared("pad", {random(dtype::f32, {2, 3, 1}, 1)}, {shape{-1, -1}},
                     {{"paddings", ints{1, 1, 1, 1}}});
      },
      "paddings [1, 1, 1, 1] has 4 entries for the rank-3 input float32[2, 3, 1]");
}

TEST(Pad, Builder) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {-1, 3});
  const auto y = ops::pad(x, {1, 2, 0, 1}, 4.0, {.name = "p"});
  EXPECT_EQ(to_string(y.type()), "float32[?, 4]");
  EXPECT_EQ(y.producer().attr<double>("constant_value"), 4.0);
}

// ---- gather_grad ------------------------------------------------------------------------

// zeros of ps, plus dy's slices added at indices along axis.
doubles gather_grad_reference(const doubles& dy, const ints& ps, const ints& indices,
                              const ints& is, std::size_t axis) {
  ints dys(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(axis));
  dys.insert(dys.end(), is.begin(), is.end());
  dys.insert(dys.end(), ps.begin() + static_cast<std::ptrdiff_t>(axis) + 1, ps.end());
  doubles out(static_cast<std::size_t>(count(ps)), 0.0);
  for (std::int64_t f = 0; f < count(dys); ++f) {
    const ints io = unravel(f, dys);
    ints ip(io.begin(), io.begin() + static_cast<std::ptrdiff_t>(axis));
    const ints ii(io.begin() + static_cast<std::ptrdiff_t>(axis),
                  io.begin() + static_cast<std::ptrdiff_t>(axis + is.size()));
    ip.push_back(indices[static_cast<std::size_t>(ravel(ii, is))]);
    ip.insert(ip.end(), io.begin() + static_cast<std::ptrdiff_t>(axis + is.size()), io.end());
    out[static_cast<std::size_t>(ravel(ip, ps))] += dy[static_cast<std::size_t>(f)];
  }
  return out;
}

ints gathered_shape(const ints& ps, const ints& is, std::size_t axis) {
  ints o(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(axis));
  o.insert(o.end(), is.begin(), is.end());
  o.insert(o.end(), ps.begin() + static_cast<std::ptrdiff_t>(axis) + 1, ps.end());
  return o;
}

ints random_indices(std::int64_t n, std::int64_t limit, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ints v(static_cast<std::size_t>(n));
  for (auto& x : v) x = std::uniform_int_distribution<std::int64_t>(0, limit - 1)(rng);
  return v;
}

attr_map gg_attrs(const ints& ps, std::int64_t axis) {
  return {{"params_shape", to_shape(ps)}, {"axis", axis}};
}

void check_gather_grad(dtype t, const ints& ps, const ints& indices, const ints& is,
                       std::int64_t axis, dtype it = dtype::i32, std::uint64_t seed = 1) {
  const auto ax =
      static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(ps.size()) : axis);
  SCOPED_TRACE(::testing::Message() << to_string(t) << " params " << to_string(to_shape(ps))
                                    << " indices " << to_string(to_shape(is)) << " axis " << axis);
  // Small integers: sums of them are exact in every dtype, so the comparison can be exact.
  const shape dys = to_shape(gathered_shape(ps, is, ax));
  doubles v = values(random(dtype::f64, dys, seed, 0.0, 4.0));
  for (auto& e : v) e = std::floor(e);
  const tensor dy = make(t, dys, v);
  const tensor out =
      run_op1("gather_grad", {dy, index_tensor(it, is, indices)}, gg_attrs(ps, axis));
  expect_exact(out, ps, gather_grad_reference(values(dy), ps, indices, is, ax));
}

const std::vector<dtype>& grad_dtypes() {
  static const std::vector<dtype> t{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                    dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  return t;
}

TEST(GatherGrad, EveryDtypeWithBothIndexTypes) {
  for (const dtype t : grad_dtypes()) {
    for (const dtype it : {dtype::i32, dtype::i64}) {
      check_gather_grad(t, {5, 3}, {4, 0, 0, 2, 1}, {5}, 0, it);
      check_gather_grad(t, {5, 3}, {2, 1, 2, 0}, {2, 2}, 1, it);
      check_gather_grad(t, {5, 3}, {3}, {}, 0, it);
    }
  }
}

TEST(GatherGrad, DuplicatesAccumulate) {
  // Hand-computed: rows 1 and 3 picked twice and three times.
  const tensor dy = make(dtype::f32, {5, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const tensor out = run_op1("gather_grad", {dy, index_tensor(dtype::i64, {5}, {1, 3, 1, 3, 3})},
                             gg_attrs({4, 2}, 0));
  expect_exact(out, {4, 2}, {0, 0, 1 + 5, 2 + 6, 0, 0, 3 + 7 + 9, 4 + 8 + 10});
  for (const dtype t : grad_dtypes()) {
    check_gather_grad(t, {3, 4, 2}, {2, 2, 0, 2, 2, 2}, {2, 3}, 1);
  }
}

TEST(GatherGrad, AxesAndRanks) {
  for (const dtype t : {dtype::f32, dtype::f64, dtype::i64}) {
    check_gather_grad(t, {2, 3, 4, 5}, random_indices(6, 4, 1), {3, 2}, 2);
    check_gather_grad(t, {2, 3, 4, 5}, random_indices(7, 5, 2), {7}, -1);
    check_gather_grad(t, {2, 3, 4, 5}, random_indices(4, 2, 3), {2, 1, 2}, 0);
    check_gather_grad(t, {6}, random_indices(9, 6, 4), {9}, 0);
    check_gather_grad(t, {4, 3}, {2}, {}, -2);
  }
}

TEST(GatherGrad, EmptyIndicesAndEmptyParams) {
  // No index: zeros.
  check_gather_grad(dtype::f32, {3, 2}, {}, {0}, 0);
  check_gather_grad(dtype::i32, {3, 2}, {}, {2, 0}, 1);
  // Empty params (a zero dimension besides the axis).
  check_gather_grad(dtype::f64, {3, 0}, {1, 2}, {2}, 0);
  check_gather_grad(dtype::f64, {0, 3}, {1, 2}, {2}, 1);
}

// Many duplicates over rows wider than a column block, enough work for both threads: exact
// against the reference, and bitwise the same on a second run.
TEST(GatherGrad, LargeAndDeterministic) {
  const ints ps{3, 40, 1500};
  const ints is{300};
  const ints indices = random_indices(300, 7, 11);  // only 7 of 40 rows, each ~40 times
  const tensor dy = random(dtype::f32, to_shape(gathered_shape(ps, is, 1)), 5, -1.0, 1.0);
  const tensor idx = index_tensor(dtype::i32, is, indices);
  const tensor a = run_op1("gather_grad", {dy, idx}, gg_attrs(ps, 1));
  const tensor b = run_op1("gather_grad", {dy, idx}, gg_attrs(ps, 1));
  const auto av = values(a);
  const auto bv = values(b);
  ASSERT_EQ(av.size(), bv.size());
  for (std::size_t i = 0; i < av.size(); ++i) ASSERT_EQ(av[i], bv[i]) << "element " << i;
  expect_close(a, to_shape(ps), gather_grad_reference(values(dy), ps, indices, is, 1), 1e-5, 1e-5);
}

// gather_grad is the adjoint of gather: <gather(p, idx), dy> == <p, gather_grad(dy, idx)>.
TEST(GatherGrad, AdjointOfGather) {
  const ints ps{4, 6, 3};
  const ints is{2, 5};
  const ints indices = random_indices(10, 6, 21);
  const tensor p = random(dtype::f64, to_shape(ps), 1);
  const tensor idx = index_tensor(dtype::i64, is, indices);
  const tensor dy = random(dtype::f64, to_shape(gathered_shape(ps, is, 1)), 2);
  const tensor y = run_op1("gather", {p, idx}, {{"axis", std::int64_t{1}}});
  const tensor dp = run_op1("gather_grad", {dy, idx}, gg_attrs(ps, 1));
  EXPECT_NEAR(dot(values(y), values(dy)), dot(values(p), values(dp)), 1e-12);
}

TEST(GatherGrad, NonContiguousInputs) {
  const ints ps{4, 3};
  const ints indices{3, 0, 3, 1, 2, 0};
  const tensor dy = random(dtype::f64, {2, 3, 3}, 1);
  const tensor idx = index_tensor(dtype::i32, {2, 3}, indices);
  const tensor want = run_op1("gather_grad", {dy, idx}, gg_attrs(ps, 0));
  expect_close(run_op1("gather_grad", {non_contiguous(dy), non_contiguous(idx)}, gg_attrs(ps, 0)),
               to_shape(ps), gather_grad_reference(values(dy), ps, indices, {2, 3}, 0), 1e-12,
               1e-12);
  expect_close(want, to_shape(ps), gather_grad_reference(values(dy), ps, indices, {2, 3}, 0), 1e-12,
               1e-12);
}

TEST(GatherGrad, UnknownParamsDimsComeFromDy) {
  const tensor dy = random(dtype::f32, {2, 3, 5}, 1);
  const tensor idx = index_tensor(dtype::i32, {3}, {0, 3, 3});
  const tensor out = run_op1("gather_grad", {dy, idx},
                             {{"params_shape", shape{-1, 4, -1}}, {"axis", std::int64_t{1}}});
  expect_close(out, {2, 4, 5}, gather_grad_reference(values(dy), {2, 4, 5}, {0, 3, 3}, {3}, 1),
               1e-6, 1e-6);
}

TEST(GatherGrad, OutOfRangeIndicesNameThePositionAndValue) {
  const tensor dy = random(dtype::f32, {2, 2, 3}, 1);
  // Negative indices do not wrap (gather's rule).
  expect_node_error(
      [&] {
        run_op1("gather_grad", {dy, index_tensor(dtype::i32, {2, 2}, {0, 1, -1, 2})},
                gg_attrs({4, 3}, 0));
      },
      "indices[1, 0] = -1 is out of range");
  expect_node_error(
      [&] {
        run_op1("gather_grad", {dy, index_tensor(dtype::i64, {2, 2}, {0, 4, 1, 2})},
                gg_attrs({4, 3}, 0));
      },
      "indices[0, 1] = 4 is out of range: params_shape [4, 3] has 4 entries along axis 0");
}

TEST(GatherGrad, Errors) {
  const tensor dy = random(dtype::f32, {2, 3}, 1);
  const tensor idx = index_tensor(dtype::i32, {2}, {0, 1});
  // dy is not gather's output for these shapes.
  expect_invalid(
      [&] {
        run_op1("gather_grad", {dy, idx}, gg_attrs({4, 4}, 0));
      },
      "dy float32[2, 3] does not match params_shape [4, 4] in dimension 1");
  expect_invalid(
      [&] {
        run_op1("gather_grad", {dy, idx}, gg_attrs({4, 3, 1}, 0));
      },
      "dy float32[2, 3] must have rank 3");
  expect_invalid(
      [&] {
        run_op1("gather_grad", {dy, index_tensor(dtype::i32, {3}, {0, 1, 2})}, gg_attrs({4, 3}, 0));
      },
      "does not match the indices");
  expect_invalid(
      [&] {
        run_op1("gather_grad", {dy, idx}, gg_attrs({4, 3}, 2));
      },
      "axis 2 is out of range");
  expect_invalid([&] { run_op1("gather_grad", {dy, idx}, gg_attrs({}, 0)); }, "params_shape");
  expect_invalid([&] { run_op1("gather_grad", {dy, idx}, gg_attrs({4, -3}, 0)); }, "dimension 1 is -3");
  expect_invalid([&] { run_op1("gather_grad", {dy, idx}); }, "params_shape");
  expect_invalid(
      [&] {
        run_op1("gather_grad", {random(dtype::boolean, {2, 3}, 1), idx}, gg_attrs({4, 3}, 0));
      },
      "bool");
  expect_invalid(
      [&] {
        run_op1("gather_grad", {dy, index_tensor(dtype::f32, {2}, {0, 1})}, gg_attrs({4, 3}, 0));
      },
      "Tindices");
  // Shapes known only at run time.
  expect_node_error(
      [&] {
        run_declared("gather_grad", {dy, idx}, {shape{-1, -1}, shape{-1}}, gg_attrs({4, 4}, 0));
      },
      "is not gather's output for params_shape [4, 4]");
  expect_node_error(
      [&] {
        run_declared("gather_grad", {dy, idx}, {shape{-1, -1}, shape{-1}}, gg_attrs({-1, 3}, 0));
      },
      "leaves the gathered dimension 0 unknown");
}

TEST(GatherGrad, Builder) {
  graph g;
  graph_builder b(g);
  const auto dy = ops::placeholder(b, "dy", dtype::f32, {2, -1, 5});
  const auto idx = ops::placeholder(b, "idx", dtype::i64, {-1});
  const auto out = ops::gather_grad(dy, idx, {-1, 9, 5}, 1, {.name = "gg"});
  EXPECT_EQ(to_string(out.type()), "float32[2, 9, 5]");
  EXPECT_EQ(out.producer().attr<std::int64_t>("axis"), 1);
}

// ---- broadcast_to -----------------------------------------------------------------------

doubles broadcast_reference(const doubles& x, const ints& xs, const ints& to) {
  doubles out(static_cast<std::size_t>(count(to)));
  const std::size_t lead = to.size() - xs.size();
  for (std::int64_t f = 0; f < count(to); ++f) {
    const ints io = unravel(f, to);
    ints ix(xs.size());
    for (std::size_t d = 0; d < xs.size(); ++d) ix[d] = xs[d] == 1 ? 0 : io[lead + d];
    out[static_cast<std::size_t>(f)] = x[static_cast<std::size_t>(ravel(ix, xs))];
  }
  return out;
}

void check_broadcast(const tensor& x, const ints& to) {
  SCOPED_TRACE(x.describe() + " to " + to_string(to_shape(to)));
  const tensor out = run_op1("broadcast_to", {x}, {{"shape", to_shape(to)}});
  expect_exact(out, to, broadcast_reference(values(x), x.shape().to_vector(), to));
  EXPECT_TRUE(out.buf() == x.buf()) << "broadcast_to must be a view";
}

TEST(BroadcastTo, EveryDtypeIsAView) {
  for (const dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    check_broadcast(random(t, {3}, 1), {2, 3});
    check_broadcast(random(t, {2, 1}, 2), {2, 4});
    check_broadcast(random(t, {1, 3, 1}, 3), {4, 2, 3, 5});
  }
}

TEST(BroadcastTo, StridesAreZeroOnBroadcastDims) {
  const tensor x = random(dtype::f32, {2, 1}, 1);
  const tensor out = run_op1("broadcast_to", {x}, {{"shape", shape{3, 2, 4}}});
  EXPECT_EQ(to_string(out.strides()), "[0, 1, 0]");
  EXPECT_EQ(out.offset(), x.offset());
}

TEST(BroadcastTo, ScalarsSameShapeAndEmpty) {
  check_broadcast(make(dtype::f64, {}, {2.5}), {2, 3});
  check_broadcast(make(dtype::i32, {}, {7}), {});
  check_broadcast(random(dtype::f32, {2, 3}, 1), {2, 3});
  check_broadcast(random(dtype::f32, {1}, 1), {0});
  check_broadcast(random(dtype::f32, {1, 3}, 1), {4, 0, 3});
}

TEST(BroadcastTo, NonContiguousInputs) {
  check_broadcast(non_contiguous(random(dtype::f32, {3, 1, 2}, 1)), {2, 3, 4, 2});
  check_broadcast(every_other(random(dtype::i8, {4}, 2)), {3, 4});
  check_broadcast(broadcast_view(random(dtype::f64, {1, 3}, 3), {2, 3}), {5, 2, 3});
}

TEST(BroadcastTo, ConsumersReadTheView) {
  // A dense copy of the view (transpose copies when the permuted view is not dense).
  const tensor x = random(dtype::f32, {3, 1}, 1);
  const tensor b = run_op1("broadcast_to", {x}, {{"shape", shape{3, 4}}});
  const tensor t = run_op1("transpose", {b}, {{"perm", ints{1, 0}}});
  expect_exact(t, {4, 3},
               transpose(broadcast_reference(values(x), {3, 1}, {3, 4}), {3, 4}, {1, 0}, nullptr));
}

TEST(BroadcastTo, Errors) {
  const tensor x = random(dtype::f32, {2, 3}, 1);
  expect_invalid(
      [&] {
        run_op1("broadcast_to", {x}, {{"shape", shape{2, 4}}});
      },
      "cannot broadcast float32[2, 3] to [2, 4]: dimension 1 is 3, not 1 or 4");
  expect_invalid(
      [&] {
        run_op1("broadcast_to", {x}, {{"shape", shape{3}}});
      },
      "the target has fewer dimensions");
  expect_invalid(
      [&] {
        run_op1("broadcast_to", {x}, {{"shape", shape{2, -1}}});
      },
      "dimension -1 is below 0");
  expect_invalid([&] { run_op1("broadcast_to", {x}); }, "shape");
  expect_node_error(
      [&] {
        run_declared("broadcast_to", {x}, {shape{-1, -1}}, {{"shape", shape{4, 3}}});
      },
      "to [4, 3]: dimension 0 is 2, not 1 or 4");
  expect_node_error(
      [&] {
        // A declared rank that differs from the fed one (inference saw rank 1).
        run_declared("broadcast_to", {x}, {shape{-1}}, {{"shape", shape{3}}});
      },
      "fewer dimensions");
}

TEST(BroadcastTo, Builder) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {-1, 1});
  EXPECT_EQ(to_string(ops::broadcast_to(x, {5, 2, 3}).type()), "float32[5, 2, 3]");
  const auto y = ops::placeholder(b, "y", dtype::f32, {-1, 3});
  expect_invalid_argument(
      [&] {
        ops::broadcast_to(y, {5, 2});
      },
      {"broadcast_to", "dimension 1 is 3, not 1 or 2"});
  // pad, gather_grad and broadcast_to compose with the ops they differentiate.
  const auto s = ops::slice(ops::broadcast_to(x, {4, 6}), {1, 2}, {2, 3});
  EXPECT_EQ(to_string(ops::pad(s, {1, 1, 2, 1}).type()), "float32[4, 6]");
}

}  // namespace
}  // namespace loom::testing
