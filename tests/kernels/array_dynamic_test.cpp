// shape_of, dynamic_reshape, expand, expand_grad, constant_of_shape, tile, flip,
// strided_slice, strided_slice_grad and cumsum on the CPU: values against index-arithmetic
// references written here (strided_slice against Python's slice-index adjustment), every
// dtype, empty / scalar / non-contiguous inputs, negative axes, and errors at construction
// and at run time.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/array_reference.hpp"
#include "kernels/kernel_test_support.hpp"

namespace loom::testing {
namespace {

using namespace array_ref;

constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t small = std::numeric_limits<std::int64_t>::min();

tensor shape_tensor(const ints& s) {
  return make(dtype::i64, shape{static_cast<std::int64_t>(s.size())}, doubles(s.begin(), s.end()));
}

// ---- shape_of ------------------------------------------------------------------------------

TEST(ShapeOf, EveryDtypeAndRank) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor out = run_op1("shape_of", {random(t, {2, 0, 5}, 1)});
    EXPECT_EQ(out.type(), dtype::i64);
    expect_exact(out, {3}, {2, 0, 5});
  }
  expect_exact(run_op1("shape_of", {make(dtype::f32, {}, {1.5})}), {0}, {});
  expect_exact(run_op1("shape_of", {non_contiguous(random(dtype::f64, {3, 4}, 2))}), {2}, {3, 4});
}

// ---- dynamic_reshape -----------------------------------------------------------------------

TEST(DynamicReshape, OnnxSpecialEntries) {
  const tensor x = random(dtype::f32, {2, 3, 4}, 3);
  const auto run = [&](const ints& spec, bool allowzero = false) {
    return run_op1("dynamic_reshape", {x, shape_tensor(spec)}, {{"allowzero", allowzero}});
  };
  expect_exact(run({4, 2, 3}), {4, 2, 3}, values(x));
  expect_exact(run({0, -1}), {2, 12}, values(x));  // 0 copies dimension 0
  expect_exact(run({0, 0, -1}), {2, 3, 4}, values(x));
  expect_exact(run({-1}), {24}, values(x));
  expect_exact(run({2, 0, 4, 1}), {2, 3, 4, 1}, values(x));
  // A dense input gives a view.
  EXPECT_TRUE(run({6, 4}).buf() == x.buf());
}

TEST(DynamicReshape, AllowZeroKeepsZeros) {
  const tensor e = random(dtype::f64, {0, 3}, 4);
  expect_exact(run_op1("dynamic_reshape", {e, shape_tensor({3, 0})}, {{"allowzero", true}}), {3, 0},
               {});
  // Without allowzero the 0 copies e's dimension 0 (itself 0).
  expect_exact(run_op1("dynamic_reshape", {e, shape_tensor({0, 3})}), {0, 3}, {});
  const tensor x = random(dtype::f32, {2, 3}, 5);
  expect_node_error(
      [&] {
        run_op1("dynamic_reshape", {x, shape_tensor({0, 3})}, {{"allowzero", true}});
      },
      "6 elements");
}

TEST(DynamicReshape, EveryDtypeAndNonContiguous) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor dense = random(t, {3, 4}, 6);
    const tensor x = non_contiguous(dense);
    const tensor out = run_op1("dynamic_reshape", {x, shape_tensor({2, -1})});
    expect_exact(out, {2, 6}, values(dense));
    EXPECT_TRUE(out.is_contiguous());
  }
}

TEST(DynamicReshape, RunTimeErrorsNameBothShapes) {
  const tensor x = random(dtype::f32, {2, 3}, 7);
  const auto bad = [&](const ints& spec, const std::string& part) {
    expect_node_error([&] { run_op1("dynamic_reshape", {x, shape_tensor(spec)}); }, part);
  };
  bad({4, 2}, "[2, 3]");
  bad({4, 2}, "[4, 2]");
  bad({-1, -1}, "more than one entry is -1");
  bad({4, -1}, "do not divide 6");
  bad({2, 3, 0}, "rank 2");
  bad({-2, 3}, "below -1");
  expect_invalid(
      [&] {
        run_op1("dynamic_reshape", {x, make(dtype::i64, {1, 2}, {2, 3})});
      },
      "must be 1-D");
  expect_invalid([&] { run_op1("dynamic_reshape", {x, make(dtype::i32, {2}, {3, 2})}); }, "int");
}

