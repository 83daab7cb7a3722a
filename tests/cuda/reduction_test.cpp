// The CUDA reduction kernels (src/backends/cuda/reduction_kernels.cpp: reduce_sum / mean / max /
// min / prod, argmax, softmax, log_softmax, softmax_cross_entropy) against the CPU kernels of
// the same nodes (themselves tested against float64 references in tests/kernels): every
// dtype, rows of 1, odd and long sizes (1000, 1023, 4097, long enough to be cut in chunks),
// axis combinations (neighbouring, apart, none, all), keepdims, empty tensors, non-contiguous
// inputs, NaN, ties, outputs written in place, and the same bits on a second run. Without a
// GPU the registry and the argument checks (made before any CUDA call) are still tested; the
// rest skips.
#include "backends/cuda/kernels/reduction.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/kernels/softmax.cuh"
#include "cuda/kernel_compare.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using namespace testing::cuda_compare;

const std::vector<dtype> numeric{dtype::f32,  dtype::f64, dtype::f16,
                                 dtype::bf16, dtype::i32, dtype::i64};
const std::vector<dtype> floats{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

const kernel_def* find_def(const std::string& op, device_type d) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == d) return k;
  }
  return nullptr;
}

// tolerance_for(t) with its relative part scaled by `rslack` and its absolute part by
// `aslack` (sums and products in another order than the CPU's).
tolerance tol(dtype t, double rslack, double aslack) {
  tolerance r = tolerance_for(t);
  r.rtol *= rslack;
  r.atol *= aslack;
  return r;
}
tolerance tol(dtype t, double slack) {
  return tol(t, slack, slack);
}

// Runs n on the CPU and on the GPU and expects each output within tol(dtype, rslack, aslack);
// returns the GPU's outputs on the host.
std::vector<tensor> compare(const op_node& n, const std::vector<tensor>& inputs,
                            const std::string& what, double rslack = 1.0, double aslack = -1.0) {
  if (aslack < 0) aslack = rslack;
  const auto want = n.run(reference_cpu(), inputs);
  std::vector<tensor> on_gpu;
  for (const auto& x : inputs) on_gpu.push_back(to_gpu(x));
  const auto got_gpu = n.run(test_gpu(), on_gpu);
  std::vector<tensor> got;
  for (std::size_t i = 0; i < got_gpu.size(); ++i) {
    EXPECT_EQ(got_gpu[i].device().type, device_type::cuda) << what << ": output " << i;
    got.push_back(to_host(got_gpu[i]));
    expect_same(got.back(), want[i], tol(want[i].type(), rslack, aslack),
                what + ", output " + std::to_string(i));
  }
  return got;
}

// The absolute slack for a sum (or mean) of `count` terms of magnitude about 1: rounding
// errors grow as the square root of the count, and results near 0 have only this to go by.
double sum_slack(std::int64_t count, bool mean) {
  const double c = static_cast<double>(std::max<std::int64_t>(count, 1));
  return 10.0 * std::sqrt(c) / (mean ? c : 1.0);
}

// The number of elements a reduction of shape s over `axes` folds into each output.
std::int64_t reduced_count(const shape& s, const ints& axes) {
  if (axes.empty()) return s.num_elements();
  std::int64_t c = 1;
  for (const auto a : axes)
    c *= s[static_cast<std::size_t>(a < 0 ? a + static_cast<std::int64_t>(s.rank()) : a)];
  return c;
}

// Expects two host tensors to hold the same bits.
void expect_bitwise(const tensor& a, const tensor& b, const std::string& what) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  ASSERT_TRUE(a.is_contiguous() && b.is_contiguous()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what;
}

std::string label(const std::string& op, dtype t, const shape& s, const std::string& more = "") {
  return op + " " + to_string(t) + to_string(s) + (more.empty() ? "" : " " + more);
}

std::string axes_text(const ints& axes) {
  std::string r = "axes {";
  for (std::size_t i = 0; i < axes.size(); ++i) r += (i ? ", " : "") + std::to_string(axes[i]);
  return r + "}";
}

// ---- without a GPU ---------------------------------------------------------------------------

const std::vector<std::string> family_ops{"reduce_sum", "reduce_mean", "reduce_max",
                                          "reduce_min", "reduce_prod", "argmax",
                                          "softmax",    "log_softmax", "softmax_cross_entropy"};

