// reshape, transpose, squeeze, expand_dims: values against index-arithmetic references,
// views (shared buffers) versus copies, every dtype, empty / scalar / rank 1..5 /
// non-contiguous inputs, and errors at construction and at run time.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/array_reference.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using namespace array_ref;

// ---- reshape ---------------------------------------------------------------------------

TEST(Reshape, ContiguousInputIsAViewForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {2, 3, 4}, 1);
    const tensor out = run_op1("reshape", {x}, {{"shape", ints{4, -1}}});
    expect_exact(out, {4, 6}, values(x));
    EXPECT_TRUE(out.buf() == x.buf()) << "reshape of a dense tensor must not copy";
    EXPECT_EQ(out.raw_data(), x.raw_data());
    EXPECT_TRUE(out.is_contiguous());
  }
}

TEST(Reshape, InfersTheMinusOneAnywhere) {
  const tensor x = random(dtype::f32, {2, 3, 5}, 2);
  expect_exact(run_op1("reshape", {x}, {{"shape", ints{-1}}}), {30}, values(x));
  expect_exact(run_op1("reshape", {x}, {{"shape", ints{-1, 5}}}), {6, 5}, values(x));
  expect_exact(run_op1("reshape", {x}, {{"shape", ints{3, -1, 1}}}), {3, 10, 1}, values(x));
  expect_exact(run_op1("reshape", {x}, {{"shape", ints{1, 2, 1, 15, 1}}}), {1, 2, 1, 15, 1},
               values(x));
}

TEST(Reshape, ScalarsAndEmpty) {
  const tensor s = make(dtype::i64, {}, {42});
  expect_exact(run_op1("reshape", {s}, {{"shape", ints{1, 1}}}), {1, 1}, {42});
  const tensor one = make(dtype::f64, {1, 1, 1}, {-3.5});
  const tensor back = run_op1("reshape", {one}, {{"shape", ints{}}});
  expect_exact(back, {}, {-3.5});
  EXPECT_TRUE(back.buf() == one.buf());

  const tensor e = random(dtype::f32, {0, 3}, 3);
  expect_exact(run_op1("reshape", {e}, {{"shape", ints{3, 0}}}), {3, 0}, {});
  expect_exact(run_op1("reshape", {e}, {{"shape", ints{-1, 3}}}), {0, 3}, {});
  expect_exact(run_op1("reshape", {e}, {{"shape", ints{2, -1, 3}}}), {2, 0, 3}, {});
}

TEST(Reshape, NonContiguousInputIsCopiedInLogicalOrder) {
  for (dtype t : {dtype::f32, dtype::bf16, dtype::u8, dtype::i64}) {
    SCOPED_TRACE(to_string(t));
    const tensor dense = random(t, {3, 4, 5}, 4);
    const tensor x = non_contiguous(dense);
    ASSERT_FALSE(x.is_contiguous());
    const tensor out = run_op1("reshape", {x}, {{"shape", ints{5, 12}}});
    expect_exact(out, {5, 12}, values(dense));
    EXPECT_FALSE(out.buf() == x.buf());
    EXPECT_TRUE(out.is_contiguous());
  }
  const tensor v = every_other(random(dtype::i32, {7}, 5));
  expect_exact(run_op1("reshape", {v}, {{"shape", ints{7, 1}}}), {7, 1}, values(v));
}

TEST(Reshape, ConstructionErrorsNameTheNode) {
  const tensor x = random(dtype::f32, {2, 3}, 6);
  expect_invalid([&] { run_op1("reshape", {x}, {{"shape", ints{4, 2}}}); }, "cannot reshape");
  expect_invalid([&] { run_op1("reshape", {x}, {{"shape", ints{4, -1}}}); }, "6 elements");
  expect_invalid([&] { run_op1("reshape", {x}, {{"shape", ints{-1, -1}}}); }, "at most one");
  expect_invalid([&] { run_op1("reshape", {x}, {{"shape", ints{-2, 3}}}); }, "below -1");
  expect_invalid([&] { run_op1("reshape", {x}, {}); }, "shape");
  const tensor e = random(dtype::f32, {0, 3}, 7);
  expect_invalid([&] { run_op1("reshape", {e}, {{"shape", ints{0, -1}}}); }, "cannot infer");
}

