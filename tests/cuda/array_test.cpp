// The CUDA array kernels (src/backends/cuda/array_kernels.cpp) against the CPU kernels of the
// same nodes: views stay views, copies match for dense, strided, offset and empty inputs of
// every element size, and gather_grad sums in the CPU's order (bit for bit). Without a GPU
// the registry, the argument checks (made before any CUDA call) and the view kernels are
// still tested; the rest skips.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernel_compare.hpp"

namespace loom {
namespace {

using namespace testing::cuda_compare;

const std::vector<dtype> all{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
                             dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
// One dtype of each element size (1, 2, 4, 8 bytes), plus bool: the copies move bits.
const std::vector<dtype> sizes{dtype::u8, dtype::f16, dtype::f32, dtype::f64, dtype::boolean};

std::string label(const std::string& op, dtype t, const std::string& what) {
  return op + " " + to_string(t) + " " + what;
}

tensor indices(dtype t, const shape& s, const std::vector<double>& v) {
  return make(t, s, v);
}

// ---- without a GPU ---------------------------------------------------------------------------

// Every op the CPU array family registers (array_kernels.cpp, array_index_kernels.cpp,
// array_grad_kernels.cpp, and the views every device shares in
// src/kernel/common/neutral_kernels.cpp).
const std::vector<std::string> family_ops{"reshape", "squeeze", "expand_dims", "transpose",
                                          "concat",  "split",   "slice",       "pad",
                                          "gather",  "one_hot", "gather_grad", "broadcast_to"};

const kernel_def* find_def(const std::string& op, device_type d) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == d) return k;
  }
  return nullptr;
}

TEST(CudaArrayRegistry, EveryOpOfTheFamilyHasACudaKernelForTheCpuTypes) {
  for (const auto& op : family_ops) {
    const kernel_def* c = find_def(op, device_type::cpu);
    const kernel_def* g = find_def(op, device_type::cuda);
    ASSERT_NE(c, nullptr) << op << " has no CPU kernel: update this list";
    ASSERT_NE(g, nullptr) << op << " has no CUDA kernel";
    EXPECT_EQ(g->label, "cuda") << op;
    ASSERT_EQ(g->constraints.size(), c->constraints.size()) << op;
    for (std::size_t i = 0; i < c->constraints.size(); ++i) {
      EXPECT_EQ(g->constraints[i].first, c->constraints[i].first) << op;
      const std::set<dtype> want(c->constraints[i].second.begin(), c->constraints[i].second.end());
      const std::set<dtype> got(g->constraints[i].second.begin(), g->constraints[i].second.end());
      EXPECT_EQ(got, want) << op << ": " << g->describe();
    }
  }
}

// The view kernels make no CUDA call: run on the CPU device, the CUDA kernel gives the CPU
// kernel's view of the same buffer.
TEST(CudaArrayViews, ViewKernelsReturnTheCpuKernelsViews) {
  const tensor x = random(dtype::f32, {2, 1, 3}, 1);
  const tensor col = random(dtype::f32, {1, 4}, 2);
  struct view_case {
    std::string op;
    tensor in;
    attr_map attrs;
  };
  const std::vector<view_case> cases{
      {"reshape", x, {{"shape", ints{3, -1}}}},
      {"squeeze", x, {}},
      {"squeeze", x, {{"axes", ints{1}}}},
      {"expand_dims", x, {{"axis", std::int64_t{0}}}},
      {"expand_dims", x, {{"axis", std::int64_t{-1}}}},
      {"expand_dims", transposed_storage(x), {{"axis", std::int64_t{1}}}},
      {"broadcast_to", col, {{"shape", shape{3, 4}}}},
      {"broadcast_to",
       transposed_storage(random(dtype::f32, {3, 1}, 3)),
       {{"shape", shape{2, 3, 5}}}},
      {"transpose", col, {{"perm", ints{1, 0}}}},  // a size-1 dimension: still dense
      {"split", x, {{"num_splits", std::int64_t{2}}, {"axis", std::int64_t{0}}}},
      {"pad", x, {{"paddings", ints{0, 0, 0, 0, 0, 0}}}},
      {"concat", x, {{"axis", std::int64_t{2}}}},
  };
  for (const auto& c : cases) {
    const auto n = op_node::of(c.op, {c.in}, c.attrs);
    const auto want = n.run(reference_cpu(), {c.in});
    const auto got = n.run_cuda_kernel_on_cpu({c.in});
    ASSERT_EQ(got.size(), want.size()) << c.op;
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].buf(), c.in.buf()) << c.op << " made a copy";
      EXPECT_EQ(to_string(got[i].shape()), to_string(want[i].shape())) << c.op;
      EXPECT_EQ(to_string(got[i].strides()), to_string(want[i].strides())) << c.op;
      EXPECT_EQ(got[i].offset(), want[i].offset()) << c.op;
    }
  }
}