TEST(CudaReductionRegistry, EveryOpHasACudaKernelForTheCpuTypes) {
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

// Shapes the node was declared with that differ from the fed ones, so that inference passes
// and the kernel's own checks run.
TEST(CudaReductionChecks, RunTimeErrorsFailAsOnTheCpu) {
  const tensor x23 = random(dtype::f32, {2, 3}, 1);
  {
    const op_node n("reduce_sum", {{dtype::f32, {2, 3, 4}}},
                    {{"axes", ints{2}}, {"keepdims", false}});
    expect_same_failure(n, {x23}, "axis 2 is out of range for input of shape [2, 3]");
  }
  {
    const op_node n("reduce_max", {{dtype::f32, {2, 3, 4}}},
                    {{"axes", ints{1, -1}}, {"keepdims", false}});
    expect_same_failure(n, {x23}, "axes name axis 1 twice");
  }
  for (const char* op : {"reduce_max", "reduce_min"}) {
    const tensor empty = random(dtype::f32, {0, 3}, 2);
    const op_node n = op_node::of(op, {empty}, {{"axes", ints{0}}, {"keepdims", false}});
    expect_same_failure(n, {empty},
                        "of an empty axis (axis 0 of input shape [0, 3]) has no identity");
  }
  {
    const tensor empty = random(dtype::f32, {2, 0}, 3);
    const op_node n = op_node::of("argmax", {empty}, {{"axis", std::int64_t{1}}});
    expect_same_failure(n, {empty}, "argmax of an empty axis (axis 1 of input shape [2, 0])");
  }
  {
    const op_node n("argmax", {{dtype::f32, {2, 3, 4}}}, {{"axis", std::int64_t{-3}}});
    expect_same_failure(n, {x23}, "axis -3 is out of range");
  }
  for (const char* op : {"softmax", "log_softmax"}) {
    const op_node n(op, {{dtype::f32, {2, 3, 4}}}, {{"axis", std::int64_t{2}}});
    expect_same_failure(n, {x23}, "axis 2 is out of range for input of shape [2, 3]");
  }
  {
    const op_node n("softmax_cross_entropy", {{dtype::f32, {-1, -1}}, {dtype::i32, {-1}}});
    expect_same_failure(n, {x23, make(dtype::i32, {3}, {0, 1, 2})},
                        "logits [2, 3] must be [N, C] and labels [3] must be [N]");
  }
}

// The launch plans are host code: checked without a GPU (Note [cuda reduction plan]).
TEST(CudaReducePlan, PiecesCoverTheAxisAndPartialsFitTheTemporary) {
  using cuda::kernels::elem_type;
  using cuda::kernels::reduce_op;
  struct geometry {
    std::int64_t outer, n, inner;
  };
  const std::vector<geometry> shapes{{1, 1, 1},      {1, 300001, 1}, {2, 50001, 1}, {1000, 4097, 1},
                                     {1, 100003, 3}, {1, 255, 1},    {7, 8192, 1},  {3, 1023, 5},
                                     {1, 256, 64},   {1, 1 << 24, 1}};
  // Accumulator bytes per (dtype, op): float sums in double, 16-bit float sums in float,
  // integer sums and products in 64 bits, the rest in the compute type.
  const std::vector<std::tuple<elem_type, reduce_op, std::size_t>> accs{
      {elem_type::f32, reduce_op::sum, 8},  {elem_type::f32, reduce_op::mean, 8},
      {elem_type::f16, reduce_op::sum, 4},  {elem_type::bf16, reduce_op::mean, 4},
      {elem_type::f64, reduce_op::prod, 8}, {elem_type::f32, reduce_op::max, 4},
      {elem_type::f16, reduce_op::min, 4},  {elem_type::i32, reduce_op::sum, 8},
      {elem_type::i32, reduce_op::max, 4},  {elem_type::i64, reduce_op::prod, 8}};
  for (const auto& g : shapes) {
    for (const auto& [t, op, acc] : accs) {
      const auto p = cuda::kernels::plan_reduce(t, op, g.outer, g.n, g.inner);
      const std::string what =
          std::to_string(g.outer) + "x" + std::to_string(g.n) + "x" + std::to_string(g.inner);
      EXPECT_EQ(p.outer, g.outer) << what;
      EXPECT_EQ(p.n, g.n) << what;
      EXPECT_EQ(p.inner, g.inner) << what;
      ASSERT_GE(p.chunks, 1) << what;
      EXPECT_GE(p.chunks * p.chunk_len, g.n) << what;        // the pieces cover n
      EXPECT_LT((p.chunks - 1) * p.chunk_len, g.n) << what;  // and none is empty
      if (p.chunks == 1) {
        EXPECT_EQ(p.temp_bytes, 0u) << what;
      } else {
        EXPECT_EQ(p.temp_bytes, static_cast<std::size_t>(g.outer * p.chunks * g.inner) * acc)
            << what;
      }
      // The plan is a function of the shape (and not, say, of the dtype's size).
      const auto q =
          cuda::kernels::plan_reduce(elem_type::f64, reduce_op::sum, g.outer, g.n, g.inner);
      EXPECT_EQ(q.chunks, p.chunks) << what;
    }
  }
  // Long reductions into few outputs are cut; many outputs are not.
  EXPECT_GT(cuda::kernels::plan_reduce(elem_type::f32, reduce_op::sum, 1, 1 << 24, 1).chunks, 1);
  EXPECT_GT(cuda::kernels::plan_reduce(elem_type::f32, reduce_op::sum, 1, 100003, 3).chunks, 1);
  EXPECT_EQ(cuda::kernels::plan_reduce(elem_type::f32, reduce_op::sum, 100000, 4097, 1).chunks, 1);
}

TEST(CudaReducePlan, LaunchersTakeTheRegisteredTypes) {
  using cuda::kernels::elem_type;
  using cuda::kernels::reduce_op;
  for (int k = 0; k < dtype_count; ++k) {
    const auto t = static_cast<dtype>(k);
    const auto e = static_cast<elem_type>(k);
    const bool numeric_t = is_floating(t) || t == dtype::i32 || t == dtype::i64;
    for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::prod}) {
      EXPECT_EQ(cuda::kernels::reduce_supports(e, op), numeric_t) << to_string(t);
    }
    EXPECT_EQ(cuda::kernels::reduce_supports(e, reduce_op::mean), is_floating(t)) << to_string(t);
    EXPECT_EQ(cuda::kernels::argmax_supports(e), t != dtype::boolean) << to_string(t);
    EXPECT_EQ(cuda::kernels::softmax_supports(e), is_floating(t)) << to_string(t);
  }
}