TEST(Reshape, RunTimeMismatchIsANodeError) {
  const tensor x = random(dtype::f32, {2, 3}, 8);
  expect_node_error(
      [&] {
        run_declared("reshape", {x}, {shape{-1, 3}}, {{"shape", ints{4, -1}}});
      },
      "cannot reshape");
  expect_node_error(
      [&] {
        run_declared("reshape", {x}, {shape{-1, 3}}, {{"shape", ints{5}}});
      },
      "6 elements");
  // With unknown dims the kernel resolves -1 from the real count.
  const auto out = run_declared("reshape", {x}, {shape{-1, -1}}, {{"shape", ints{-1, 2}}});
  expect_exact(out.at(0), {3, 2}, values(x));
}

// ---- transpose -------------------------------------------------------------------------

std::vector<ints> permutations(std::size_t rank) {
  ints p(rank);
  std::iota(p.begin(), p.end(), 0);
  std::vector<ints> all;
  do all.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  return all;
}

void check_transpose(const tensor& x, const ints& perm) {
  const ints s = x.shape().to_vector();
  ints expected_shape;
  const doubles expected = transpose(values(x), s, perm, &expected_shape);
  const tensor out = run_op1("transpose", {x}, {{"perm", perm}});
  SCOPED_TRACE(::testing::Message() << x.describe() << " perm " << to_string(shape(perm)));
  expect_exact(out, expected_shape, expected);
  EXPECT_TRUE(out.is_contiguous());
}

TEST(Transpose, TwoDimsAcrossTileBoundariesForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    for (const ints& s : {ints{1, 1}, ints{3, 5}, ints{32, 32}, ints{33, 65}, ints{67, 131},
                          ints{1, 70}, ints{129, 2}}) {
      check_transpose(random(t, to_shape(s), 10 + static_cast<std::uint64_t>(s[0])), {1, 0});
    }
  }
}

TEST(Transpose, EveryPermutationOfRanks3And4) {
  for (const ints& s : {ints{2, 3, 4}, ints{5, 1, 7}, ints{33, 3, 40}}) {
    for (const auto& p : permutations(3)) check_transpose(random(dtype::f32, to_shape(s), 11), p);
  }
  for (const auto& p : permutations(4)) {
    check_transpose(random(dtype::i32, {2, 3, 4, 5}, 12), p);
    check_transpose(random(dtype::f16, {17, 3, 1, 35}, 13), p);
  }
}

TEST(Transpose, RankFiveAndDefaultReverse) {
  std::mt19937_64 rng(14);
  const tensor x = random(dtype::f64, {2, 3, 4, 5, 6}, 15);
  for (int i = 0; i < 20; ++i) {
    ints p{0, 1, 2, 3, 4};
    std::shuffle(p.begin(), p.end(), rng);
    check_transpose(x, p);
  }
  // perm [] reverses the dimensions.
  ints expected_shape;
  const doubles expected = transpose(values(x), {2, 3, 4, 5, 6}, {4, 3, 2, 1, 0}, &expected_shape);
  expect_exact(run_op1("transpose", {x}), expected_shape, expected);
  const tensor m = random(dtype::u8, {3, 7}, 16);
  expect_exact(run_op1("transpose", {m}), {7, 3}, transpose(values(m), {3, 7}, {1, 0}, nullptr));
}

TEST(Transpose, ScalarsRankOneEmptyAndIdentityAreViews) {
  const tensor s = make(dtype::f32, {}, {2.5});
  const tensor st = run_op1("transpose", {s});
  expect_exact(st, {}, {2.5});
  EXPECT_TRUE(st.buf() == s.buf());
  const tensor v = random(dtype::i8, {9}, 17);
  const tensor vt = run_op1("transpose", {v}, {{"perm", ints{0}}});
  expect_exact(vt, {9}, values(v));
  EXPECT_TRUE(vt.buf() == v.buf());
  // Moving only dimensions of size 1 keeps the data dense: a view.
  const tensor x = random(dtype::f32, {1, 4, 1, 3}, 18);
  const tensor xt = run_op1("transpose", {x}, {{"perm", ints{2, 1, 0, 3}}});
  expect_exact(xt, {1, 4, 1, 3}, values(x));
  EXPECT_TRUE(xt.buf() == x.buf());
  // Empty.
  const tensor e = random(dtype::f32, {0, 5, 2}, 19);
  expect_exact(run_op1("transpose", {e}, {{"perm", ints{2, 0, 1}}}), {2, 0, 5}, {});
  // A real transpose is a copy.
  const tensor m = random(dtype::f32, {4, 6}, 20);
  EXPECT_FALSE(run_op1("transpose", {m}).buf() == m.buf());
}

