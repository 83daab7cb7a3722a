// topk, gather_elements, scatter_elements, gather_nd, scatter_nd (and the builders sort and
// stack) on the CPU against index-arithmetic references written here and ONNX's own
// examples: every dtype, both index dtypes, negative indices and axes, duplicates, empty
// tensors, non-contiguous inputs, and out-of-range indices failing with their position.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "kernels/array_reference.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using namespace array_ref;

std::int64_t wrap(std::int64_t v, std::int64_t n) {
  return v < 0 ? v + n : v;
}

// ---- topk ----------------------------------------------------------------------------------

// Per lane along `axis`: the positions in order (largest first, or smallest), NaN above every
// number, ties by position; the first k.
void topk_ref(const doubles& x, const ints& s, std::size_t axis, std::int64_t k, bool largest,
              doubles* vals, doubles* idx) {
  ints o = s;
  o[axis] = k;
  vals->assign(static_cast<std::size_t>(count(o)), 0.0);
  idx->assign(static_cast<std::size_t>(count(o)), 0.0);
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints p = unravel(f, o);
    const std::int64_t j = p[axis];
    ints order(static_cast<std::size_t>(s[axis]));
    std::iota(order.begin(), order.end(), 0);
    const auto at = [&](std::int64_t i) {
      ints q = p;
      q[axis] = i;
      return x[static_cast<std::size_t>(ravel(q, s))];
    };
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const double va = at(a);
      const double vb = at(b);
      // NaN sorts above +inf; two NaNs tie.
      if (std::isnan(va) || std::isnan(vb)) {
        return largest ? (std::isnan(va) && !std::isnan(vb)) : (!std::isnan(va) && std::isnan(vb));
      }
      return largest ? va > vb : va < vb;
    });
    const std::int64_t src = order[static_cast<std::size_t>(j)];
    (*vals)[static_cast<std::size_t>(f)] = at(src);
    (*idx)[static_cast<std::size_t>(f)] = static_cast<double>(src);
  }
}

TEST(Topk, EveryDtypeAxisAndDirectionWithTies) {
  const ints s{4, 9, 3};
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                  dtype::i8, dtype::u8}) {
    doubles v = values(random(t, to_shape(s), 3, 0.0, 5.0));
    for (auto& e : v) e = std::floor(e);  // ties
    const tensor x = make(t, to_shape(s), v);
    for (const std::int64_t axis : {0, 1, -1}) {
      for (const bool largest : {true, false}) {
        const auto ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
        for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, s[ax]}) {
          SCOPED_TRACE(fmt::format("{} axis {} k {} largest {}", to_string(t), axis, k, largest));
          const auto out = run_op("topk", {x}, {{"k", k}, {"axis", axis}, {"largest", largest}});
          doubles vals;
          doubles idx;
          topk_ref(v, s, ax, k, largest, &vals, &idx);
          ints o = s;
          o[ax] = k;
          expect_exact(out[0], o, vals);
          EXPECT_EQ(out[1].type(), dtype::i64);
          expect_exact(out[1], o, idx);
        }
      }
    }
  }
}