// ---- expand --------------------------------------------------------------------------------

// NumPy broadcast of `in` (shape s) to `out`.
doubles broadcast_ref(const doubles& v, const ints& s, const ints& out) {
  doubles r(static_cast<std::size_t>(count(out)));
  const std::size_t lead = out.size() - s.size();
  for (std::int64_t f = 0; f < count(out); ++f) {
    const ints io = unravel(f, out);
    ints ii(s.size());
    for (std::size_t d = 0; d < s.size(); ++d) ii[d] = s[d] == 1 ? 0 : io[d + lead];
    r[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(ii, s))];
  }
  return r;
}

TEST(Expand, BothWaysBroadcastForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {3, 1}, 8);
    // ONNX's expand_dim_changed: [3, 1] with [2, 1, 6] -> [2, 3, 6].
    const tensor out = run_op1("expand", {x, shape_tensor({2, 1, 6})});
    expect_exact(out, {2, 3, 6}, broadcast_ref(values(x), {3, 1}, {2, 3, 6}));
    EXPECT_TRUE(out.buf() == x.buf()) << "expand is a view";
  }
  // A shorter target: ONNX's expand_dim_unchanged and a 1 that keeps x's dimension.
  const tensor x = random(dtype::f64, {3, 4}, 9);
  expect_exact(run_op1("expand", {x, shape_tensor({1})}), {3, 4}, values(x));
  expect_exact(run_op1("expand", {x, shape_tensor({})}), {3, 4}, values(x));
  const tensor s = make(dtype::i32, {}, {7});
  expect_exact(run_op1("expand", {s, shape_tensor({2, 2})}), {2, 2}, {7, 7, 7, 7});
  const tensor e = random(dtype::f32, {0, 1}, 10);
  expect_exact(run_op1("expand", {e, shape_tensor({0, 5})}), {0, 5}, {});
  const tensor nc = non_contiguous(random(dtype::bf16, {1, 3}, 11));
  expect_exact(run_op1("expand", {nc, shape_tensor({2, 1})}), {2, 3},
               broadcast_ref(values(nc), {1, 3}, {2, 3}));
}

TEST(Expand, IncompatibleShapesFailNamingBoth) {
  const tensor x = random(dtype::f32, {3, 4}, 12);
  expect_node_error([&] { run_op1("expand", {x, shape_tensor({2, 3})}); }, "[3, 4]");
  expect_node_error([&] { run_op1("expand", {x, shape_tensor({2, 3})}); }, "[2, 3]");
  expect_node_error([&] { run_op1("expand", {x, shape_tensor({-1, 4})}); }, "negative");
}

TEST(ExpandGrad, SumsTheBroadcastDimensions) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                  dtype::i8, dtype::u8}) {
    SCOPED_TRACE(to_string(t));
    const tensor dy = random(t, {2, 3, 4}, 13, 0.0, 3.0);
    const tensor out = run_op1("expand_grad", {dy, shape_tensor({3, 1})});
    const doubles v = values(dy);
    doubles want(3, 0.0);
    for (std::int64_t f = 0; f < 24; ++f)
      want[static_cast<std::size_t>(unravel(f, {2, 3, 4})[1])] += v[static_cast<std::size_t>(f)];
    expect_close(out, {3, 1}, want, rtol_for(t), atol_for(t));
  }
  const tensor dy = non_contiguous(random(dtype::f64, {4, 5}, 14));
  const doubles v = values(dy);
  doubles want(5, 0.0);
  for (std::size_t f = 0; f < 20; ++f) want[f % 5] += v[f];
  expect_close(run_op1("expand_grad", {dy, shape_tensor({5})}), {5}, want, 1e-12, 1e-12);
  expect_node_error([&] { run_op1("expand_grad", {dy, shape_tensor({3})}); }, "cannot broadcast");
}