// ---- reduce_* ---------------------------------------------------------------------------------

struct reduce_case {
  shape s;
  ints axes;
  bool keepdims;
};

// Neighbouring axes (rows, columns, middle), axes apart (a gather first), all, size-1 dims,
// scalars, and reductions long enough to be cut in chunks (Note [cuda reduction plan]).
const std::vector<reduce_case> reduce_cases{
    {{1000}, {}, false},          {{1023, 3}, {0}, false},
    {{1023, 3}, {1}, true},       {{3, 4097}, {1}, false},
    {{3, 4097}, {0}, true},       {{2, 3, 4, 5}, {1, 3}, false},
    {{2, 3, 4, 5}, {0, 2}, true}, {{2, 3, 4, 5}, {1, 2}, false},
    {{2, 3, 4, 5}, {}, true},     {{2, 3, 4, 5}, {-1}, false},
    {{7, 1, 33}, {1}, false},     {{7, 1, 33}, {0, 1}, false},
    {{5, 1}, {0}, false},         {{}, {}, false},
    {{1, 1}, {1}, true},          {{300001}, {}, false},
    {{100003, 3}, {0}, false},    {{2, 50001}, {1}, false},
    {{40, 5000}, {1}, false},     {{5000, 40}, {0}, false},
};

// Sums and means: tolerances from sum_slack; max and min (sums == false): exact.
void check_reduce(const std::string& op, double lo, double hi, bool sums) {
  for (const dtype t : numeric) {
    if (op == "reduce_mean" && !is_floating(t)) continue;
    std::uint64_t seed = 10;
    for (const auto& c : reduce_cases) {
      const tensor x = random(t, c.s, ++seed, lo, hi);
      const op_node n = op_node::of(op, {x}, {{"axes", c.axes}, {"keepdims", c.keepdims}});
      const double a = sums ? sum_slack(reduced_count(c.s, c.axes), op == "reduce_mean") : 0.0;
      compare(n, {x}, label(op, t, c.s, axes_text(c.axes)), sums ? 10.0 : 0.0, a);
    }
  }
}