TEST(Topk, OnnxExamplesNanAndNonContiguous) {
  // ONNX's top_k: [[0..3], [4..7], [8..11]], k 3 -> [[3, 2, 1], ...] and indices [[3, 2, 1], ...].
  doubles v(12);
  std::iota(v.begin(), v.end(), 0.0);
  const auto out = run_op("topk", {make(dtype::f32, {3, 4}, v)}, {{"k", std::int64_t{3}}});
  expect_exact(out[0], {3, 3}, {3, 2, 1, 7, 6, 5, 11, 10, 9});
  expect_exact(out[1], {3, 3}, {3, 2, 1, 3, 2, 1, 3, 2, 1});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const tensor x = make(dtype::f64, {5}, {1, nan, 3, nan, -1});
  const auto big = run_op("topk", {x}, {{"k", std::int64_t{3}}});
  expect_exact(big[1], {3}, {1, 3, 2});
  const auto small = run_op("topk", {x}, {{"k", std::int64_t{3}}, {"largest", false}});
  expect_exact(small[1], {3}, {4, 0, 2});
  const tensor dense = random(dtype::f32, {5, 6}, 4);
  const auto nc =
      run_op("topk", {non_contiguous(dense)}, {{"k", std::int64_t{2}}, {"axis", std::int64_t{0}}});
  doubles vals;
  doubles idx;
  topk_ref(values(dense), {5, 6}, 0, 2, true, &vals, &idx);
  expect_exact(nc[0], {2, 6}, vals);
  expect_exact(nc[1], {2, 6}, idx);
  const auto empty = run_op("topk", {random(dtype::f32, {0, 4}, 5)}, {{"k", std::int64_t{2}}});
  expect_exact(empty[0], {0, 2}, {});
}

TEST(Topk, BadKAndDtype) {
  const tensor x = random(dtype::f32, {3, 4}, 6);
  expect_invalid([&] { run_op("topk", {x}, {{"k", std::int64_t{5}}}); }, "k 5 is outside [0, 4]");
  expect_invalid([&] { run_op("topk", {x}, {{"k", std::int64_t{-1}}}); }, "k -1 is outside");
  expect_invalid(
      [&] {
        run_op("topk", {make(dtype::boolean, {2}, {0, 1})}, {{"k", std::int64_t{1}}});
      },
      "bool");
}

// ---- gather_elements, scatter_elements -----------------------------------------------------

doubles gather_elements_ref(const doubles& d, const ints& ds, const ints& idx, const ints& is,
                            std::size_t axis) {
  doubles out(idx.size());
  for (std::int64_t f = 0; f < count(is); ++f) {
    ints p = unravel(f, is);
    p[axis] = wrap(idx[static_cast<std::size_t>(f)], ds[axis]);
    out[static_cast<std::size_t>(f)] = d[static_cast<std::size_t>(ravel(p, ds))];
  }
  return out;
}

doubles scatter_elements_ref(doubles d, const ints& ds, const ints& idx, const ints& is,
                             const doubles& u, std::size_t axis, const std::string& r) {
  for (std::int64_t f = 0; f < count(is); ++f) {
    ints p = unravel(f, is);
    p[axis] = wrap(idx[static_cast<std::size_t>(f)], ds[axis]);
    double& e = d[static_cast<std::size_t>(ravel(p, ds))];
    const double v = u[static_cast<std::size_t>(f)];
    e = r == "none" ? v : r == "add" ? e + v : e * v;
  }
  return d;
}

TEST(GatherElements, OnnxExamplesAndEveryDtype) {
  // ONNX's gather_elements_0 and gather_elements_negative_indices.
  expect_exact(run_op1("gather_elements",
                       {make(dtype::f32, {2, 2}, {1, 2, 3, 4}),
                        index_tensor(dtype::i64, {2, 2}, {0, 0, 1, 0})},
                       {{"axis", std::int64_t{1}}}),
               {2, 2}, {1, 1, 4, 3});
  expect_exact(run_op1("gather_elements",
                       {make(dtype::f32, {3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}),
                        index_tensor(dtype::i32, {2, 3}, {-1, -2, 0, -2, 0, 0})},
                       {{"axis", std::int64_t{0}}}),
               {2, 3}, {7, 5, 3, 4, 2, 3});
  const ints ds{4, 5, 3};
  const ints is{4, 7, 2};
  ints idx(static_cast<std::size_t>(count(is)));
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i * 7 % 10) - 5;
  for (dtype t : all_dtypes()) {
    for (dtype it : {dtype::i32, dtype::i64}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(t), to_string(it)));
      const tensor d = random(t, to_shape(ds), 7);
      expect_exact(
          run_op1("gather_elements", {d, index_tensor(it, is, idx)}, {{"axis", std::int64_t{-2}}}),
          is, gather_elements_ref(values(d), ds, idx, is, 1));
    }
  }
  const tensor dense = random(dtype::f64, {3, 4}, 8);
  expect_exact(
      run_op1("gather_elements",
              {non_contiguous(dense), index_tensor(dtype::i64, {3, 2}, {3, 0, 1, 1, -4, 2})},
              {{"axis", std::int64_t{1}}}),
      {3, 2}, gather_elements_ref(values(dense), {3, 4}, {3, 0, 1, 1, -4, 2}, {3, 2}, 1));
  expect_exact(run_op1("gather_elements", {dense, index_tensor(dtype::i64, {0, 4}, {})}), {0, 4},
               {});
}