// Shapes the node was declared with may differ from what is fed (unknown dimensions, or a
// rank the feed does not have); the kernels check at run time, with the CPU's messages.
TEST(CudaArrayChecks, RunTimeShapeErrorsFailAsOnTheCpu) {
  const tensor x23 = random(dtype::f32, {2, 3}, 1);
  const tensor x33 = random(dtype::f32, {3, 3}, 2);
  const tensor x231 = random(dtype::f32, {2, 3, 1}, 4);
  const tensor x24 = random(dtype::f32, {2, 4}, 5);
  expect_same_failure(op_node("reshape", {{dtype::f32, {-1, 3}}}, {{"shape", ints{4, -1}}}), {x23},
                      "cannot reshape");
  expect_same_failure(op_node("reshape", {{dtype::f32, {-1, 3}}}, {{"shape", ints{5}}}), {x23},
                      "6 elements");
  expect_same_failure(op_node("squeeze", {{dtype::f32, {-1, -1}}}, {{"axes", ints{1}}}), {x23},
                      "not 1");
  expect_same_failure(op_node("transpose", {{dtype::f32, {-1, -1}}}, {{"perm", ints{1, 0}}}),
                      {x231}, "rank-3");
  expect_same_failure(op_node("concat", {{dtype::f32, {-1, -1}}, {dtype::f32, {-1, -1}}},
                              {{"axis", std::int64_t{1}}}),
                      {x23, x33}, "input 1 is float32[3, 3]");
  expect_same_failure(op_node("split", {{dtype::f32, {-1, -1}}},
                              {{"num_splits", std::int64_t{4}}, {"axis", std::int64_t{1}}}),
                      {x23}, "does not split into 4 equal pieces");
  expect_same_failure(
      op_node("split", {{dtype::f32, {-1, -1}}},
              {{"num_splits", std::int64_t{2}}, {"sizes", ints{1, 1}}, {"axis", std::int64_t{1}}}),
      {x23}, "do not add up");
  expect_same_failure(
      op_node("slice", {{dtype::f32, {-1, -1}}}, {{"begin", ints{3, 0}}, {"size", ints{2, 1}}}),
      {x23}, "reaches outside");
  expect_same_failure(op_node("pad", {{dtype::f32, {-1, -1}}}, {{"paddings", ints{1, 1, 1, 1}}}),
                      {x231}, "has 4 entries for the rank-3 input");
  expect_same_failure(op_node("broadcast_to", {{dtype::f32, {-1, -1}}}, {{"shape", shape{4, 3}}}),
                      {x23}, "dimension 0 is 2, not 1 or 4");
  expect_same_failure(op_node("broadcast_to", {{dtype::f32, {-1}}}, {{"shape", shape{3}}}), {x23},
                      "fewer dimensions");
  const tensor idx = indices(dtype::i32, {2}, {0, 1});
  expect_same_failure(op_node("gather_grad", {{dtype::f32, {-1, -1}}, {dtype::i32, {-1}}},
                              {{"params_shape", shape{4, 4}}, {"axis", std::int64_t{0}}}),
                      {x23, idx}, "is not gather's output for params_shape [4, 4]");
  expect_same_failure(op_node("gather_grad", {{dtype::f32, {-1, -1}}, {dtype::i32, {-1}}},
                              {{"params_shape", shape{-1, 4}}, {"axis", std::int64_t{0}}}),
                      {x24, idx}, "leaves the gathered dimension 0 unknown");
}