// ---- constant_of_shape ---------------------------------------------------------------------

TEST(ConstantOfShape, FillsEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor out =
        run_op1("constant_of_shape", {shape_tensor({2, 3})}, {{"dtype", t}, {"value", 1.0}});
    EXPECT_EQ(out.type(), t);
    expect_exact(out, {2, 3}, doubles(6, 1.0));
  }
  const tensor f = run_op1("constant_of_shape", {shape_tensor({4})});
  EXPECT_EQ(f.type(), dtype::f32);
  expect_exact(f, {4}, doubles(4, 0.0));
  expect_exact(run_op1("constant_of_shape", {shape_tensor({})}, {{"value", -2.5}}), {}, {-2.5});
  expect_exact(run_op1("constant_of_shape", {shape_tensor({3, 0})}), {3, 0}, {});
  expect_node_error(
      [&] {
        run_op1("constant_of_shape", {shape_tensor({2, -1})});
      },
      "negative dimension");
}

// ---- tile ----------------------------------------------------------------------------------

doubles tile_ref(const doubles& v, const ints& s, const ints& m, ints* out_shape) {
  ints o(s.size());
  for (std::size_t d = 0; d < s.size(); ++d) o[d] = s[d] * m[d];
  doubles r(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints i = unravel(f, o);
    for (std::size_t d = 0; d < s.size(); ++d) i[d] %= s[d];
    r[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(i, s))];
  }
  *out_shape = o;
  return r;
}

TEST(Tile, NumpyTileForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {2, 3}, 15);
    ints o;
    const doubles want = tile_ref(values(x), {2, 3}, {3, 2}, &o);
    expect_exact(run_op1("tile", {x}, {{"multiples", ints{3, 2}}}), o, want);
  }
  const tensor dense = random(dtype::f64, {2, 1, 3}, 16);
  const tensor x = non_contiguous(dense);
  ints o;
  const doubles want = tile_ref(values(dense), {2, 1, 3}, {1, 4, 2}, &o);
  expect_exact(run_op1("tile", {x}, {{"multiples", ints{1, 4, 2}}}), o, want);
  expect_exact(run_op1("tile", {random(dtype::f32, {2, 3}, 17)}, {{"multiples", ints{0, 2}}}),
               {0, 6}, {});
  const tensor s = make(dtype::i64, {}, {5});
  expect_exact(run_op1("tile", {s}, {{"multiples", ints{}}}), {}, {5});
}

TEST(Tile, BadMultiplesAreConstructionErrors) {
  const tensor x = random(dtype::f32, {2, 3}, 18);
  expect_invalid([&] { run_op1("tile", {x}, {{"multiples", ints{2}}}); }, "1 entries");
  expect_invalid([&] { run_op1("tile", {x}, {{"multiples", ints{2, -1}}}); }, "negative entry -1");
}

// ---- flip ----------------------------------------------------------------------------------

doubles flip_ref(const doubles& v, const ints& s, const std::vector<bool>& flipped) {
  doubles r(v.size());
  for (std::int64_t f = 0; f < count(s); ++f) {
    ints i = unravel(f, s);
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (flipped[d]) i[d] = s[d] - 1 - i[d];
    }
    r[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(i, s))];
  }
  return r;
}

TEST(Flip, AxesNegativeAndAllForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {2, 3, 4}, 19);
    expect_exact(run_op1("flip", {x}, {{"axes", ints{-1}}}), {2, 3, 4},
                 flip_ref(values(x), {2, 3, 4}, {false, false, true}));
    expect_exact(run_op1("flip", {x}, {{"axes", ints{0, 1}}}), {2, 3, 4},
                 flip_ref(values(x), {2, 3, 4}, {true, true, false}));
    expect_exact(run_op1("flip", {x}), {2, 3, 4},
                 flip_ref(values(x), {2, 3, 4}, {true, true, true}));
  }
  const tensor dense = random(dtype::f32, {3, 5}, 20);
  expect_exact(run_op1("flip", {non_contiguous(dense)}, {{"axes", ints{1}}}), {3, 5},
               flip_ref(values(dense), {3, 5}, {false, true}));
  expect_exact(run_op1("flip", {random(dtype::f32, {0, 4}, 21)}), {0, 4}, {});
  expect_exact(run_op1("flip", {make(dtype::f64, {}, {3})}), {}, {3});
}

TEST(Flip, BadAxesAreConstructionErrors) {
  const tensor x = random(dtype::f32, {2, 3}, 22);
  expect_invalid([&] { run_op1("flip", {x}, {{"axes", ints{2}}}); }, "axis 2 is outside [-2, 2)");
  expect_invalid([&] { run_op1("flip", {x}, {{"axes", ints{1, -1}}}); }, "twice");
}

// ---- strided_slice -------------------------------------------------------------------------

// Python's slice.indices(len): the first index, the step and the count.
struct py_slice {
  std::int64_t start;
  std::int64_t step;
  std::int64_t count;
};
py_slice py_indices(std::int64_t start, std::int64_t stop, std::int64_t step, std::int64_t len) {
  const auto adjust = [&](std::int64_t v) {
    if (v < 0) {
      v = v < -len ? (step < 0 ? -1 : 0) : v + len;
    } else if (v >= len) {
      v = step < 0 ? len - 1 : len;
    }
    return v;
  };
  const std::int64_t a = adjust(start);
  const std::int64_t b = adjust(stop);
  std::int64_t n = 0;
  if (step > 0 && a < b) n = (b - a - 1) / step + 1;
  // -step of INT64_MIN: any step that long takes one entry.
  if (step < 0 && b < a) n = step < -len ? 1 : (a - b - 1) / (-step) + 1;
  return {a, step, n};
}

doubles slice_ref(const doubles& v, const ints& s, const ints& starts, const ints& ends,
                  const ints& axes, const ints& steps, ints* out_shape) {
  std::vector<py_slice> per(s.size());
  for (std::size_t d = 0; d < s.size(); ++d) per[d] = {0, 1, s[d]};
  for (std::size_t i = 0; i < starts.size(); ++i) {
    std::int64_t a = axes.empty() ? static_cast<std::int64_t>(i) : axes[i];
    if (a < 0) a += static_cast<std::int64_t>(s.size());
    const auto d = static_cast<std::size_t>(a);
    per[d] = py_indices(starts[i], ends[i], steps.empty() ? 1 : steps[i], s[d]);
  }
  ints o(s.size());
  for (std::size_t d = 0; d < s.size(); ++d) o[d] = per[d].count;
  doubles r(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints i = unravel(f, o);
    for (std::size_t d = 0; d < s.size(); ++d) i[d] = per[d].start + i[d] * per[d].step;
    r[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(i, s))];
  }
  *out_shape = o;
  return r;
}

struct slice_case {
  ints s;
  ints starts;
  ints ends;
  ints axes;
  ints steps;
};