TEST(GatherElements, Errors) {
  const tensor d = random(dtype::f32, {3, 4}, 9);
  expect_node_error(
      [&] {
        run_op1("gather_elements", {d, index_tensor(dtype::i64, {1, 2}, {0, 4})},
                {{"axis", std::int64_t{1}}});
      },
      "indices[0, 1] = 4 is out of range [-4, 4)");
  expect_node_error(
      [&] {
        run_op1("gather_elements", {d, index_tensor(dtype::i32, {1, 1}, {-5})},
                {{"axis", std::int64_t{1}}});
      },
      "= -5 is out of range");
  expect_invalid(
      [&] {
        run_op1("gather_elements", {d, index_tensor(dtype::i64, {3}, {0, 0, 0})});
      },
      "must have the rank of data");
  expect_invalid(
      [&] {
        run_op1("gather_elements", {d, index_tensor(dtype::i64, {3, 5}, ints(15, 0))},
                {{"axis", std::int64_t{0}}});
      },
      "larger than data");
  expect_invalid(
      [&] {
        run_op1("gather_elements", {d, make(dtype::f32, {3, 4}, doubles(12, 0))});
      },
      "Tindices");
}

TEST(ScatterElements, OnnxExamplesReductionsAndEveryDtype) {
  // ONNX's scatter_elements_with_axis, _with_negative_indices, _with_duplicate_indices (add),
  // _with_reduction_max's sibling mul.
  const tensor d = make(dtype::f32, {1, 5}, {1, 2, 3, 4, 5});
  const tensor u = make(dtype::f32, {1, 2}, {1.1, 2.1});
  expect_close(run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {1, 3}), u},
                       {{"axis", std::int64_t{1}}}),
               {1, 5}, {1, 1.1, 3, 2.1, 5});
  expect_close(run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {1, -3}), u},
                       {{"axis", std::int64_t{1}}}),
               {1, 5}, {1, 1.1, 2.1, 4, 5});
  expect_close(run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {1, 1}), u},
                       {{"axis", std::int64_t{1}}, {"reduction", std::string("add")}}),
               {1, 5}, {1, 5.2, 3, 4, 5});
  expect_close(run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {1, 1}), u},
                       {{"axis", std::int64_t{1}}, {"reduction", std::string("mul")}}),
               {1, 5}, {1, 2 * 1.1 * 2.1, 3, 4, 5});
  const ints ds{5, 4};
  const ints is{3, 4};
  const ints idx{0, -1, 2, 4, 1, 1, -5, 3, 4, 0, 2, 2};  // duplicates in column 2
  for (dtype t : all_dtypes()) {
    for (const std::string r : {"none", "add", "mul"}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(t), r));
      const tensor data = random(t, to_shape(ds), 10, 0.0, 3.0);
      const tensor up = random(t, to_shape(is), 11, 0.0, 3.0);
      doubles want = scatter_elements_ref(values(data), ds, idx, is, values(up), 0, r);
      if (t == dtype::boolean) {
        for (auto& w : want) w = w != 0.0 ? 1.0 : 0.0;
      }
      expect_close(run_op1("scatter_elements", {data, index_tensor(dtype::i32, is, idx), up},
                           {{"axis", std::int64_t{0}}, {"reduction", r}}),
                   to_shape(ds), want, rtol_for(t), atol_for(t));
    }
  }
}

