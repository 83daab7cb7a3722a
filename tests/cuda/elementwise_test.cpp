// The CUDA element-wise kernels (src/backends/cuda/elementwise_kernels.cpp) against the CPU
// kernels of the same nodes: every op and dtype the CPU takes, dense, broadcast,
// non-contiguous, empty and scalar operands, in place, and the generators. Without a GPU the
// registry and the argument checks (made before any CUDA call) are still tested; the rest
// skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernel_compare.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using namespace testing::cuda_compare;

const std::vector<dtype> fl{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
const std::vector<dtype> sig{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                             dtype::i32, dtype::i64, dtype::i8};
const std::vector<dtype> num{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                             dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
const std::vector<dtype> all{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
                             dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};

std::string label(const std::string& op, dtype t, const std::string& what) {
  return op + " " + to_string(t) + " " + what;
}

// ---- without a GPU ---------------------------------------------------------------------------

// Every op the CPU element-wise family registers (elementwise_unary.cpp, elementwise_binary.cpp,
// elementwise_cast.cpp, elementwise_generators.cpp), except the random generators, which stay
// on the CPU.
const std::vector<std::string> family_ops{
    "neg",        "abs",         "exp",           "log",
    "sqrt",       "rsqrt",       "tanh",          "sigmoid",
    "relu",       "gelu",        "erf",           "square",
    "reciprocal", "logical_not", "add",           "sub",
    "mul",        "div",         "pow",           "maximum",
    "minimum",    "equal",       "not_equal",     "less",
    "less_equal", "greater",     "greater_equal", "logical_and",
    "logical_or", "relu_grad",   "cast",          "where",
    "fill",       "zeros",       "ones",          "range",
    "sin",        "cos",         "tan",           "asin",
    "acos",       "atan",        "sinh",          "cosh",
    "asinh",      "acosh",       "atanh",         "log1p",
    "expm1",      "floor",       "ceil",          "round",
    "sign",       "softplus",    "softsign",      "silu",
    "mish",       "hard_swish",  "elu",           "selu",
    "celu",       "leaky_relu",  "hard_sigmoid",  "thresholded_relu",
    "isnan",      "isinf",       "isfinite",      "mod"};

const kernel_def* find_def(const std::string& op, device_type d) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == d) return k;
  }
  return nullptr;
}

TEST(CudaElementwiseRegistry, EveryOpOfTheFamilyHasACudaKernelForTheCpuTypes) {
  for (const auto& op : family_ops) {
    const kernel_def* c = find_def(op, device_type::cpu);
    const kernel_def* g = find_def(op, device_type::cuda);
    ASSERT_NE(c, nullptr) << op << " has no CPU kernel: update this list";
    ASSERT_NE(g, nullptr) << op << " has no CUDA kernel";
    EXPECT_EQ(g->label, "cuda") << op;
    // The same constraints, type attribute by type attribute.
    ASSERT_EQ(g->constraints.size(), c->constraints.size()) << op;
    for (std::size_t i = 0; i < c->constraints.size(); ++i) {
      EXPECT_EQ(g->constraints[i].first, c->constraints[i].first) << op;
      const std::set<dtype> want(c->constraints[i].second.begin(), c->constraints[i].second.end());
      const std::set<dtype> got(g->constraints[i].second.begin(), g->constraints[i].second.end());
      EXPECT_EQ(got, want) << op << ": " << g->describe();
      // f32 wherever the op takes a type.
      EXPECT_TRUE(got.count(dtype::f32) == 1) << op << ": " << g->describe();
    }
  }
}

TEST(CudaElementwiseRegistry, RandomGeneratorsStayOnTheCpu) {
  EXPECT_EQ(find_def("random_uniform", device_type::cuda), nullptr);
  EXPECT_EQ(find_def("random_normal", device_type::cuda), nullptr);
}