TEST(StridedSlice, OnnxCasesAgainstPythonSlices) {
  const std::vector<slice_case> cases = {
      {{20, 10, 5}, {0, 0}, {3, 10}, {0, 1}, {1, 1}},                  // slice
      {{20, 10, 5}, {0, 0, 3}, {20, 10, 4}, {}, {}},                   // slice_default_axes
      {{20, 10, 5}, {1}, {big}, {1}, {}},                              // slice_end_out_of_bounds
      {{20, 10, 5}, {0}, {-1}, {1}, {}},                               // slice_neg
      {{20, 10, 5}, {20, 10, 4}, {0, 0, 1}, {0, 1, 2}, {-1, -3, -2}},  // slice_neg_steps
      {{20, 10, 5}, {0, 0, 3}, {20, 10, 4}, {0, -2, -1}, {}},          // slice_negative_axes
      {{20, 10, 5}, {1000}, {1000}, {1}, {1}},                         // slice_start_out_of_bounds
      {{7}, {-1}, {small}, {0}, {-1}},                                 // whole, backwards
      {{7}, {big}, {small}, {0}, {-2}},
      {{7}, {2}, {big}, {0}, {big}},  // one entry
      {{7}, {5}, {small}, {0}, {small}},
      {{7}, {-100}, {100}, {0}, {3}},
      {{7}, {3}, {3}, {0}, {-1}},              // empty
      {{0, 3}, {0, 0}, {5, -1}, {}, {-1, 1}},  // empty input
      {{4, 5}, {-1, 1}, {-5, 4}, {-2, -1}, {-1, 2}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(fmt::format("shape [{}] starts [{}] ends [{}] axes [{}] steps [{}]",
                             fmt::join(c.s, ", "), fmt::join(c.starts, ", "),
                             fmt::join(c.ends, ", "), fmt::join(c.axes, ", "),
                             fmt::join(c.steps, ", ")));
    const tensor x = random(dtype::f64, to_shape(c.s), 23);
    ints o;
    const doubles want = slice_ref(values(x), c.s, c.starts, c.ends, c.axes, c.steps, &o);
    expect_exact(
        run_op1("strided_slice", {x},
                {{"starts", c.starts}, {"ends", c.ends}, {"axes", c.axes}, {"steps", c.steps}}),
        o, want);
  }
}

TEST(StridedSlice, EveryDtypeAndNonContiguous) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor dense = random(t, {5, 6}, 24);
    const tensor x = non_contiguous(dense);
    ints o;
    const doubles want = slice_ref(values(dense), {5, 6}, {4, 1}, {0, 6}, {}, {-2, 3}, &o);
    expect_exact(run_op1("strided_slice", {x},
                         {{"starts", ints{4, 1}}, {"ends", ints{0, 6}}, {"steps", ints{-2, 3}}}),
                 o, want);
  }
}

TEST(StridedSlice, BadAttributesAreConstructionErrors) {
  const tensor x = random(dtype::f32, {4, 5}, 25);
  const auto bad = [&](attr_map a, const std::string& part) {
    expect_invalid([&] { run_op1("strided_slice", {x}, a); }, part);
  };
  bad({{"starts", ints{0}}, {"ends", ints{2}}, {"steps", ints{0}}}, "has a 0");
  bad({{"starts", ints{0}}, {"ends", ints{2, 3}}}, "differ in length");
  bad({{"starts", ints{0, 0}}, {"ends", ints{2, 3}}, {"axes", ints{1, -1}}}, "twice");
  bad({{"starts", ints{0}}, {"ends", ints{2}}, {"axes", ints{2}}}, "axis 2 is outside [-2, 2)");
}

TEST(StridedSliceGrad, WritesDyWhereTheSliceRead) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                  dtype::i8, dtype::u8}) {
    SCOPED_TRACE(to_string(t));
    const ints s{5, 6};
    const ints starts{4, 1};
    const ints ends{0, 6};
    const ints steps{-2, 3};
    ints o;
    (void)slice_ref(doubles(30, 0.0), s, starts, ends, {}, steps, &o);
    const tensor dy = random(t, to_shape(o), 26);
    // The reference: the slice of 0..29 says where each dy element goes.
    doubles positions(30);
    for (std::size_t i = 0; i < 30; ++i) positions[i] = static_cast<double>(i);
    const doubles where = slice_ref(positions, s, starts, ends, {}, steps, &o);
    doubles want(30, 0.0);
    const doubles dv = values(dy);
    for (std::size_t k = 0; k < where.size(); ++k) want[static_cast<std::size_t>(where[k])] = dv[k];
    expect_exact(
        run_op1(
            "strided_slice_grad", {dy},
            {{"starts", starts}, {"ends", ends}, {"steps", steps}, {"input_shape", to_shape(s)}}),
        s, want);
  }
  const tensor dy = random(dtype::f32, {2, 2}, 27);
  expect_invalid(
      [&] {
        run_op1("strided_slice_grad", {dy},
                {{"starts", ints{0}}, {"ends", ints{3}}, {"input_shape", shape{5, 2}}});
      },
      "is not strided_slice's output [3, 2]");
}