TEST(ScatterElements, Errors) {
  const tensor d = random(dtype::f32, {3, 4}, 12);
  const tensor u = random(dtype::f32, {1, 2}, 13);
  expect_node_error(
      [&] {
        run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {0, 3}), u});
      },
      "indices[0, 1] = 3 is out of range [-3, 3)");
  expect_invalid(
      [&] {
        run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 3}, {0, 0, 0}), u});
      },
      "must have the shape of indices");
  expect_invalid(
      [&] {
        run_op1("scatter_elements", {d, index_tensor(dtype::i64, {1, 2}, {0, 0}), u},
                {{"reduction", std::string("max")}});
      },
      "not one of none, add, mul");
}

// ---- gather_nd, scatter_nd -----------------------------------------------------------------

// data [B..., D..., S...], indices [B..., M..., q] with b batch dims.
doubles gather_nd_ref(const doubles& d, const ints& ds, const ints& idx, const ints& is,
                      std::size_t b, ints* out_shape) {
  const auto q = static_cast<std::size_t>(is.back());
  ints o(is.begin(), is.end() - 1);
  for (std::size_t k = b + q; k < ds.size(); ++k) o.push_back(ds[k]);
  doubles out(static_cast<std::size_t>(count(o)));
  const std::size_t m = is.size() - 1;  // dims of o before the slice
  for (std::int64_t f = 0; f < count(o); ++f) {
    const ints p = unravel(f, o);
    ints tuple_pos(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(m));
    ints src(ds.size());
    for (std::size_t k = 0; k < b; ++k) src[k] = p[k];
    for (std::size_t k = 0; k < q; ++k) {
      ints ip = tuple_pos;
      ip.push_back(static_cast<std::int64_t>(k));
      src[b + k] = wrap(idx[static_cast<std::size_t>(ravel(ip, is))], ds[b + k]);
    }
    for (std::size_t k = b + q; k < ds.size(); ++k) src[k] = p[m + k - b - q];
    out[static_cast<std::size_t>(f)] = d[static_cast<std::size_t>(ravel(src, ds))];
  }
  *out_shape = o;
  return out;
}

TEST(GatherNd, OnnxExamplesAndEveryDtype) {
  // ONNX's gathernd_example_int32, _float32 and _int32_batch_dim1.
  expect_exact(run_op1("gather_nd", {make(dtype::i32, {2, 2}, {0, 1, 2, 3}),
                                     index_tensor(dtype::i64, {2, 2}, {0, 0, 1, 1})}),
               {2}, {0, 3});
  doubles eight(8);
  std::iota(eight.begin(), eight.end(), 0.0);
  expect_exact(run_op1("gather_nd", {make(dtype::f32, {2, 2, 2}, eight),
                                     index_tensor(dtype::i64, {2, 1, 2}, {0, 1, 1, 0})}),
               {2, 1, 2}, {2, 3, 4, 5});
  expect_exact(
      run_op1("gather_nd",
              {make(dtype::i32, {2, 2, 2}, eight), index_tensor(dtype::i64, {2, 1}, {1, 0})},
              {{"batch_dims", std::int64_t{1}}}),
      {2, 2}, {2, 3, 4, 5});
  struct nd_case {
    ints ds;
    ints is;
    std::size_t b;
  };
  for (const nd_case& c : {nd_case{{4, 3, 5}, {6, 2}, 0}, nd_case{{4, 3, 5}, {2, 3, 3}, 0},
                           nd_case{{4, 3, 5}, {4, 2, 1}, 1}, nd_case{{4, 3, 5}, {4, 3, 1}, 2},
                           nd_case{{4, 3}, {2, 0}, 0}}) {
    ints idx(static_cast<std::size_t>(count(c.is)));
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i * 5 % 6) - 3;
    for (dtype t : all_dtypes()) {
      for (dtype it : {dtype::i32, dtype::i64}) {
        SCOPED_TRACE(fmt::format("{} {} data [{}] indices [{}] b {}", to_string(t), to_string(it),
                                 fmt::join(c.ds, ", "), fmt::join(c.is, ", "), c.b));
        const tensor d = random(t, to_shape(c.ds), 14);
        ints o;
        const doubles want = gather_nd_ref(values(d), c.ds, idx, c.is, c.b, &o);
        expect_exact(run_op1("gather_nd", {d, index_tensor(it, c.is, idx)},
                             {{"batch_dims", static_cast<std::int64_t>(c.b)}}),
                     o, want);
      }
    }
  }
}