// The CUDA kernels check shapes before any CUDA call, with the CPU kernels' messages: run on
// the CPU device they fail exactly as the CPU kernel does.
TEST(CudaElementwiseChecks, OperandsThatDoNotBroadcastFailAsOnTheCpu) {
  const tensor a = random(dtype::f32, {3}, 1);
  const tensor b = random(dtype::f32, {4}, 2);
  const shape unknown{-1};
  for (const std::string op : {"add", "div", "maximum", "less", "relu_grad"}) {
    const op_node n(op, {{dtype::f32, unknown}, {dtype::f32, unknown}});
    expect_same_failure(n, {a, b}, "inputs do not broadcast");
  }
  const tensor c = random(dtype::boolean, {2, 3}, 3);
  const op_node w("where",
                  {{dtype::boolean, {-1, -1}}, {dtype::f32, unknown}, {dtype::f32, unknown}});
  expect_same_failure(w, {c, a, b}, "inputs do not broadcast");
}

TEST(CudaElementwiseChecks, MoreThanEightUnmergeableDimensionsFailBeforeTheGpu) {
  // Nine dimensions that alternate between broadcast and not cannot merge.
  const shape xs{2, 1, 2, 1, 2, 1, 2, 1, 2};
  const shape ys{1, 2, 1, 2, 1, 2, 1, 2, 1};
  const op_node n("add", {{dtype::f32, xs}, {dtype::f32, ys}});
  const std::string msg = node_error_of([&] {
    n.run_cuda_kernel_on_cpu({random(dtype::f32, xs, 4), random(dtype::f32, ys, 5)});
  });
  EXPECT_NE(msg.find("at most 8 dimensions after merging"), std::string::npos) << msg;
  EXPECT_NE(msg.find("under_test"), std::string::npos) << msg;
}

TEST(CudaElementwiseChecks, CastToItsOwnTypeIsTheInputItself) {
  // No conversion, no CUDA call: the kernel hands its input on.
  const tensor x = random(dtype::f32, {2, 3}, 6);
  const op_node n("cast", {{dtype::f32, {2, 3}}}, {{"to", dtype::f32}});
  const auto out = n.run_cuda_kernel_on_cpu({x});
  EXPECT_EQ(out.at(0).buf(), x.buf());
}

// ---- on the GPU: unary -----------------------------------------------------------------------

struct unary_case {
  std::string op;
  std::vector<dtype> types;
  double lo;
  double hi;
  attr_map attrs;
};

const std::vector<unary_case>& unary_cases() {
  static const std::vector<unary_case> cases{
      {"neg", sig, -100, 100, {}},
      {"abs", sig, -100, 100, {}},
      {"exp", fl, -10, 10, {}},
      {"log", fl, 0.01, 100, {}},
      {"sqrt", fl, 0, 100, {}},
      {"rsqrt", fl, 0.01, 100, {}},
      {"tanh", fl, -6, 6, {}},
      {"sigmoid", fl, -20, 20, {}},
      {"relu", num, -100, 100, {}},
      {"gelu", fl, -6, 6, {{"approximate", std::string("none")}}},
      {"gelu", fl, -6, 6, {{"approximate", std::string("tanh")}}},
      {"erf", fl, -3, 3, {}},
      {"square", sig, -30, 30, {}},
      {"reciprocal", fl, 0.1, 10, {}},
      {"logical_not", {dtype::boolean}, 0, 1, {}},
      {"sin", fl, -10, 10, {}},
      {"cos", fl, -10, 10, {}},
      {"tan", fl, -1.5, 1.5, {}},
      {"asin", fl, -1.2, 1.2, {}},
      {"acos", fl, -1.2, 1.2, {}},
      {"atan", fl, -20, 20, {}},
      {"sinh", fl, -10, 10, {}},
      {"cosh", fl, -10, 10, {}},
      {"asinh", fl, -50, 50, {}},
      {"acosh", fl, 0.5, 50, {}},
      {"atanh", fl, -1.1, 1.1, {}},
      {"log1p", fl, -1, 20, {}},
      {"expm1", fl, -10, 10, {}},
      {"floor", fl, -20, 20, {}},
      {"ceil", fl, -20, 20, {}},
      {"round", fl, -20, 20, {}},
      {"sign", sig, -20, 20, {}},
      {"softplus", fl, -30, 30, {}},
      {"softsign", fl, -30, 30, {}},
      {"silu", fl, -20, 20, {}},
      {"mish", fl, -20, 20, {}},
      {"hard_swish", fl, -5, 5, {}},
      {"elu", fl, -5, 5, {{"alpha", 0.7}}},
      {"selu", fl, -5, 5, {}},
      {"celu", fl, -5, 5, {{"alpha", 1.5}}},
      {"leaky_relu", fl, -5, 5, {{"alpha", 0.1}}},
      {"hard_sigmoid", fl, -5, 5, {{"alpha", 0.3}, {"beta", 0.4}}},
      {"thresholded_relu", fl, -3, 3, {{"alpha", 0.5}}},
      {"isnan", fl, -3, 3, {}},
      {"isinf", fl, -3, 3, {{"detect_negative", false}}},
      {"isfinite", fl, -3, 3, {}},
  };
  return cases;
}