TEST(CudaReduce, SumMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  check_reduce("reduce_sum", -2.0, 2.0, true);
}

TEST(CudaReduce, MeanMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  check_reduce("reduce_mean", -2.0, 2.0, true);
}

TEST(CudaReduce, MaxAndMinMatchTheCpuExactly) {
  LOOM_REQUIRE_GPU();
  check_reduce("reduce_max", -100.0, 100.0, false);
  check_reduce("reduce_min", -100.0, 100.0, false);
}

TEST(CudaReduce, ProdMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  // Values near 1 keep long products finite; integer products of [-2, 3) wrap, identically.
  for (const dtype t : numeric) {
    std::uint64_t seed = 50;
    for (const auto& c : reduce_cases) {
      const bool integral = !is_floating(t);
      const tensor x =
          integral ? random(t, c.s, ++seed, -2.0, 3.0) : random(t, c.s, ++seed, 0.999, 1.001);
      const op_node n =
          op_node::of("reduce_prod", {x}, {{"axes", c.axes}, {"keepdims", c.keepdims}});
      compare(n, {x}, label("reduce_prod", t, c.s, axes_text(c.axes)), 100.0);
    }
  }
}

// reduce_sum's output_type float32 over float16 / bfloat16: on the GPU the float32 sum of
// the widened values (accumulated in double, as the float32 sum is), so the same bits as the
// GPU's own sum of the cast, and close to the CPU's.
TEST(CudaReduce, SixteenBitSumsIntoFloat32) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::f16, dtype::bf16}) {
    std::uint64_t seed = 70;
    for (const auto& c : reduce_cases) {
      const tensor x = random(t, c.s, ++seed);
      const attr_map widened{{"axes", c.axes}, {"keepdims", c.keepdims}, {"output_type", dtype::f32}};
      const op_node n = op_node::of("reduce_sum", {x}, widened);
      const std::string what = label("reduce_sum into float32", t, c.s, axes_text(c.axes));
      const auto got = compare(n, {x}, what, 10.0, sum_slack(reduced_count(c.s, c.axes), false));
      ASSERT_EQ(got[0].type(), dtype::f32) << what;
      const op_node cast = op_node::of("cast", {x}, {{"to", dtype::f32}});
      const tensor wide = cast.run(test_gpu(), {to_gpu(x)})[0];
      const op_node sum = op_node::of("reduce_sum", {wide}, {{"axes", c.axes}, {"keepdims", c.keepdims}});
      expect_bitwise(got[0], to_host(sum.run(test_gpu(), {wide})[0]), what + " against the cast");
    }
  }
}

TEST(CudaReduce, IntegerSumsWrapAsOnTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::i32, dtype::i64}) {
    const double big = t == dtype::i32 ? 2.0e9 : 9.0e18;
    const tensor x = random(t, {3, 4097}, 7, -big, big);
    for (const ints& axes : {ints{}, ints{0}, ints{1}}) {
      const op_node n = op_node::of("reduce_sum", {x}, {{"axes", axes}, {"keepdims", false}});
      compare(n, {x}, label("reduce_sum", t, x.shape(), axes_text(axes)));
    }
  }
}

TEST(CudaReduce, NanPropagatesThroughMaxMinAndSum) {
  LOOM_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const dtype t : floats) {
    for (const shape& s : {shape{4, 600}, shape{600, 4}, shape{5000}}) {
      tensor x = random(t, s, 3);
      // A NaN in some rows and columns, infinities elsewhere.
      std::vector<double> v = values(x);
      for (std::size_t i = 0; i < v.size(); i += 997) v[i] = nan;
      for (std::size_t i = 5; i < v.size(); i += 1301) v[i] = i % 2 ? inf : -inf;
      x = make(t, s, v);
      for (const char* op : {"reduce_max", "reduce_min", "reduce_sum"}) {
        for (const ints& axes : {ints{}, ints{0}, ints{-1}}) {
          const op_node n = op_node::of(op, {x}, {{"axes", axes}, {"keepdims", false}});
          compare(n, {x}, label(op, t, s, axes_text(axes) + " with NaN"), 10.0,
                  sum_slack(reduced_count(s, axes), false));
        }
      }
    }
  }
}