TEST(GatherNd, Errors) {
  const tensor d = random(dtype::f32, {3, 4}, 15);
  expect_node_error(
      [&] {
        run_op1("gather_nd", {d, index_tensor(dtype::i64, {2, 2}, {0, 0, 2, 4})});
      },
      "indices[1, 1] = 4 is out of range [-4, 4)");
  expect_invalid(
      [&] {
        run_op1("gather_nd", {d, index_tensor(dtype::i64, {1, 3}, {0, 0, 0})});
      },
      "must be at most the rank of data");
  expect_invalid(
      [&] {
        run_op1("gather_nd", {d, index_tensor(dtype::i64, {2, 1}, {0, 0})},
                {{"batch_dims", std::int64_t{1}}});
      },
      "differ in batch dimension 0");
}

TEST(ScatterNd, OnnxExampleReductionsAndEveryDtype) {
  // ONNX's scatternd: data 4x4x4, indices [[0], [2]], two 4x4 updates.
  doubles d(64);
  const doubles block{1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1};
  for (std::size_t i = 0; i < 64; ++i) d[i] = block[i % 16];
  doubles u(32);
  for (std::size_t i = 0; i < 32; ++i)
    u[i] = i < 16 ? 5.0 + static_cast<double>(i / 4) : 1.0 + static_cast<double>((i - 16) / 4);
  doubles want = d;
  for (std::size_t i = 0; i < 16; ++i) {
    want[i] = u[i];
    want[32 + i] = u[16 + i];
  }
  expect_exact(run_op1("scatter_nd",
                       {make(dtype::f32, {4, 4, 4}, d), index_tensor(dtype::i64, {2, 1}, {0, 2}),
                        make(dtype::f32, {2, 4, 4}, u)}),
               {4, 4, 4}, want);
  // Element updates with duplicates, each reduction, every dtype.
  const ints ds{3, 4};
  const ints is{5, 2};
  const ints idx{0, 1, 2, -1, 0, 1, -3, 0, 1, 2};
  for (dtype t : all_dtypes()) {
    for (const std::string r : {"none", "add", "mul"}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(t), r));
      const tensor data = random(t, to_shape(ds), 16, 0.0, 3.0);
      const tensor up = random(t, {5}, 17, 0.0, 3.0);
      doubles w = values(data);
      const doubles uv = values(up);
      for (std::size_t k = 0; k < 5; ++k) {
        const std::int64_t at = wrap(idx[2 * k], 3) * 4 + wrap(idx[2 * k + 1], 4);
        double& e = w[static_cast<std::size_t>(at)];
        e = r == "none" ? uv[k] : r == "add" ? e + uv[k] : e * uv[k];
        if (t == dtype::boolean) e = e != 0.0 ? 1.0 : 0.0;
      }
      expect_close(
          run_op1("scatter_nd", {data, index_tensor(dtype::i32, is, idx), up}, {{"reduction", r}}),
          to_shape(ds), w, rtol_for(t), atol_for(t));
    }
  }
}

TEST(ScatterNd, Errors) {
  const tensor d = random(dtype::f32, {3, 4}, 18);
  expect_node_error(
      [&] {
        run_op1("scatter_nd",
                {d, index_tensor(dtype::i64, {1, 1}, {3}), random(dtype::f32, {1, 4}, 19)});
      },
      "indices[0, 0] = 3 is out of range [-3, 3)");
  expect_invalid(
      [&] {
        run_op1("scatter_nd",
                {d, index_tensor(dtype::i64, {1, 1}, {0}), random(dtype::f32, {1, 3}, 20)});
      },
      "must have the shape [1, 4]");
}