// Shapes every unary op runs over: a scalar, empty tensors, one element, sizes around a
// block of threads and several blocks.
const std::vector<shape> unary_shapes{{}, {0}, {3, 0}, {1}, {7}, {255}, {257}, {3, 5, 130}};

TEST(CudaUnary, EveryOpAndTypeMatchesTheCpuOverDenseInputs) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 100;
  for (const auto& c : unary_cases()) {
    for (const dtype t : c.types) {
      for (const shape& s : unary_shapes) {
        const tensor x = random(t, s, ++seed, c.lo, c.hi);
        const auto n = op_node::of(c.op, {x}, c.attrs);
        expect_gpu_matches_cpu(n, {x}, label(c.op, t, to_string(s)));
      }
    }
  }
}

TEST(CudaUnary, NonContiguousAndOffsetInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 200;
  for (const auto& c : unary_cases()) {
    for (const dtype t : c.types) {
      const tensor x = random(t, {4, 33}, ++seed, c.lo, c.hi);
      for (const tensor& view : {transposed_storage(x), spread(x, 3, 5)}) {
        ASSERT_FALSE(view.is_contiguous());
        const auto n = op_node::of(c.op, {view}, c.attrs);
        expect_gpu_matches_cpu(n, {view}, label(c.op, t, "strided"));
      }
      // A broadcast (stride-0) view.
      const tensor row = random(t, {1, 17}, ++seed, c.lo, c.hi);
      const tensor b = broadcast_view(row, {5, 17});
      expect_gpu_matches_cpu(op_node::of(c.op, {b}, c.attrs), {b}, label(c.op, t, "stride 0"));
    }
  }
}

TEST(CudaUnary, SpecialValuesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> special{0.0,    -0.0, 1e-30, -1e-30, 88.0, -88.0, 100.0,
                                    -100.0, inf,  -inf,  nan,    1e30, -1e30, 0.5};
  for (const auto& c : unary_cases()) {
    if (c.types != fl) continue;
    for (const dtype t : {dtype::f32, dtype::f64}) {
      const tensor x = make(t, {static_cast<std::int64_t>(special.size())}, special);
      expect_gpu_matches_cpu(op_node::of(c.op, {x}, c.attrs), {x}, label(c.op, t, "special"));
    }
  }
}

TEST(CudaUnary, IntegersWrapAsOnTheCpu) {
  LOOM_REQUIRE_GPU();
  // neg and abs of the most negative value, square past the range.
  const tensor i32 = make(dtype::i32, {3}, {-2147483648.0, 65536.0, -46341.0});
  const tensor i8 = make(dtype::i8, {3}, {-128, 16, 127});
  for (const std::string op : {"neg", "abs", "square"}) {
    for (const tensor& x : {i32, i8}) {
      const auto got = expect_gpu_matches_cpu(op_node::of(op, {x}), {x}, op + " wraps");
      if (op == "neg") {
        EXPECT_EQ(values(got[0])[0], values(x)[0]) << "-MIN wraps to MIN";
      }
    }
  }
}