TEST(Transpose, NonContiguousAndBroadcastInputs) {
  for (dtype t : {dtype::f32, dtype::f16, dtype::i64, dtype::boolean}) {
    SCOPED_TRACE(to_string(t));
    const tensor x = non_contiguous(random(t, {3, 4, 5}, 21));
    for (const auto& p : permutations(3)) check_transpose(x, p);
  }
  // non_contiguous stores the last two dims swapped: transposing them back is a view.
  const tensor x = non_contiguous(random(dtype::f32, {6, 8}, 22));
  const tensor back = run_op1("transpose", {x});
  expect_exact(back, {8, 6}, transpose(values(x), {6, 8}, {1, 0}, nullptr));
  EXPECT_TRUE(back.buf() == x.buf());
  // Stride-0 source dimensions.
  const tensor row = random(dtype::i32, {1, 5}, 23);
  check_transpose(broadcast_view(row, {4, 5}), {1, 0});
  check_transpose(every_other(random(dtype::f32, {11}, 24), 3), {0});
}

TEST(Transpose, LargeEnoughToRunOnSeveralThreads) {
  for (dtype t : {dtype::f32, dtype::u8, dtype::f64}) {
    SCOPED_TRACE(to_string(t));
    check_transpose(random(t, {300, 517}, 25), {1, 0});
    check_transpose(random(t, {3, 200, 301}, 26), {0, 2, 1});
    check_transpose(random(t, {40, 50, 60}, 27), {2, 1, 0});
    check_transpose(random(t, {40, 50, 60}, 28), {1, 0, 2});
  }
}

TEST(Transpose, Errors) {
  const tensor x = random(dtype::f32, {2, 3, 4}, 29);
  expect_invalid(
      [&] {
        run_op1("transpose", {x}, {{"perm", ints{0, 0, 1}}});
      },
      "not a permutation");
  expect_invalid(
      [&] {
        run_op1("transpose", {x}, {{"perm", ints{0, 1, 3}}});
      },
      "not a permutation");
  expect_invalid([&] { run_op1("transpose", {x}, {{"perm", ints{1, 0}}}); }, "rank-3");
  // Inference saw rank 2; the kernel gets rank 3.
  expect_node_error(
      [&] {
        run_declared("transpose", {x}, {shape{-1, -1}}, {{"perm", ints{1, 0}}});
      },
      "rank-3");
}

// ---- squeeze / expand_dims -------------------------------------------------------------

TEST(Squeeze, DropsSizeOneDimsAsAView) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {1, 3, 1, 4, 1}, 30);
    const tensor all = run_op1("squeeze", {x});
    expect_exact(all, {3, 4}, values(x));
    EXPECT_TRUE(all.buf() == x.buf());
    expect_exact(run_op1("squeeze", {x}, {{"axes", ints{0, -1}}}), {3, 1, 4}, values(x));
    expect_exact(run_op1("squeeze", {x}, {{"axes", ints{2}}}), {1, 3, 4, 1}, values(x));
  }
  const tensor s = make(dtype::f32, {1, 1}, {7});
  expect_exact(run_op1("squeeze", {s}), {}, {7});
  const tensor e = random(dtype::f32, {0, 1, 2}, 31);
  expect_exact(run_op1("squeeze", {e}), {0, 2}, {});
  const tensor none = random(dtype::f32, {2, 3}, 32);
  expect_exact(run_op1("squeeze", {none}), {2, 3}, values(none));
}