TEST(ArraySelectBuilders, InferOutputTypes) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f32, shape{2, 3, 1});
  const output s = ops::placeholder(b, "s", dtype::i64, shape{4});
  const output idx = ops::placeholder(b, "i", dtype::i32, shape{5, 2});
  const auto type_of = [](const output& o) { return to_string(o.type()); };
  EXPECT_EQ(type_of(ops::shape_of(x)), "int64[3]");
  EXPECT_EQ(type_of(ops::dynamic_reshape(x, s)), "float32[?, ?, ?, ?]");
  EXPECT_EQ(type_of(ops::expand(x, s)), "float32[?, 2, 3, ?]");
  EXPECT_EQ(type_of(ops::constant_of_shape(s, dtype::i32, 1.0)), "int32[?, ?, ?, ?]");
  EXPECT_EQ(type_of(ops::tile(x, {2, 1, 4})), "float32[4, 3, 4]");
  EXPECT_EQ(type_of(ops::strided_slice(x, {-1}, {0}, {1}, {-1})), "float32[2, 2, 1]");
  EXPECT_EQ(type_of(ops::cumsum(x, -2)), "float32[2, 3, 1]");
  const auto tk = ops::topk(x, 2, 1);
  EXPECT_EQ(type_of(tk[0]), "float32[2, 2, 1]");
  EXPECT_EQ(type_of(tk[1]), "int64[2, 2, 1]");
  const output data = ops::placeholder(b, "d", dtype::f64, shape{4, 6, 7});
  EXPECT_EQ(type_of(ops::gather_nd(data, idx)), "float64[5, 7]");
  EXPECT_EQ(
      type_of(ops::gather_elements(x, ops::placeholder(b, "j", dtype::i64, shape{2, 2, 1}), 1)),
      "float32[2, 2, 1]");
  EXPECT_EQ(type_of(ops::argmin(x, 1, dtype::i32, true)), "int32[2, 1, 1]");
  EXPECT_THROW((void)ops::dynamic_reshape(x, idx), invalid_argument);  // not int64
  EXPECT_THROW((void)ops::sort(ops::placeholder(b, "u", dtype::f32, shape{-1}), 0),
               invalid_argument);
}

// ---- sort and stack (builders) -------------------------------------------------------------

TEST(SortAndStack, BuildersRunThroughASession) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f32, shape{2, 3});
  const auto sorted = ops::sort(x, -1, false);
  const output st = ops::stack({x, ops::neg(x)}, -1);
  const output st0 = ops::stack({x, x, x}, 0);
  ASSERT_TRUE(st.type().shape.has_value());
  EXPECT_EQ(*st.type().shape, shape({2, 3, 2}));
  EXPECT_EQ(*st0.type().shape, shape({3, 2, 3}));
  const std::vector<std::string> fetches{sorted[0].name(), sorted[1].name(), st.name(), st0.name()};
  session s(std::move(g));
  const doubles xv{3, 1, 2, -1, -1, 0};
  const auto out = s.run({{"x", make(dtype::f32, {2, 3}, xv)}}, fetches);
  expect_exact(out[0], {2, 3}, {1, 2, 3, -1, -1, 0});
  expect_exact(out[1], {2, 3}, {1, 2, 0, 0, 1, 2});  // stable: the first -1 first
  expect_exact(out[2], {2, 3, 2}, {3, -3, 1, -1, 2, -2, -1, 1, -1, 1, 0, -0.0});
  doubles three;
  for (int k = 0; k < 3; ++k) three.insert(three.end(), xv.begin(), xv.end());
  expect_exact(out[3], {3, 2, 3}, three);
}

}  // namespace
}  // namespace loom::testing