TEST(CudaUnary, AnInputHeldByTheNodeAloneIsOverwrittenInPlace) {
  LOOM_REQUIRE_GPU();
  const tensor host = random(dtype::f32, {1000}, 300);
  const auto n = op_node::of("exp", {host});
  const auto want = n.run(reference_cpu(), {host});
  tensor x = to_gpu(host);
  const void* storage = x.raw_data();
  std::vector<tensor> inputs;
  inputs.push_back(std::move(x));
  const auto out = n.run(test_gpu(), std::move(inputs));
  EXPECT_EQ(out[0].raw_data(), storage);
  expect_same(to_host(out[0]), want[0], tolerance_for(dtype::f32), "exp in place");
}

// ---- on the GPU: binary ----------------------------------------------------------------------

struct binary_case {
  std::string op;
  std::vector<dtype> types;
  double lo;
  double hi;
};

const std::vector<binary_case>& binary_cases() {
  static const std::vector<binary_case> cases{
      {"add", num, -100, 100},
      {"sub", num, -100, 100},
      {"mul", num, -50, 50},
      {"div", num, 1, 60},  // no zero divisor: the CPU fails
      {"pow", fl, 0.1, 4},
      {"maximum", num, -5, 5},
      {"minimum", num, -5, 5},
      {"equal", all, -3, 3},
      {"not_equal", all, -3, 3},
      {"less", num, -3, 3},
      {"less_equal", num, -3, 3},
      {"greater", num, -3, 3},
      {"greater_equal", num, -3, 3},
      {"logical_and", {dtype::boolean}, 0, 1},
      {"logical_or", {dtype::boolean}, 0, 1},
      {"relu_grad", num, -5, 5},
      {"mod", num, 1, 60},  // no zero divisor: the CPU fails
  };
  return cases;
}

// Pairs of operand shapes: equal, scalar against tensor both ways, NumPy broadcasting in
// several dimensions, ranks that differ, and empty results.
const std::vector<std::pair<shape, shape>> binary_shapes{{{7}, {7}},
                                                         {{}, {}},
                                                         {{}, {5, 3}},
                                                         {{5, 3}, {}},
                                                         {{1}, {300}},
                                                         {{4, 1, 6}, {5, 1}},
                                                         {{3, 1}, {1, 4}},
                                                         {{2, 3, 4, 5}, {4, 1}},
                                                         {{0, 3}, {3}},
                                                         {{2, 0}, {1, 1}},
                                                         {{3, 5, 130}, {3, 5, 130}}};

TEST(CudaBinary, EveryOpAndTypeMatchesTheCpuWithBroadcasting) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 400;
  for (const auto& c : binary_cases()) {
    for (const dtype t : c.types) {
      for (const auto& [sa, sb] : binary_shapes) {
        const tensor a = random(t, sa, ++seed, c.lo, c.hi);
        const tensor b = random(t, sb, ++seed, c.lo, c.hi);
        const auto n = op_node::of(c.op, {a, b});
        expect_gpu_matches_cpu(n, {a, b}, label(c.op, t, to_string(sa) + " with " + to_string(sb)));
      }
    }
  }
}

TEST(CudaBinary, NonContiguousOperandsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 500;
  for (const auto& c : binary_cases()) {
    for (const dtype t : c.types) {
      const tensor a = transposed_storage(random(t, {6, 40}, ++seed, c.lo, c.hi));
      const tensor b = spread(random(t, {6, 40}, ++seed, c.lo, c.hi), 2, 1);
      const tensor row = spread(random(t, {40}, ++seed, c.lo, c.hi), 3, 2);
      expect_gpu_matches_cpu(op_node::of(c.op, {a, b}), {a, b}, label(c.op, t, "strided"));
      expect_gpu_matches_cpu(op_node::of(c.op, {a, row}), {a, row},
                             label(c.op, t, "strided with a strided row"));
      const tensor col = broadcast_view(random(t, {6, 1}, ++seed, c.lo, c.hi), {6, 40});
      expect_gpu_matches_cpu(op_node::of(c.op, {col, b}), {col, b},
                             label(c.op, t, "stride-0 view with strided"));
    }
  }
}