// ---- on the GPU: copies ----------------------------------------------------------------------

TEST(CudaReshape, ContiguousInputsStayViewsAndStridedOnesAreCopied) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : sizes) {
    const tensor x = random(t, {4, 6}, 10);
    const auto n = op_node::of("reshape", {x}, {{"shape", ints{3, -1}}});
    const tensor on_gpu = to_gpu(x);
    const auto view = n.run(test_gpu(), {on_gpu});
    EXPECT_EQ(view[0].buf(), on_gpu.buf());
    expect_same(to_host(view[0]), n.run(reference_cpu(), {x})[0], {}, label("reshape", t, "view"));
    for (const tensor& s : {transposed_storage(x), spread(x, 3, 1)}) {
      const auto m = op_node::of("reshape", {s}, {{"shape", ints{2, -1, 3}}});
      expect_gpu_matches_cpu(m, {s}, label("reshape", t, "strided"));
    }
  }
}

// Small permutations take the element-wise copy, those with two wide dimensions the tiled
// transpose (Note [cuda tiled transpose]), batched or not, with partial tiles at the edges.
TEST(CudaTranspose, EveryPermutationMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 20;
  const std::vector<std::pair<shape, ints>> cases{{{5, 7}, {}},
                                                  {{33, 65}, {1, 0}},
                                                  {{2, 3, 4}, {2, 0, 1}},
                                                  {{2, 3, 4}, {1, 0, 2}},
                                                  {{2, 3, 4, 5}, {3, 1, 0, 2}},
                                                  {{0, 4}, {1, 0}},
                                                  {{64, 1, 48}, {2, 1, 0}},
                                                  {{4, 40, 24}, {0, 2, 1}},
                                                  {{3, 100, 9}, {2, 0, 1}}};
  for (const dtype t : sizes) {
    for (const auto& [s, perm] : cases) {
      const tensor x = random(t, s, ++seed, -100, 100);
      attr_map attrs;
      if (!perm.empty()) attrs["perm"] = perm;
      expect_gpu_matches_cpu(op_node::of("transpose", {x}, attrs), {x},
                             label("transpose", t, to_string(s)));
      if (s.rank() >= 2 && s.num_elements() > 0) {
        const tensor v = spread(x, 2, 7);
        expect_gpu_matches_cpu(op_node::of("transpose", {v}, attrs), {v},
                               label("transpose", t, to_string(s) + " strided"));
      }
    }
  }
}

TEST(CudaConcat, DenseStridedAndEmptyInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 30;
  for (const dtype t : sizes) {
    const tensor a = random(t, {2, 3, 4}, ++seed, -50, 50);
    const tensor b = random(t, {2, 5, 4}, ++seed, -50, 50);
    const tensor e = random(t, {2, 0, 4}, ++seed, -50, 50);
    const tensor s = transposed_storage(random(t, {2, 2, 4}, ++seed, -50, 50));
    expect_gpu_matches_cpu(op_node::of("concat", {a, b, e, s}, {{"axis", std::int64_t{1}}}),
                           {a, b, e, s}, label("concat", t, "axis 1"));
    const tensor c = random(t, {2, 3, 1}, ++seed, -50, 50);
    const tensor d = spread(random(t, {2, 3, 6}, ++seed, -50, 50), 2, 3);
    expect_gpu_matches_cpu(op_node::of("concat", {a, c, d}, {{"axis", std::int64_t{-1}}}),
                           {a, c, d}, label("concat", t, "last axis"));
    const tensor f = random(t, {1, 3, 4}, ++seed, -50, 50);
    expect_gpu_matches_cpu(op_node::of("concat", {a, f, a}, {{"axis", std::int64_t{0}}}), {a, f, a},
                           label("concat", t, "axis 0"));
    expect_gpu_matches_cpu(op_node::of("concat", {s}, {{"axis", std::int64_t{0}}}), {s},
                           label("concat", t, "one strided input"));
    expect_gpu_matches_cpu(op_node::of("concat", {e, e}, {{"axis", std::int64_t{0}}}), {e, e},
                           label("concat", t, "empty"));
  }
}