TEST(CudaReduce, EmptyTensorsGiveTheIdentityOrNothing) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : numeric) {
    const tensor x = random(t, {0, 3}, 4);
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_prod", "reduce_max"}) {
      if (std::string(op) == "reduce_mean" && !is_floating(t)) continue;
      // Over the empty axis: 0, NaN or 1 per output (max: an error, tested above).
      if (std::string(op) != "reduce_max") {
        const op_node n = op_node::of(op, {x}, {{"axes", ints{0}}, {"keepdims", true}});
        const auto got = compare(n, {x}, label(op, t, x.shape(), "over the empty axis"));
        ASSERT_EQ(got[0].num_elements(), 3);
      }
      // Over the other axis: an empty output.
      const op_node n = op_node::of(op, {x}, {{"axes", ints{1}}, {"keepdims", false}});
      const auto got = compare(n, {x}, label(op, t, x.shape(), "over axis 1"));
      EXPECT_EQ(got[0].num_elements(), 0);
    }
  }
}

TEST(CudaReduce, NonContiguousInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::f32, dtype::f16, dtype::i64}) {
    const tensor x = random(t, {6, 5, 130}, 9);
    for (const tensor& view : {transposed_storage(x), spread(x)}) {
      for (const ints& axes : {ints{}, ints{0}, ints{1}, ints{2}, ints{0, 2}, ints{1, 2}}) {
        for (const char* op : {"reduce_sum", "reduce_max"}) {
          const op_node n = op_node::of(op, {view}, {{"axes", axes}, {"keepdims", false}});
          compare(n, {view}, label(op, t, x.shape(), axes_text(axes) + " strided"), 10.0,
                  sum_slack(reduced_count(x.shape(), axes), false));
        }
      }
    }
  }
}

TEST(CudaReduce, RepeatedRunsGiveTheSameBits) {
  LOOM_REQUIRE_GPU();
  // Note [cuda deterministic reductions]: chunked sums included.
  for (const reduce_case& c :
       {reduce_case{{300001}, {}, false}, reduce_case{{100003, 3}, {0}, false},
        reduce_case{{40, 5000}, {1}, false}}) {
    const tensor x = random(dtype::f32, c.s, 21);
    const op_node n = op_node::of("reduce_sum", {x}, {{"axes", c.axes}, {"keepdims", false}});
    const tensor a = to_host(n.run(test_gpu(), {to_gpu(x)})[0]);
    const tensor b = to_host(n.run(test_gpu(), {to_gpu(x)})[0]);
    expect_bitwise(a, b, label("reduce_sum", dtype::f32, c.s));
  }
}

// ---- argmax -----------------------------------------------------------------------------------

struct axis_case {
  shape s;
  std::int64_t axis;
};

const std::vector<axis_case> argmax_cases{{{1000}, -1},   {{7, 300}, 1},    {{5, 4097}, -1},
                                          {{4097, 5}, 0}, {{3, 4, 5}, 1},   {{6, 1}, 1},
                                          {{1, 6}, 0},    {{2, 3, 300}, 2}, {{300, 2, 3}, 0}};

TEST(CudaArgmax, EveryDtypeAndAxisMatchesTheCpuWithTies) {
  LOOM_REQUIRE_GPU();
  const std::vector<dtype> types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                 dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  std::uint64_t seed = 30;
  for (const dtype t : types) {
    for (const auto& c : argmax_cases) {
      // Few distinct values, so ties are common: the first index must win.
      tensor x = random(t, c.s, ++seed, -4.0, 4.0);
      x = make(t, c.s, [&] {
        auto v = values(x);
        for (auto& e : v) e = std::floor(e);
        if (t == dtype::u8) {
          for (auto& e : v) e = std::fabs(e);
        }
        return v;
      }());
      for (const dtype out : {dtype::i64, dtype::i32}) {
        const op_node n = op_node::of("argmax", {x}, {{"axis", c.axis}, {"output_type", out}});
        compare(n, {x}, label("argmax", t, c.s, "axis " + std::to_string(c.axis)));
      }
    }
  }
}