TEST(CudaBinary, NaNAndInfinitiesMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v{0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 2.5};
  std::vector<double> a;
  std::vector<double> b;
  for (double x : v) {
    for (double y : v) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  const shape s{static_cast<std::int64_t>(a.size())};
  for (const auto& c : binary_cases()) {
    for (const dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
      if (std::find(c.types.begin(), c.types.end(), t) == c.types.end()) continue;
      const tensor x = make(t, s, a);
      const tensor y = make(t, s, b);
      expect_gpu_matches_cpu(op_node::of(c.op, {x, y}), {x, y}, label(c.op, t, "special"));
    }
  }
}

TEST(CudaBinary, IntegerArithmeticWrapsAndTruncatesAsOnTheCpu) {
  LOOM_REQUIRE_GPU();
  const tensor a = make(dtype::i32, {5}, {2147483647.0, -2147483648.0, -7, 7, -2147483648.0});
  const tensor b = make(dtype::i32, {5}, {1, -1, 2, -2, -1});
  for (const std::string op : {"add", "sub", "mul", "div"}) {
    expect_gpu_matches_cpu(op_node::of(op, {a, b}), {a, b}, op + " int32 edges");
  }
  const tensor c = make(dtype::i8, {4}, {127, -128, -7, 100});
  const tensor d = make(dtype::i8, {4}, {1, -1, 2, 3});
  for (const std::string op : {"add", "sub", "mul", "div"}) {
    expect_gpu_matches_cpu(op_node::of(op, {c, d}), {c, d}, op + " int8 edges");
  }
}

// Note [cuda value checks]: the GPU does not stop for a zero divisor; it gives 0 there.
TEST(CudaBinary, IntegerDivisionByZeroGivesZeroOnTheGpu) {
  LOOM_REQUIRE_GPU();
  const tensor a = make(dtype::i64, {3}, {5, -6, 7});
  const tensor b = make(dtype::i64, {3}, {0, 2, 0});
  const auto n = op_node::of("div", {a, b});
  const auto out = n.run(test_gpu(), {to_gpu(a), to_gpu(b)});
  EXPECT_EQ(values(to_host(out[0])), (std::vector<double>{0, -3, 0}));
}

TEST(CudaBinary, AResultTakesTheBufferOfAnInputHeldByTheNodeAlone) {
  LOOM_REQUIRE_GPU();
  const tensor a = random(dtype::f32, {4, 50}, 600);
  const tensor b = random(dtype::f32, {50}, 601);
  const auto n = op_node::of("mul", {a, b});
  const auto want = n.run(reference_cpu(), {a, b});
  // The broadcast operand cannot take the result; the full-size one can.
  tensor da = to_gpu(a);
  const void* storage = da.raw_data();
  std::vector<tensor> inputs;
  inputs.push_back(to_gpu(b));
  inputs.insert(inputs.begin(), std::move(da));
  const auto out = n.run(test_gpu(), std::move(inputs));
  EXPECT_EQ(out[0].raw_data(), storage);
  expect_same(to_host(out[0]), want[0], tolerance_for(dtype::f32), "mul in place");
}

TEST(CudaBinary, EightDimensionsThatDoNotMergeMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const shape xs{2, 1, 3, 1, 2, 1, 3, 1};
  const shape ys{1, 2, 1, 3, 1, 2, 1, 3};
  for (const dtype t : {dtype::f32, dtype::i64}) {
    const tensor x = random(t, xs, 700);
    const tensor y = random(t, ys, 701);
    expect_gpu_matches_cpu(op_node::of("add", {x, y}), {x, y}, label("add", t, "rank 8"));
  }
}

// More than 2^32 output elements take the kernels' 64-bit index path. The values are
// checked against a formula on rows copied back through slice.
TEST(CudaBinary, MoreThanTwoToThe32ElementsUse64BitIndices) {
  LOOM_REQUIRE_GPU();
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (std::size_t{16} << 30)) GTEST_SKIP() << "needs 16 GiB of free GPU memory";
  constexpr std::int64_t n = 65537;  // n * n = 2^32 + 2^17 + 1
  std::vector<double> col(n);
  std::vector<double> row(n);
  for (std::int64_t i = 0; i < n; ++i) {
    col[static_cast<std::size_t>(i)] = static_cast<double>(i % 251);
    row[static_cast<std::size_t>(i)] = static_cast<double>((i * 7) % 256);
  }
  const tensor a = make(dtype::u8, {n, 1}, col);
  const tensor b = make(dtype::u8, {1, n}, row);
  const auto add = op_node::of("add", {a, b});
  const tensor sum = add.run(test_gpu(), {to_gpu(a), to_gpu(b)}).at(0);
  ASSERT_EQ(sum.num_elements(), n * n);
  for (const std::int64_t r : {std::int64_t{0}, std::int64_t{1}, n / 2, n - 2, n - 1}) {
    const op_node slice("slice", {{dtype::u8, {n, n}}},
                        {{"begin", ints{r, 0}}, {"size", ints{1, n}}});
    const auto got = values(to_host(slice.run(test_gpu(), {sum}).at(0)));
    ASSERT_EQ(got.size(), static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; j += 997) {
      const double want = static_cast<double>((r % 251 + (j * 7) % 256) % 256);
      ASSERT_EQ(got[static_cast<std::size_t>(j)], want) << "row " << r << " column " << j;
    }
    ASSERT_EQ(got.back(), static_cast<double>((r % 251 + ((n - 1) * 7) % 256) % 256));
  }
}