TEST(CudaSplit, PiecesMatchTheCpuAndContiguousOnesAreViews) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 40;
  for (const dtype t : sizes) {
    const tensor x = random(t, {6, 10}, ++seed, -50, 50);
    const auto rows = op_node::of("split", {x}, {{"num_splits", std::int64_t{3}}});
    const tensor on_gpu = to_gpu(x);
    const auto pieces = rows.run(test_gpu(), {on_gpu});
    const auto want = rows.run(reference_cpu(), {x});
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      EXPECT_EQ(pieces[k].buf(), on_gpu.buf()) << "row piece " << k << " is a view";
      expect_same(to_host(pieces[k]), want[k], {}, label("split", t, "rows"));
    }
    expect_gpu_matches_cpu(op_node::of("split", {x},
                                       {{"num_splits", std::int64_t{4}},
                                        {"sizes", ints{3, -1, 0, 2}},
                                        {"axis", std::int64_t{1}}}),
                           {x}, label("split", t, "columns by sizes"));
    const tensor s = transposed_storage(x);
    expect_gpu_matches_cpu(
        op_node::of("split", {s}, {{"num_splits", std::int64_t{2}}, {"axis", std::int64_t{0}}}),
        {s}, label("split", t, "strided"));
  }
}

TEST(CudaSlice, SlicesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 50;
  const std::vector<std::pair<ints, ints>> cases{{{0, 0, 0}, {-1, -1, -1}},
                                                 {{1, 2, 3}, {2, 3, 4}},
                                                 {{3, 0, 7}, {1, -1, 1}},
                                                 {{0, 5, 0}, {4, 0, 8}},
                                                 {{2, 1, 1}, {2, 4, -1}}};
  for (const dtype t : sizes) {
    const tensor x = random(t, {4, 5, 8}, ++seed, -50, 50);
    for (const tensor& in : {x, transposed_storage(x), spread(x, 2, 5)}) {
      for (const auto& [begin, size] : cases) {
        expect_gpu_matches_cpu(op_node::of("slice", {in}, {{"begin", begin}, {"size", size}}), {in},
                               label("slice", t, ""));
      }
    }
  }
}

TEST(CudaPad, PaddingsConstantsAndStridesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 60;
  const std::vector<std::pair<shape, ints>> cases{
      {{3, 4}, {1, 2, 0, 3}},   {{5}, {4, 0}},          {{2, 3, 4}, {0, 0, 1, 1, 2, 2}},
      {{0, 3}, {1, 1, 1, 0}},   {{2, 2}, {0, 0, 0, 0}}, {{1, 1, 1, 1}, {1, 0, 0, 1, 1, 0, 0, 1}},
      {{64, 33}, {3, 3, 0, 31}}};
  for (const dtype t : all) {
    for (const auto& [s, paddings] : cases) {
      const tensor x = random(t, s, ++seed, -50, 50);
      for (const double value : {0.0, 2.5, -1.0}) {
        expect_gpu_matches_cpu(
            op_node::of("pad", {x}, {{"paddings", paddings}, {"constant_value", value}}), {x},
            label("pad", t, to_string(s)));
      }
      if (s.rank() >= 2 && s.num_elements() > 0) {
        const tensor v = transposed_storage(x);
        expect_gpu_matches_cpu(op_node::of("pad", {v}, {{"paddings", paddings}}), {v},
                               label("pad", t, to_string(s) + " strided"));
      }
    }
  }
}

TEST(CudaShapeViews, SqueezeExpandDimsAndBroadcastToMatchTheCpuOnTheGpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : sizes) {
    const tensor x = random(t, {3, 1, 4}, 70);
    const tensor on_gpu = to_gpu(x);
    const std::vector<std::pair<std::string, attr_map>> cases{
        {"squeeze", {}},
        {"expand_dims", {{"axis", std::int64_t{1}}}},
        {"broadcast_to", {{"shape", shape{2, 3, 5, 4}}}}};
    for (const auto& [op, attrs] : cases) {
      const auto n = op_node::of(op, {x}, attrs);
      const auto got = n.run(test_gpu(), {on_gpu});
      EXPECT_EQ(got[0].buf(), on_gpu.buf()) << op;
      expect_same(to_host(got[0]), n.run(reference_cpu(), {x})[0], {}, label(op, t, ""));
    }
  }
}