TEST(CudaArgmax, ArgminLastIndexAndKeepdimsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::uint64_t seed = 60;
  for (const dtype t : {dtype::f32, dtype::f16, dtype::i32, dtype::u8}) {
    for (const auto& c : argmax_cases) {
      auto v = values(random(t, c.s, ++seed, 0.0, 4.0));
      for (auto& e : v) e = std::floor(e);  // ties
      if (t == dtype::f32) {
        for (std::size_t i = 5; i < v.size(); i += 11) v[i] = nan;
      }
      const tensor x = make(t, c.s, v);
      for (const char* op : {"argmax", "argmin"}) {
        for (const bool last : {false, true}) {
          const op_node n = op_node::of(
              op, {x}, {{"axis", c.axis}, {"keepdims", !last}, {"select_last_index", last}});
          compare(n, {x}, label(op, t, c.s, last ? "last index" : "keepdims"));
        }
      }
    }
  }
}

TEST(CudaArgmax, TheFirstNanWins) {
  LOOM_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const dtype t : floats) {
    for (const auto& c : argmax_cases) {
      auto v = values(random(t, c.s, 40));
      for (std::size_t i = 3; i < v.size(); i += 7) v[i] = nan;
      const tensor x = make(t, c.s, v);
      const op_node n = op_node::of("argmax", {x}, {{"axis", c.axis}});
      compare(n, {x}, label("argmax", t, c.s, "with NaN"));
    }
  }
}

TEST(CudaArgmax, EmptyAndStridedInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const tensor empty = random(dtype::f32, {0, 5}, 5);
  const op_node ne = op_node::of("argmax", {empty}, {{"axis", std::int64_t{1}}});
  EXPECT_EQ(compare(ne, {empty}, "argmax of [0, 5]")[0].num_elements(), 0);
  const tensor x = random(dtype::f32, {9, 700}, 6);
  for (const tensor& view : {transposed_storage(x), spread(x)}) {
    for (const std::int64_t axis : {0, 1}) {
      const op_node n = op_node::of("argmax", {view}, {{"axis", axis}});
      compare(n, {view}, "argmax strided, axis " + std::to_string(axis));
    }
  }
}

// ---- softmax / log_softmax -------------------------------------------------------------------

// Rows of 1, warp rows, block rows cached in shared memory and too long for it, columns.
const std::vector<axis_case> softmax_cases{
    {{1000}, -1},   {{6, 1}, -1},   {{3, 1023}, -1}, {{5, 4097}, 1}, {{2, 20000}, 1},
    {{33, 512}, 1}, {{4, 7, 5}, 1}, {{4, 7, 5}, 0},  {{1023, 3}, 0}, {{1, 5}, 0}};

TEST(CudaSoftmax, SoftmaxAndLogSoftmaxMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 60;
  for (const char* op : {"softmax", "log_softmax"}) {
    for (const dtype t : floats) {
      for (const auto& c : softmax_cases) {
        // Spread wide enough that the maximum's subtraction matters.
        const tensor x = random(t, c.s, ++seed, -30.0, 30.0);
        const op_node n = op_node::of(op, {x}, {{"axis", c.axis}});
        compare(n, {x}, label(op, t, c.s, "axis " + std::to_string(c.axis)), 10.0);
      }
    }
  }
}

TEST(CudaSoftmax, InfinitiesNanEmptyAndStridedInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const char* op : {"softmax", "log_softmax"}) {
    for (const dtype t : floats) {
      auto v = values(random(t, {4, 600}, 70, -5.0, 5.0));
      v[3] = -inf;                                                             // row 0: one -inf
      for (int i = 600; i < 1200; ++i) v[static_cast<std::size_t>(i)] = -inf;  // row 1: all -inf
      v[1300] = nan;                                                           // row 2: a NaN
      v[1900] = 1e4;  // row 3: one huge value
      const tensor x = make(t, {4, 600}, v);
      const op_node n = op_node::of(op, {x}, {{"axis", std::int64_t{1}}});
      compare(n, {x}, label(op, t, x.shape(), "special values"), 10.0);

      const tensor empty = random(t, {0, 5}, 71);
      const op_node ne = op_node::of(op, {empty}, {{"axis", std::int64_t{1}}});
      compare(ne, {empty}, label(op, t, empty.shape()));

      const tensor y = random(t, {9, 1500}, 72);
      for (const tensor& view : {transposed_storage(y), spread(y)}) {
        for (const std::int64_t axis : {0, 1}) {
          const op_node ns = op_node::of(op, {view}, {{"axis", axis}});
          compare(ns, {view}, label(op, t, y.shape(), "strided, axis " + std::to_string(axis)),
                  10.0);
        }
      }
    }
  }
}