// ---- on the GPU: cast and where --------------------------------------------------------------

TEST(CudaCast, EveryPairOfTypesMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Values that exercise truncation, saturation, wrapping and rounding to 16-bit floats.
  const std::vector<double> v{0.0,     -0.0,  1.0,   -1.0,  2.5,   -2.5, 127.5, 128.0,
                              -129.0,  255.0, 256.0, 300.7, -1e10, 1e10, 3e38,  65504.0,
                              70000.0, 1e-8,  0.1,   inf,   -inf,  nan,  4e9,   -3e9};
  const shape s{static_cast<std::int64_t>(v.size())};
  std::uint64_t seed = 800;
  for (const dtype from : all) {
    for (const dtype to : all) {
      const tensor x = make(from, s, v);
      const auto n = op_node::of("cast", {x}, {{"to", to}});
      const std::string what = std::string("cast ") + to_string(from) + " to " + to_string(to);
      expect_gpu_matches_cpu(n, {x}, what);
      const tensor r = transposed_storage(random(from, {9, 13}, ++seed, -300, 300));
      expect_gpu_matches_cpu(op_node::of("cast", {r}, {{"to", to}}), {r}, what + " strided");
      const tensor e = random(from, {0, 4}, ++seed);
      expect_gpu_matches_cpu(op_node::of("cast", {e}, {{"to", to}}), {e}, what + " empty");
    }
  }
}

TEST(CudaWhere, EveryTypeMatchesTheCpuWithBroadcasting) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 900;
  const std::vector<std::array<shape, 3>> shapes{
      {shape{6, 7}, shape{6, 7}, shape{6, 7}}, {shape{}, shape{6, 7}, shape{}},
      {shape{6, 1}, shape{1, 7}, shape{7}},    {shape{2, 1, 7}, shape{3, 1}, shape{}},
      {shape{0, 7}, shape{7}, shape{7}},       {shape{300}, shape{300}, shape{1}}};
  for (const dtype t : all) {
    for (const auto& s : shapes) {
      const tensor c = random(dtype::boolean, s[0], ++seed);
      const tensor x = random(t, s[1], ++seed, -50, 50);
      const tensor y = random(t, s[2], ++seed, -50, 50);
      expect_gpu_matches_cpu(op_node::of("where", {c, x, y}), {c, x, y},
                             label("where", t, to_string(s[0])));
    }
    const tensor c = transposed_storage(random(dtype::boolean, {5, 9}, ++seed));
    const tensor x = spread(random(t, {5, 9}, ++seed, -50, 50), 2, 1);
    const tensor y = transposed_storage(random(t, {5, 9}, ++seed, -50, 50));
    expect_gpu_matches_cpu(op_node::of("where", {c, x, y}), {c, x, y},
                           label("where", t, "strided"));
  }
}