// ---- on the GPU: gather, one_hot, gather_grad ------------------------------------------------

TEST(CudaGather, AxesIndexTypesAndDtypesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 80;
  for (const dtype t : all) {
    const tensor p = random(t, {5, 6, 3}, ++seed, -50, 50);
    for (const dtype it : {dtype::i32, dtype::i64}) {
      const tensor i1 = indices(it, {4}, {4, 0, 4, 2});
      const tensor i2 = indices(it, {2, 3}, {5, 1, 0, 0, 3, 5});
      const tensor i0 = indices(it, {0}, {});
      expect_gpu_matches_cpu(op_node::of("gather", {p, i1}), {p, i1}, label("gather", t, "axis 0"));
      expect_gpu_matches_cpu(op_node::of("gather", {p, i2}, {{"axis", std::int64_t{1}}}), {p, i2},
                             label("gather", t, "axis 1, 2-d indices"));
      const tensor i3 = indices(it, {3}, {2, 0, 1});
      expect_gpu_matches_cpu(op_node::of("gather", {p, i3}, {{"axis", std::int64_t{-1}}}), {p, i3},
                             label("gather", t, "last axis"));
      expect_gpu_matches_cpu(op_node::of("gather", {p, i0}), {p, i0}, label("gather", t, "empty"));
      const tensor s = transposed_storage(p);
      const tensor is = spread(i1, 2, 1);
      expect_gpu_matches_cpu(op_node::of("gather", {s, is}), {s, is},
                             label("gather", t, "strided"));
    }
  }
  // An embedding lookup of realistic size.
  const tensor table = random(dtype::f32, {1000, 64}, ++seed);
  std::vector<double> ids(5000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>((i * 7919) % 1000);
  const tensor idx = indices(dtype::i64, {50, 100}, ids);
  expect_gpu_matches_cpu(op_node::of("gather", {table, idx}), {table, idx}, "embedding lookup");
}

// Note [cuda value checks]: the GPU does not stop for an index out of range; it gathers zeros.
TEST(CudaGather, IndicesOutOfRangeGatherZerosOnTheGpu) {
  LOOM_REQUIRE_GPU();
  const tensor p = make(dtype::f32, {3, 2}, {1, 2, 3, 4, 5, 6});
  const tensor i = indices(dtype::i32, {4}, {2, -1, 3, 0});
  const auto n = op_node::of("gather", {p, i});
  const auto out = n.run(test_gpu(), {to_gpu(p), to_gpu(i)});
  EXPECT_EQ(values(to_host(out[0])), (std::vector<double>{5, 6, 0, 0, 0, 0, 1, 2}));
}

TEST(CudaOneHot, AxesIndexTypesAndDtypesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : all) {
    for (const dtype it : {dtype::i32, dtype::i64}) {
      // Indices outside [0, depth) give a row of off values on both devices.
      const tensor i = indices(it, {2, 3}, {0, 4, -1, 2, 5, 1});
      for (const std::int64_t axis : {-1, 0, 1, 2}) {
        expect_gpu_matches_cpu(op_node::of("one_hot", {i},
                                           {{"depth", std::int64_t{5}},
                                            {"axis", axis},
                                            {"dtype", t},
                                            {"on_value", 3.0},
                                            {"off_value", -1.0}}),
                               {i}, label("one_hot", t, "axis " + std::to_string(axis)));
      }
      const tensor e = indices(it, {0}, {});
      expect_gpu_matches_cpu(
          op_node::of("one_hot", {e}, {{"depth", std::int64_t{4}}, {"dtype", t}}), {e},
          label("one_hot", t, "empty"));
      const tensor s = transposed_storage(i);
      expect_gpu_matches_cpu(
          op_node::of("one_hot", {s}, {{"depth", std::int64_t{6}}, {"dtype", t}}), {s},
          label("one_hot", t, "strided"));
    }
  }
}