// ---- cumsum --------------------------------------------------------------------------------

doubles cumsum_ref(const doubles& v, const ints& s, std::size_t axis, bool exclusive,
                   bool reverse) {
  doubles r(v.size());
  for (std::int64_t f = 0; f < count(s); ++f) {
    const ints i = unravel(f, s);
    double sum = 0.0;
    for (std::int64_t j = 0; j < s[axis]; ++j) {
      const bool before = reverse ? j > i[axis] : j < i[axis];
      if (before || (!exclusive && j == i[axis])) {
        ints k = i;
        k[axis] = j;
        sum += v[static_cast<std::size_t>(ravel(k, s))];
      }
    }
    r[static_cast<std::size_t>(f)] = sum;
  }
  return r;
}

TEST(Cumsum, ExclusiveReverseNegativeAxisForEveryDtype) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64}) {
    for (bool exclusive : {false, true}) {
      for (bool reverse : {false, true}) {
        for (std::int64_t axis : {0, 1, -1}) {
          SCOPED_TRACE(fmt::format("{} exclusive={} reverse={} axis={}", to_string(t), exclusive,
                                   reverse, axis));
          const tensor x = random(t, {3, 4, 5}, 28);
          const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
          expect_close(run_op1("cumsum", {x},
                               {{"axis", axis}, {"exclusive", exclusive}, {"reverse", reverse}}),
                       {3, 4, 5}, cumsum_ref(values(x), {3, 4, 5}, ax, exclusive, reverse),
                       rtol_for(t), 4 * atol_for(t));
        }
      }
    }
  }
  // ONNX's cumsum_1d_exclusive: [1, 2, 3, 4, 5] -> [0, 1, 3, 6, 10].
  expect_exact(run_op1("cumsum", {make(dtype::f64, {5}, {1, 2, 3, 4, 5})}, {{"exclusive", true}}),
               {5}, {0, 1, 3, 6, 10});
  const tensor dense = random(dtype::f64, {4, 3}, 29);
  expect_close(run_op1("cumsum", {non_contiguous(dense)}, {{"axis", 1}}), {4, 3},
               cumsum_ref(values(dense), {4, 3}, 1, false, false), 1e-12, 1e-12);
  expect_exact(run_op1("cumsum", {random(dtype::f32, {0, 3}, 30)}), {0, 3}, {});
  const tensor nan = make(dtype::f32, {3}, {1, std::numeric_limits<double>::quiet_NaN(), 2});
  const doubles got = values(run_op1("cumsum", {nan}));
  EXPECT_EQ(got[0], 1.0);
  EXPECT_TRUE(std::isnan(got[1]) && std::isnan(got[2]));
}

TEST(Cumsum, BadInputsAreConstructionErrors) {
  expect_invalid(
      [&] {
        run_op1("cumsum", {random(dtype::f32, {2, 3}, 31)}, {{"axis", 2}});
      },
      "axis 2 is outside [-2, 2)");
  expect_invalid([&] { run_op1("cumsum", {make(dtype::f32, {}, {1})}); }, "rank >= 1");
  expect_invalid([&] { run_op1("cumsum", {random(dtype::u8, {3}, 32)}); }, "uint8");
}

}  // namespace
}  // namespace loom::testing