// ---- on the GPU: generators ------------------------------------------------------------------

TEST(CudaGenerators, FillZerosOnesAndRangeMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : all) {
    for (const shape& s : {shape{}, shape{0}, shape{3, 700}}) {
      for (const double value : {2.75, -1.5, 1e10, -300.0}) {
        const op_node fill("fill", {}, {{"dtype", t}, {"shape", s}, {"value", value}});
        expect_gpu_matches_cpu(fill, {}, label("fill", t, std::to_string(value)));
      }
      expect_gpu_matches_cpu(op_node("zeros", {}, {{"dtype", t}, {"shape", s}}), {},
                             label("zeros", t, to_string(s)));
      expect_gpu_matches_cpu(op_node("ones", {}, {{"dtype", t}, {"shape", s}}), {},
                             label("ones", t, to_string(s)));
    }
  }
  graph g;
  graph_builder b(g);
  for (const dtype t : num) {
    // Built through ops::range, which works out the output's length.
    const output r1 = ops::range(b, -3.5, 1000.0, 0.25, t);
    const output r2 = ops::range(b, 10.0, -5.0, -1.5, t);
    for (const output& r : {r1, r2}) {
      const node& n = r.producer();
      const auto make_kernel = [&](device& d) {
        return kernel_registry::global().get(n, d.type()).create(kernel_construction(n, d, &g));
      };
      std::vector<tensor> none;
      std::vector<tensor> want(1);
      std::vector<tensor> got(1);
      variable_store vars;
      kernel_context cctx(n, reference_cpu(), none, want, &vars, nullptr);
      make_kernel(reference_cpu())->compute(cctx);
      kernel_context gctx(n, test_gpu(), none, got, &vars, nullptr);
      make_kernel(test_gpu())->compute(gctx);
      // Computed in double without fused multiply-adds on both: equal, not merely close.
      expect_same(to_host(got[0]), want[0], {}, label("range", t, ""));
    }
  }
}

// ---- through a session -----------------------------------------------------------------------

TEST(CudaElementwiseSession, NodesPlacedOnTheGpuComputeWhatTheCpuDoes) {
  LOOM_REQUIRE_GPU();
  const auto build = [](const std::string& device) {
    graph g;
    graph_builder b(g);
    const node_options on{.name = "", .device = device};
    const output x = ops::placeholder(b, "x", dtype::f32, {-1, 64});
    const output bias = ops::placeholder(b, "bias", dtype::f32, {64});
    const output h = ops::gelu(ops::add(ops::mul(x, x, on), bias, on), on);
    const output m = ops::where(ops::greater(h, bias, on), h, ops::neg(h, on), on);
    ops::cast(m, dtype::f16, {.name = "y", .device = device});
    return g;
  };
  const tensor x = random(dtype::f32, {33, 64}, 1000);
  const tensor bias = random(dtype::f32, {64}, 1001);
  // Without passes, so that the nodes run as written (not fused into one kernel).
  session_options options;
  options.passes.enabled = false;
  session on_gpu(build("cuda:0"), options);
  session on_cpu(build("cpu:0"), options);
  const auto got = on_gpu.run({{"x", x}, {"bias", bias}}, {"y"});
  const auto want = on_cpu.run({{"x", x}, {"bias", bias}}, {"y"});
  bool placed_on_gpu = false;
  for (const auto& d : on_gpu.explain_placement({"x", "bias"}, {"y"})) {
    if (d.node == "y") placed_on_gpu = d.device.find("CUDA") != std::string::npos;
  }
  EXPECT_TRUE(placed_on_gpu);
  // A fetch left on the GPU: wait for the session's streams before reading it.
  if (got[0].device().type == device_type::cuda) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const tensor got_host = got[0].device().type == device_type::cuda ? to_host(got[0]) : got[0];
  expect_same(got_host, want[0], tolerance_for(dtype::f16), "session");
}

}  // namespace
}  // namespace loom