attr_map gather_grad_attrs(const shape& ps, std::int64_t axis) {
  return {{"params_shape", ps}, {"axis", axis}};
}

TEST(CudaGatherGrad, SumsAreTheCpusBitForBit) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 90;
  const std::vector<dtype> types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                 dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  for (const dtype t : types) {
    for (const dtype it : {dtype::i32, dtype::i64}) {
      // Axis 0, an index picked many times and rows picked never.
      std::vector<double> many(300);
      for (std::size_t j = 0; j < many.size(); ++j)
        many[j] = j % 3 == 0 ? 7.0 : static_cast<double>(j % 11);
      const tensor i1 = indices(it, {300}, many);
      const tensor dy1 = random(t, {300, 5}, ++seed, -20, 20);
      // Summed in the CPU's order and type: no tolerance.
      expect_gpu_matches_cpu(op_node::of("gather_grad", {dy1, i1}, gather_grad_attrs({16, 5}, 0)),
                             {dy1, i1}, label("gather_grad", t, "axis 0"), 0.0);
      // Axis 1 with 2-d indices and an outer dimension.
      const tensor i2 = indices(it, {2, 3}, {3, 0, 3, 1, 3, 0});
      const tensor dy2 = random(t, {4, 2, 3, 6}, ++seed, -20, 20);
      expect_gpu_matches_cpu(op_node::of("gather_grad", {dy2, i2}, gather_grad_attrs({4, 5, 6}, 1)),
                             {dy2, i2}, label("gather_grad", t, "axis 1"), 0.0);
      // No indices: zeros.
      const tensor i0 = indices(it, {0}, {});
      const tensor dy0 = random(t, {0, 3}, ++seed);
      expect_gpu_matches_cpu(op_node::of("gather_grad", {dy0, i0}, gather_grad_attrs({4, 3}, 0)),
                             {dy0, i0}, label("gather_grad", t, "no indices"), 0.0);
      // Strided dy, unknown params_shape dimensions taken from it.
      const tensor dy3 = transposed_storage(random(t, {4, 2, 3, 6}, ++seed, -20, 20));
      expect_gpu_matches_cpu(
          op_node::of("gather_grad", {dy3, i2}, gather_grad_attrs({-1, 5, -1}, 1)), {dy3, i2},
          label("gather_grad", t, "strided"), 0.0);
    }
  }
  // An embedding gradient of realistic size.
  std::vector<double> ids(4000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>((i * i) % 997);
  const tensor idx = indices(dtype::i64, {40, 100}, ids);
  const tensor dy = random(dtype::f32, {40, 100, 64}, ++seed);
  expect_gpu_matches_cpu(op_node::of("gather_grad", {dy, idx}, gather_grad_attrs({1000, 64}, 0)),
                         {dy, idx}, "embedding gradient", 0.0);
}

// Note [cuda value checks]: an index out of range adds nothing on the GPU. Checked against a
// float64 sum over the valid positions.
TEST(CudaGatherGrad, IndicesOutOfRangeAddNothingOnTheGpu) {
  LOOM_REQUIRE_GPU();
  const std::vector<double> idx_values{1, 9, 1, -2, 0, 2};
  const tensor idx = indices(dtype::i64, {6}, idx_values);
  const tensor dy = random(dtype::f64, {6, 4}, 100);
  const auto n = op_node::of("gather_grad", {dy, idx}, gather_grad_attrs({3, 4}, 0));
  const auto got = values(to_host(n.run(test_gpu(), {to_gpu(dy), to_gpu(idx)})[0]));
  const auto d = values(dy);
  std::vector<double> want(12, 0.0);
  for (std::size_t j = 0; j < idx_values.size(); ++j) {
    const double r = idx_values[j];
    if (r < 0 || r >= 3) continue;
    for (std::size_t c = 0; c < 4; ++c) {
      want[static_cast<std::size_t>(r) * 4 + c] += d[j * 4 + c];
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

}  // namespace
}  // namespace loom