TEST(CudaSoftmax, InPlaceOutputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const char* op : {"softmax", "log_softmax"}) {
    for (const auto& c : softmax_cases) {
      const tensor x = random(dtype::f32, c.s, 80, -3.0, 3.0);
      const op_node n = op_node::of(op, {x}, {{"axis", c.axis}});
      const tensor want = n.run(reference_cpu(), {x})[0];
      std::vector<tensor> in{to_gpu(x)};
      const void* buffer = in[0].raw_data();
      const tensor out = n.run(test_gpu(), std::move(in))[0];
      if (out.raw_data() != buffer) {
        std::cout << "note: " << op << to_string(c.s) << " did not run in place\n";
      }
      expect_same(to_host(out), want, tol(dtype::f32, 10.0),
                  label(op, dtype::f32, c.s, "in place"));
    }
  }
}

// ---- softmax_cross_entropy -------------------------------------------------------------------

TEST(CudaSoftmaxCrossEntropy, LossAndBackpropMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 90;
  for (const dtype t : floats) {
    for (const dtype lt : {dtype::i32, dtype::i64}) {
      for (const shape& s : {shape{7, 1}, shape{5, 10}, shape{64, 1000}, shape{3, 4097},
                             shape{2, 20000}, shape{0, 10}}) {
        const tensor logits = random(t, s, ++seed, -10.0, 10.0);
        std::vector<double> l(static_cast<std::size_t>(s[0]));
        for (std::size_t r = 0; r < l.size(); ++r) {
          l[r] = static_cast<double>((r * 7919 + 3) % static_cast<std::size_t>(s[1]));
        }
        const tensor labels = make(lt, {s[0]}, l);
        const op_node n = op_node::of("softmax_cross_entropy", {logits, labels});
        compare(n, {logits, labels}, label("softmax_cross_entropy", t, s, to_string(lt)), 10.0);
        // In place: backprop in the logits' buffer.
        const auto want = n.run(reference_cpu(), {logits, labels});
        const auto got = n.run(test_gpu(), {to_gpu(logits), to_gpu(labels)});
        for (std::size_t i = 0; i < 2; ++i) {
          expect_same(
              to_host(got[i]), want[i], tol(t, 10.0),
              label("softmax_cross_entropy", t, s, "in place, output " + std::to_string(i)));
        }
      }
    }
  }
}

