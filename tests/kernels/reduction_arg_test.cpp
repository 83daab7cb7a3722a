// argmin, and argmax's and argmin's keepdims and select_last_index (ONNX ArgMax / ArgMin),
// against a float64 loop written here: every dtype, every axis (negative too), ties (few
// distinct values), NaN, rows along the last axis and columns along the others, strided
// input, and the errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"

namespace loom::testing {
namespace {

using ints = std::vector<std::int64_t>;
using doubles = std::vector<double>;

// The index along `axis` picked in each lane of x (shape s): the smallest (is_min) or largest
// value, a NaN beating any number, ties to the first index or (last) the last one. The output
// shape is s with the axis removed (or 1 with keepdims).
doubles arg_ref(const doubles& x, const ints& s, std::size_t axis, bool is_min, bool last) {
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= s[d];
  for (std::size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const std::int64_t n = s[axis];
  doubles out;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < inner; ++j) {
      const auto at = [&](std::int64_t i) {
        return x[static_cast<std::size_t>((o * n + i) * inner + j)];
      };
      std::int64_t best = -1;
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = at(i);
        if (best < 0) {
          best = i;
          continue;
        }
        const double b = at(best);
        bool take = false;
        if (std::isnan(v) || std::isnan(b)) {
          take = std::isnan(v) && (!std::isnan(b) || last);
        } else if (v == b) {
          take = last;
        } else {
          take = is_min ? v < b : v > b;
        }
        if (take) best = i;
      }
      out.push_back(static_cast<double>(best));
    }
  }
  return out;
}

ints out_shape(const ints& s, std::size_t axis, bool keepdims) {
  ints o;
  for (std::size_t d = 0; d < s.size(); ++d) {
    if (d != axis) {
      o.push_back(s[d]);
    } else if (keepdims) {
      o.push_back(1);
    }
  }
  return o;
}

const std::vector<dtype> arg_types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                   dtype::i32, dtype::i64, dtype::i8,  dtype::u8};

TEST(ArgMinMax, EveryDtypeAxisAndTieRule) {
  const ints s{3, 70, 5};
  for (const dtype t : arg_types) {
    // Few distinct values: ties in most lanes.
    doubles v = values(random(t, shape(s), 7, 0.0, 4.0));
    for (auto& e : v) e = std::floor(e);
    const tensor x = make(t, shape(s), v);
    for (const char* op : {"argmax", "argmin"}) {
      for (const std::int64_t axis : {0, 1, 2, -1, -3}) {
        for (const bool last : {false, true}) {
          for (const bool keepdims : {false, true}) {
            SCOPED_TRACE(fmt::format("{} {} axis {} last {} keepdims {}", op, to_string(t), axis,
                                     last, keepdims));
            const auto ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
            const tensor y = run_op1(
                op, {x}, {{"axis", axis}, {"keepdims", keepdims}, {"select_last_index", last}});
            EXPECT_EQ(y.type(), dtype::i64);
            expect_close(y, shape(out_shape(s, ax, keepdims)),
                         arg_ref(v, s, ax, std::string(op) == "argmin", last), 0.0, 0.0);
          }
        }
      }
    }
  }
}

TEST(ArgMinMax, NanWinsFirstOrLast) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    for (const std::int64_t axis : {0, 1}) {
      const ints s{9, 40};
      doubles v = values(random(t, shape(s), 8));
      for (std::size_t i = 3; i < v.size(); i += 7) v[i] = nan;
      const tensor x = make(t, shape(s), v);
      for (const char* op : {"argmax", "argmin"}) {
        for (const bool last : {false, true}) {
          SCOPED_TRACE(fmt::format("{} {} axis {} last {}", op, to_string(t), axis, last));
          const auto ax = static_cast<std::size_t>(axis);
          expect_close(run_op1(op, {x}, {{"axis", axis}, {"select_last_index", last}}),
                       shape(out_shape(s, ax, false)),
                       arg_ref(v, s, ax, std::string(op) == "argmin", last), 0.0, 0.0);
        }
      }
    }
  }
}

TEST(ArgMinMax, Int32OutputAndStridedInput) {
  const tensor dense = random(dtype::f64, {6, 5}, 9);
  const tensor x = non_contiguous(dense);
  const doubles v = values(dense);
  const tensor y = run_op1("argmin", {x}, {{"axis", std::int64_t{0}}, {"output_type", dtype::i32}});
  EXPECT_EQ(y.type(), dtype::i32);
  expect_close(y, {5}, arg_ref(v, {6, 5}, 0, true, false), 0.0, 0.0);
  // The defaults are argmax's of old: last axis, no keepdims, first index.
  const tensor z = run_op1("argmin", {make(dtype::f32, {4}, {2, 1, 3, 1})});
  expect_close(z, {}, {1}, 0.0, 0.0);
  expect_close(run_op1("argmax", {make(dtype::f32, {4}, {3, 1, 3, 1})}, {{"keepdims", true}}), {1},
               {0}, 0.0, 0.0);
}

TEST(ArgMinMax, Errors) {
  const tensor empty = random(dtype::f32, {2, 0}, 10);
  try {
    run_op1("argmin", {empty}, {{"axis", std::int64_t{1}}});
    ADD_FAILURE() << "expected a node_error";
  } catch (const node_error& e) {
    EXPECT_NE(std::string(e.what()).find("argmin of an empty axis (axis 1 of input shape [2, 0])"),
              std::string::npos)
        << e.what();
  }
  expect_invalid_argument(
      [&] {
        run_op1("argmin", {random(dtype::f32, {2, 3}, 11)}, {{"axis", std::int64_t{2}}});
      },
      {"under_test", "axis"});
  expect_invalid_argument(
      [&] {
        run_op1("argmin", {make(dtype::boolean, {2}, {0, 1})});
      },
      {"under_test", "bool"});
}

}  // namespace
}  // namespace loom::testing