TEST(Squeeze, NonContiguousInputStaysAView) {
  const tensor dense = random(dtype::f64, {2, 1, 3, 4}, 33);
  const tensor x = non_contiguous(dense);
  const tensor out = run_op1("squeeze", {x});
  EXPECT_TRUE(out.buf() == x.buf());
  EXPECT_FALSE(out.is_contiguous());
  expect_exact(out, {2, 3, 4}, values(dense));
}

TEST(Squeeze, Errors) {
  const tensor x = random(dtype::f32, {1, 3}, 34);
  expect_invalid([&] { run_op1("squeeze", {x}, {{"axes", ints{1}}}); }, "not 1");
  expect_invalid([&] { run_op1("squeeze", {x}, {{"axes", ints{2}}}); }, "axis");
  expect_node_error(
      [&] {
        run_declared("squeeze", {x}, {shape{-1, -1}}, {{"axes", ints{1}}});
      },
      "not 1");
  // Unknown dims with no axes: inference leaves the rank open, the kernel decides.
  const auto out = run_declared("squeeze", {x}, {shape{-1, -1}});
  expect_exact(out.at(0), {3}, values(x));
}

TEST(ExpandDims, InsertsAUnitDimensionAsAView) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {2, 3}, 35);
    for (const auto& [axis, s] : std::vector<std::pair<std::int64_t, ints>>{
             {0, {1, 2, 3}}, {1, {2, 1, 3}}, {2, {2, 3, 1}}, {-1, {2, 3, 1}}, {-3, {1, 2, 3}}}) {
      const tensor out = run_op1("expand_dims", {x}, {{"axis", axis}});
      expect_exact(out, s, values(x));
      EXPECT_TRUE(out.buf() == x.buf());
      EXPECT_TRUE(out.is_contiguous());
    }
  }
  const tensor s = make(dtype::i32, {}, {5});
  expect_exact(run_op1("expand_dims", {s}, {{"axis", 0}}), {1}, {5});
  const tensor e = random(dtype::f32, {0, 2}, 36);
  expect_exact(run_op1("expand_dims", {e}, {{"axis", 1}}), {0, 1, 2}, {});
  const tensor dense = random(dtype::bf16, {3, 4}, 37);
  const tensor nc = run_op1("expand_dims", {non_contiguous(dense)}, {{"axis", 1}});
  expect_exact(nc, {3, 1, 4}, values(dense));
}

TEST(ExpandDims, Errors) {
  const tensor x = random(dtype::f32, {2, 3}, 38);
  expect_invalid([&] { run_op1("expand_dims", {x}, {{"axis", 3}}); }, "outside");
  expect_invalid([&] { run_op1("expand_dims", {x}, {{"axis", -4}}); }, "outside");
  expect_invalid([&] { run_op1("expand_dims", {x}); }, "axis");
}

// ---- builders --------------------------------------------------------------------------

TEST(ArrayShapeBuilders, InferOutputTypes) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f16, {-1, 6});
  auto r = ops::reshape(x, {-1, 2, 3}, {.name = "r"});
  EXPECT_EQ(to_string(r.type()), to_string(tensor_type{dtype::f16, shape{-1, 2, 3}}));
  auto t = ops::transpose(r, {2, 0, 1});
  EXPECT_EQ(to_string(*t.type().shape), "[3, ?, 2]");
  auto t2 = ops::transpose(t);
  EXPECT_EQ(to_string(*t2.type().shape), "[2, ?, 3]");
  auto e = ops::expand_dims(t2, -1);
  EXPECT_EQ(to_string(*e.type().shape), "[2, ?, 3, 1]");
  auto sq = ops::squeeze(e, {3});
  EXPECT_EQ(to_string(*sq.type().shape), "[2, ?, 3]");
  // squeeze of unknown dims without axes: the rank is unknown.
  EXPECT_FALSE(ops::squeeze(e).type().shape.has_value());
  auto y = ops::placeholder(b, "y", dtype::i8, {4, 6});
  EXPECT_EQ(to_string(*ops::reshape(y, {3, -1}).type().shape), "[3, 8]");
  EXPECT_EQ(ops::reshape(y, {3, -1}).dtype_of(), dtype::i8);
  EXPECT_THROW(ops::reshape(y, {5, -1}), invalid_argument);
  EXPECT_THROW(ops::transpose(y, {0}), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