TEST(CudaSoftmaxCrossEntropy, LabelsOutOfRangeGiveNanRowsOnTheGpu) {
  LOOM_REQUIRE_GPU();
  // The CPU kernel fails; the GPU cannot stop to say so and marks the row instead.
  const tensor logits = random(dtype::f32, {3, 600}, 95);
  const tensor labels = make(dtype::i64, {3}, {5, 600, -1});
  const op_node n = op_node::of("softmax_cross_entropy", {logits, labels});
  const auto got = n.run(test_gpu(), {to_gpu(logits), to_gpu(labels)});
  const auto loss = values(to_host(got[0]));
  const auto backprop = values(to_host(got[1]));
  EXPECT_FALSE(std::isnan(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_TRUE(std::isnan(loss[2]));
  for (std::size_t i = 0; i < 600; ++i) {
    EXPECT_FALSE(std::isnan(backprop[i]));
    EXPECT_TRUE(std::isnan(backprop[600 + i]));
    EXPECT_TRUE(std::isnan(backprop[1200 + i]));
  }
  // Row 0 still matches the CPU's.
  const tensor row_logits = make(dtype::f32, {1, 600}, [&] {
    auto v = values(logits);
    v.resize(600);
    return v;
  }());
  const tensor row_label = make(dtype::i64, {1}, {5});
  const op_node n1 = op_node::of("softmax_cross_entropy", {row_logits, row_label});
  const auto want = n1.run(reference_cpu(), {row_logits, row_label});
  EXPECT_NEAR(loss[0], values(want[0])[0], 1e-5);
}

// The loss is the unfused form's, -sum(one_hot * log_softmax), NaN included (Note [xent as
// its unfused form]): a -inf logit of another class, or the largest finite magnitudes of
// both signs in one row, make one_hot's 0 meet a -inf log-softmax value, and the loss NaN,
// as on the CPU; a -inf at the label is an infinite loss. Rows short enough for a warp and
// long enough for a block.
TEST(CudaSoftmaxCrossEntropy, SpecialLogitsGiveTheUnfusedFormsLossAsOnTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : floats) {
    const double huge = t == dtype::f16 ? 6e4 : t == dtype::f64 ? 1.7e308 : 3e38;
    for (const std::int64_t c : {std::int64_t{6}, std::int64_t{700}}) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const double inf = std::numeric_limits<double>::infinity();
      std::vector<std::vector<double>> rows;
      std::vector<double> labels;
      const auto base = values(random(t, {1, c}, 97, -3.0, 3.0));
      auto add = [&](std::int64_t at, double v, double label) {
        auto r = base;
        if (at >= 0) r[static_cast<std::size_t>(at)] = v;
        rows.push_back(r);
        labels.push_back(label);
      };
      add(-1, 0, 1);         // ordinary
      add(4, -inf, 1);       // -inf elsewhere: NaN
      add(1, -inf, 1);       // -inf at the label: inf
      add(4, nan, 1);        // NaN: NaN
      add(4, inf, 1);        // inf: NaN
      add(0, huge, 0);       // dominant: a loss of 0
      rows.back()[5] = -huge;  // and x - max overflows: NaN
      add(3, huge, 3);       // dominant at the label: 0
      const auto n = static_cast<std::int64_t>(rows.size());
      std::vector<double> lv;
      for (const auto& r : rows) lv.insert(lv.end(), r.begin(), r.end());
      const tensor logits = make(t, {n, c}, lv);
      const tensor lab = make(dtype::i64, {n}, labels);
      const op_node node = op_node::of("softmax_cross_entropy", {logits, lab});
      const auto want = node.run(reference_cpu(), {logits, lab});
      const auto got = node.run(test_gpu(), {to_gpu(logits), to_gpu(lab)});
      const auto loss = values(want[0]);
      EXPECT_TRUE(std::isnan(loss[1])) << to_string(t) << " " << c;
      EXPECT_TRUE(std::isinf(loss[2])) << to_string(t) << " " << c;
      EXPECT_TRUE(std::isnan(loss[5])) << to_string(t) << " " << c;
      expect_same(to_host(got[0]), want[0], tol(t, 10.0),
                  label("softmax_cross_entropy", t, {n, c}, "special logits"));
    }
  }
}

// ---- through a session --------------------------------------------------------------------------

TEST(CudaReductionSession, AGraphPlacedOnTheGpuMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  auto build = [](const std::string& dev) {
    graph g;
    graph_builder b(g);
    const auto guard = b.with_device(dev);
    auto x = ops::placeholder(b, "x", dtype::f32, {64, 1000});
    auto labels = ops::placeholder(b, "labels", dtype::i32, {64});
    auto sm = ops::log_softmax(x, -1, {.name = "lsm"});
    ops::reduce_mean(ops::reduce_max(sm, {1}), {}, false, {.name = "m"});
    ops::argmax(x, -1, dtype::i32, {.name = "am"});
    ops::softmax_cross_entropy(x, labels, {.name = "xent"});
    return g;
  };
  const tensor x = random(dtype::f32, {64, 1000}, 100, -5.0, 5.0);
  std::vector<double> l(64);
  for (std::size_t i = 0; i < 64; ++i) l[i] = static_cast<double>((i * 37) % 1000);
  const tensor labels = make(dtype::i32, {64}, l);
  const std::vector<std::string> fetches{"lsm", "m", "am", "xent:0", "xent:1"};
  session_options cpu_opts;
  cpu_opts.devices.cuda_device_count = 0;
  session cpu(build("cpu:0"), cpu_opts);
  session gpu(build("cuda:0"));
  const auto want = cpu.run({{"x", x}, {"labels", labels}}, fetches);
  const auto got = gpu.run({{"x", x}, {"labels", labels}}, fetches);
  for (std::size_t i = 0; i < fetches.size(); ++i) {
    tensor h = got[i];
    if (h.device().type == device_type::cuda) {
      h = gpu.find_device(to_string(h.device())).copy_to_host(h, memory::host_resource::instance());
    }
    expect_same(h, want[i], tol(want[i].type(), 10.0), "session fetch " + fetches[i]);
  }
}

}  // namespace
}  // namespace loom
