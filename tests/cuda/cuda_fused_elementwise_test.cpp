// The CUDA kernel of fused_elementwise: its code generation (fused_codegen.hpp) and index
// layout, checked without a GPU -- every op and ~150 random expressions must compile with
// NVRTC for sm_90 with no error and no warning, the source must hold the CPU kernel's
// constants bit for bit and loom::rules' NaN rules, 16-bit types round every value, bad
// layouts are rejected -- and, on a GPU, the kernel against the CPU kernel of the same node:
// bit for bit for the ops built from IEEE arithmetic (the generated code is the CPU's math
// compiled without FMA contraction), within a few ulp for those that call libm / libdevice
// (log, erf, erfc, pow, float64 exp and tanh); and fused groups against the unfused CUDA
// kernels over special values, bit for bit.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/fused_codegen.hpp"
#include "backends/cuda/nvrtc_compiler.hpp"
#include "cuda/cuda_test_support.hpp"
#include "kernel/common/elementwise_rules.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/fused_expr.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using ints = std::vector<std::int64_t>;
using cuda::fused_input_kind;
using cuda::fused_layout;

const std::vector<dtype> float_types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// ---- host tensors
// --------------------------------------------------------------------------------

void store(dtype t, void* base, std::int64_t i, double v) {
  switch (t) {
    case dtype::f32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case dtype::f64:
      static_cast<double*>(base)[i] = v;
      break;
    case dtype::f16:
      static_cast<half*>(base)[i] = half(static_cast<float>(v));
      break;
    default:
      static_cast<bfloat16*>(base)[i] = bfloat16(static_cast<float>(v));
      break;
  }
}

double load(dtype t, const void* base, std::int64_t i) {
  switch (t) {
    case dtype::f32:
      return static_cast<const float*>(base)[i];
    case dtype::f64:
      return static_cast<const double*>(base)[i];
    case dtype::f16:
      return static_cast<double>(static_cast<float>(static_cast<const half*>(base)[i]));
    default:
      return static_cast<double>(static_cast<float>(static_cast<const bfloat16*>(base)[i]));
  }
}

tensor make(dtype t, const shape& s, const std::vector<double>& v) {
  tensor out = memory::host_tensor(t, s);
  EXPECT_EQ(static_cast<std::int64_t>(v.size()), s.num_elements());
  for (std::size_t i = 0; i < v.size(); ++i)
    store(t, out.raw_data(), static_cast<std::int64_t>(i), v[i]);
  return out;
}

tensor random(dtype t, const shape& s, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
  for (auto& x : v) x = dist(rng);
  return make(t, s, v);
}

// The elements of a host tensor (any strides) in row-major order.
std::vector<double> values(const tensor& x) {
  const std::size_t r = x.rank();
  std::vector<double> out(static_cast<std::size_t>(x.num_elements()));
  std::vector<std::int64_t> idx(r, 0);
  for (std::size_t f = 0; f < out.size(); ++f) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < r; ++d) off += idx[d] * x.strides()[d];
    out[f] = load(x.type(), x.raw_data(), off);
    for (std::size_t d = r; d-- > 0;) {
      if (++idx[d] < x.shape()[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The row-major storage of `x` with its last two dims swapped, and the strides that view it
// back as x's shape: a non-contiguous layout of the same elements.
std::pair<std::vector<double>, shape> transposed_storage(const tensor& x, shape& stored) {
  const std::size_t r = x.rank();
  stored = x.shape();
  std::swap(stored[r - 1], stored[r - 2]);
  const auto v = values(x);
  std::vector<double> storage(v.size());
  const std::int64_t rows = x.shape()[r - 2];
  const std::int64_t cols = x.shape()[r - 1];
  const std::int64_t mats = x.num_elements() / std::max<std::int64_t>(1, rows * cols);
  for (std::int64_t m = 0; m < mats; ++m) {
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        storage[static_cast<std::size_t>(m * rows * cols + j * rows + i)] =
            v[static_cast<std::size_t>(m * rows * cols + i * cols + j)];
      }
    }
  }
  shape strides = contiguous_strides(stored);
  std::swap(strides[r - 1], strides[r - 2]);
  return {storage, strides};
}

// ---- random expressions -----------------------------------------------------------------------

fused_expr random_expr(std::mt19937_64& rng, int n_in, ints& results) {
  fused_expr e;
  e.num_inputs = n_in;
  const int n = 1 + static_cast<int>(rng() % 30);
  for (int k = 0; k < n; ++k) {
    fused_instr in;
    in.op = static_cast<ew_op>(rng() % num_ew_ops);
    for (int j = 0; j < info(in.op).arity; ++j) {
      if (rng() % 6 == 0) {
        in.args[static_cast<std::size_t>(j)] = {-1,
                                                std::uniform_real_distribution<double>(-3, 3)(rng)};
      } else {
        // Mostly recent values, so chains get deep.
        const int defined = n_in + k;
        const int back = static_cast<int>(rng() % static_cast<std::uint64_t>(std::min(defined, 4)));
        const int v = rng() % 3 == 0 ? static_cast<int>(rng() % static_cast<std::uint64_t>(defined))
                                     : defined - 1 - back;
        in.args[static_cast<std::size_t>(j)] = {v, 0.0};
      }
    }
    e.instrs.push_back(in);
  }
  e.results = {e.num_values() - 1};
  const int extra = static_cast<int>(rng() % 3);
  for (int j = 0; j < extra; ++j) {
    e.results.push_back(
        static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(e.num_values())));
  }
  results.assign(e.results.begin(), e.results.end());
  return e;
}

// ---- code generation (no GPU) -------------------------------------------------------------------

// Compiles for sm_90 and expects neither an error nor a warning.
void expect_compiles_cleanly(const std::string& src, const std::string& what) {
  try {
    const auto bin = cuda::nvrtc_compile(src, "sm_90", "fused_test.cu");
    EXPECT_TRUE(bin->log.empty()) << what << ": NVRTC says\n" << bin->log << "\nfor\n" << src;
    EXPECT_TRUE(bin->is_cubin) << what;
    EXPECT_FALSE(bin->image.empty()) << what;
  } catch (const cuda_error& e) {
    ADD_FAILURE() << what << ": " << e.what() << "\nfor\n" << src;
  }
}

fused_expr parse(const std::string& text, std::int32_t n, const ints& results) {
  return fused_expr::parse(text, n, results);
}

TEST(FusedCodegen, EveryOpCompilesWithoutWarningsForEveryType) {
  // Literals of every awkward kind: zeros of both signs (which NVRTC warns about as
  // divisors when printed as literals), a value that is infinite in float, subnormals.
  // Each type takes another input layout, so every kind of load is compiled with each op.
  const std::vector<std::vector<fused_input_kind>> layouts = {
      {fused_input_kind::dense, fused_input_kind::strided},
      {fused_input_kind::strided, fused_input_kind::scalar},
      {fused_input_kind::scalar, fused_input_kind::dense},
      {fused_input_kind::strided, fused_input_kind::strided}};
  for (std::size_t ti = 0; ti < float_types.size(); ++ti) {
    const dtype t = float_types[ti];
    for (int i = 0; i < num_ew_ops; ++i) {
      const auto op = static_cast<ew_op>(i);
      const std::string name(info(op).name);
      const auto& kinds = layouts[(ti + static_cast<std::size_t>(i)) % layouts.size()];
      const bool strided = std::count(kinds.begin(), kinds.end(), fused_input_kind::strided) > 0;
      const fused_layout l{t, kinds, strided ? 1 + static_cast<int>(ti) : 0};
      const auto e =
          info(op).arity == 1
              ? parse(fmt::format("{0}(%0); {0}(%1); add(%2, %3); {0}(%4)", name), 2, {5, 2})
              : parse(fmt::format("{0}(%0, %1); {0}(%2, 0); {0}(-0, %3); {0}(%4, 1e300); "
                                  "{0}(1e-310, %5); {0}(%6, 1e-40)",
                                  name),
                      2, {7, 2, 1});
      expect_compiles_cleanly(cuda::generate_cuda_source(e, l, "k"),
                              fmt::format("{} {}", name, cuda::layout_key(l)));
    }
  }
}

TEST(FusedCodegen, RandomExpressionsCompileWithoutWarnings) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 150; ++trial) {
    const int n_in = 1 + static_cast<int>(rng() % 4);
    ints results;
    const fused_expr e = random_expr(rng, n_in, results);
    const auto live = cuda::live_values(e);
    fused_layout l;
    l.type = float_types[static_cast<std::size_t>(trial) % float_types.size()];
    bool any_strided = false;
    for (int i = 0; i < n_in; ++i) {
      fused_input_kind k = fused_input_kind::unused;
      if (live[static_cast<std::size_t>(i)]) {
        k = static_cast<fused_input_kind>(1 + rng() % 3);  // scalar, dense or strided
      }
      any_strided = any_strided || k == fused_input_kind::strided;
      l.inputs.push_back(k);
    }
    l.rank = any_strided ? 1 + static_cast<int>(rng() % 4) : 0;
    const std::string src = cuda::generate_cuda_source(e, l, "loom_fused_elementwise");
    expect_compiles_cleanly(src, fmt::format("trial {} {} [{}] {}", trial, e.to_string(),
                                             fmt::join(results, ", "), cuda::layout_key(l)));
  }
}

std::string hex(float x) {
  return fmt::format("{:a}f", x);
}
std::string hex(double x) {
  return fmt::format("{:a}", x);
}

TEST(FusedCodegen, TheSourceHoldsTheCpuKernelsMath) {
  const fused_layout dense32{dtype::f32, {fused_input_kind::dense}, 0};
  const fused_layout dense64{dtype::f64, {fused_input_kind::dense}, 0};
  // Literals are exact: rounded to float once for the float compute type, as the CPU
  // kernel's static_cast<float>, and printed as hex floats (independently here by printf).
  char buf[64];
  std::snprintf(buf, sizeof buf, "%af", static_cast<double>(0.1f));
  const auto s32 = cuda::generate_cuda_source(parse("mul(%0, 0.1)", 1, {1}), dense32, "k");
  EXPECT_NE(s32.find(buf), std::string::npos) << s32;
  std::snprintf(buf, sizeof buf, "%a", 0.1);
  const auto s64 = cuda::generate_cuda_source(parse("mul(%0, 0.1)", 1, {1}), dense64, "k");
  EXPECT_NE(s64.find(buf), std::string::npos) << s64;
  // 1e300 is infinite in float; -1e-300 is -0 in float; 1e-40 is a float subnormal.
  const auto lits = cuda::generate_cuda_source(
      parse("add(%0, 1e300); mul(%1, -1e-300); add(%2, 1e-40)", 1, {3}), dense32, "k");
  EXPECT_NE(lits.find("__uint_as_float(0x7f800000u)"), std::string::npos) << lits;
  EXPECT_NE(lits.find("__uint_as_float(0x80000000u)"), std::string::npos) << lits;
  EXPECT_NE(
      lits.find(fmt::format("__uint_as_float(0x{:08x}u)", std::bit_cast<std::uint32_t>(1e-40f))),
      std::string::npos)
      << lits;
  // float32 exp, tanh, sigmoid are the CPU's polynomials (the Cephes constants); float64
  // calls exp / tanh.
  const auto e32 =
      cuda::generate_cuda_source(parse("exp(%0); tanh(%1); sigmoid(%2)", 1, {3}), dense32, "k");
  for (const char* part : {"loom_exp(", "loom_tanh(", "loom_sigmoid(", "1.9875691500e-4f",
                           "-5.70498872745e-3f", "12582912.0f"}) {
    EXPECT_NE(e32.find(part), std::string::npos) << part << " in\n" << e32;
  }
  const auto e64 =
      cuda::generate_cuda_source(parse("exp(%0); tanh(%1); sigmoid(%2)", 1, {3}), dense64, "k");
  EXPECT_EQ(e64.find("loom_exp"), std::string::npos) << e64;
  for (const char* part : {"exp((v0))", "tanh((v1))", "1.0 / (1.0 + exp(-(v2)))", "double"}) {
    EXPECT_NE(e64.find(part), std::string::npos) << part << " in\n" << e64;
  }
  // gelu's constants: sqrt(2) in the compute type.
  const auto g32 = cuda::generate_cuda_source(parse("gelu(%0)", 1, {1}), dense32, "k");
  EXPECT_NE(g32.find(hex(static_cast<float>(std::sqrt(2.0)))), std::string::npos) << g32;
  EXPECT_NE(g32.find("erfcf("), std::string::npos) << g32;
  const auto gt32 = cuda::generate_cuda_source(parse("gelu_tanh(%0)", 1, {1}), dense32, "k");
  EXPECT_NE(gt32.find(hex(static_cast<float>(std::sqrt(2.0 / 3.141592653589793)))),
            std::string::npos)
      << gt32;
  EXPECT_NE(gt32.find(hex(0.044715f)), std::string::npos) << gt32;
}

// The NaN rules are loom::rules' own (Note [NaN rules]): the program carries their source,
// the very text the CPU and nvcc kernels compile, and calls them; no fmaxf / fminf (which
// drop a NaN). float16 / bfloat16 round every value to the type, literals included, as
// the unfused kernels store them.
TEST(FusedCodegen, NanRulesAreSharedAndHalfTypesRoundEveryValue) {
  const auto e = parse(
      "maximum(%0, %1); minimum(%2, 0.1); relu(%3); relu_grad(%4, %0); maximum(-0, %5)", 2, {6});
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    const fused_layout l{t, {fused_input_kind::dense, fused_input_kind::dense}, 0};
    const std::string src = cuda::generate_cuda_source(e, l, "k");
    EXPECT_NE(src.find(rules::elementwise_rules_source), std::string::npos) << src;
    for (const char* call : {"loom::rules::maximum(", "loom::rules::minimum(",
                             "loom::rules::relu(", "loom::rules::relu_grad("}) {
      EXPECT_NE(src.find(call), std::string::npos) << call << " in\n" << src;
    }
    EXPECT_EQ(src.find("fmax"), std::string::npos) << src;
    EXPECT_EQ(src.find("fmin"), std::string::npos) << src;
    const bool half_type = t == dtype::f16 || t == dtype::bf16;
    std::size_t rounded = 0;
    for (std::size_t at = src.find("loom_load(loom_store("); at != std::string::npos;
         at = src.find("loom_load(loom_store(", at + 1)) {
      ++rounded;
    }
    EXPECT_EQ(rounded, half_type ? e.instrs.size() : 0u) << src;
    // 0.1 as the type holds it.
    const float lit = t == dtype::f16    ? static_cast<float>(half(0.1f))
                      : t == dtype::bf16 ? static_cast<float>(bfloat16(0.1f))
                                         : 0.1f;
    if (t != dtype::f64) {
      EXPECT_NE(src.find(hex(lit)), std::string::npos) << src;
    }
    expect_compiles_cleanly(src, cuda::layout_key(l));
  }
}

TEST(FusedCodegen, OnlyWhatTheResultsNeedIsGenerated) {
  // %2 = exp(%0) is dead; input 1 is read by nothing: no exp, no parameter for it.
  const auto e = parse("exp(%0); neg(%0); neg(%1)", 2, {3});
  const auto live = cuda::live_values(e);
  EXPECT_EQ(live, (std::vector<bool>{true, false, false, true, false}));
  const auto src = cuda::generate_cuda_source(
      e, {dtype::f32, {fused_input_kind::dense, fused_input_kind::unused}, 0}, "k");
  EXPECT_EQ(src.find("v2 ="), std::string::npos) << src;
  EXPECT_EQ(src.find("loom_exp"), std::string::npos) << src;
  EXPECT_EQ(src.find("in1"), std::string::npos) << src;
  EXPECT_NE(src.find("const float* in0"), std::string::npos) << src;
  // Results that are inputs and one value twice: three stores, half types rounded by
  // loom_store.
  const auto multi = cuda::generate_cuda_source(parse("neg(%0)", 1, {1, 0, 1}),
                                                {dtype::f16, {fused_input_kind::strided}, 2}, "k");
  for (const char* part :
       {"out0[i] = loom_store(v1);", "out1[i] = loom_store(v0);", "out2[i] = loom_store(v1);",
        "const unsigned short* in0", "long long size[2]; long long stride[1][2];"}) {
    EXPECT_NE(multi.find(part), std::string::npos) << part << " in\n" << multi;
  }
}

template <class F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected loom::invalid_argument";
  } catch (const invalid_argument& e) {
    const std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m << " lacks " << p;
  }
}

TEST(FusedCodegen, BadLayoutsAndNamesAreRejected) {
  const auto e = parse("add(%0, %1)", 2, {2});
  const auto d = fused_input_kind::dense;
  const auto x = fused_input_kind::strided;
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(e, {dtype::f32, {d}, 0}, "k");
      },
      {"layout of 1 inputs", "expression of 2"});
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(e, {dtype::f32, {d, fused_input_kind::unused}, 0}, "k");
      },
      {"input 1 is read"});
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(e, {dtype::f32, {d, x}, 0}, "k");
      },
      {"rank 0", "1 strided"});
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(e, {dtype::f32, {d, d}, 2}, "k");
      },
      {"rank 2", "0 strided"});
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(e, {dtype::i32, {d, d}, 0}, "k");
      },
      {"int32"});
  for (const char* name : {"", "1k", "a-b", "k k"}) {
    expect_invalid(
        [&] {
          (void)cuda::generate_cuda_source(e, {dtype::f32, {d, d}, 0}, name);
        },
        {"kernel name", "not an identifier"});
  }
  fused_expr bad = e;
  bad.results = {7};
  expect_invalid(
      [&] {
        (void)cuda::generate_cuda_source(bad, {dtype::f32, {d, d}, 0}, "k");
      },
      {"result"});
}

// ---- index layout (no GPU)
// -----------------------------------------------------------------------

cuda::fused_index plan(const std::string& text, const std::vector<tensor>& in, const shape& out,
                       const ints& results) {
  std::vector<const tensor*> ptrs;
  for (const auto& t : in) ptrs.push_back(&t);
  return cuda::plan_fused_index(parse(text, static_cast<std::int32_t>(in.size()), results),
                                dtype::f32, ptrs, out);
}

TEST(FusedIndex, InputsAreDenseScalarStridedOrUnused) {
  const tensor a = random(dtype::f32, {6, 37}, 1);
  const tensor row = random(dtype::f32, {37}, 2);
  const tensor one = random(dtype::f32, {1, 1}, 3);
  const tensor unread = random(dtype::f32, {6, 37}, 4);  // dense, but not read
  const auto ix = plan("add(%0, %1); mul(%4, %2)", {a, row, one, unread}, {6, 37}, {5});
  EXPECT_EQ(ix.layout.inputs, (std::vector{fused_input_kind::dense, fused_input_kind::strided,
                                           fused_input_kind::scalar, fused_input_kind::unused}));
  EXPECT_EQ(ix.layout.rank, 2);
  EXPECT_EQ(ix.sizes, (ints{6, 37}));
  ASSERT_EQ(ix.strides.size(), 1u);
  EXPECT_EQ(ix.strides[0], (ints{0, 1}));  // the row broadcasts over the 6 rows
  // Everything dense: no index at all.
  const auto dense = plan("add(%0, %1)", {a, random(dtype::f32, {1, 6, 37}, 5)}, {1, 6, 37}, {2});
  EXPECT_EQ(dense.layout.rank, 0);
  EXPECT_TRUE(dense.sizes.empty());
  EXPECT_EQ(dense.layout.inputs, (std::vector{fused_input_kind::dense, fused_input_kind::dense}));
}

TEST(FusedIndex, DimsCollapseWhereEveryStridedInputIsContiguousAcrossThem) {
  // [5, 6] broadcast over [4, 5, 6]: the inner two dims merge (stride 1 over 30).
  const auto a =
      plan("add(%0, %1)", {random(dtype::f32, {4, 5, 6}, 1), random(dtype::f32, {5, 6}, 2)},
           {4, 5, 6}, {2});
  EXPECT_EQ(a.sizes, (ints{4, 30}));
  EXPECT_EQ(a.strides, (std::vector<ints>{{0, 1}}));
  // A column [4, 1, 1] over [4, 5, 6]: the outer dim alone, then the broadcast ones merged.
  const auto b =
      plan("add(%0, %1)", {random(dtype::f32, {4, 5, 6}, 1), random(dtype::f32, {4, 1, 1}, 2)},
           {4, 5, 6}, {2});
  EXPECT_EQ(b.sizes, (ints{4, 30}));
  EXPECT_EQ(b.strides, (std::vector<ints>{{1, 0}}));
  // Dims of size 1 drop out; two strided inputs must both be contiguous across a merge.
  const auto c =
      plan("add(%0, %1)", {random(dtype::f32, {3, 1, 4}, 1), random(dtype::f32, {1, 1, 4}, 2)},
           {3, 1, 4}, {2});
  EXPECT_EQ(c.layout.inputs, (std::vector{fused_input_kind::dense, fused_input_kind::strided}));
  EXPECT_EQ(c.sizes, (ints{3, 4}));
  EXPECT_EQ(c.strides, (std::vector<ints>{{0, 1}}));
  const auto d =
      plan("add(%0, %1)", {random(dtype::f32, {2, 3, 1}, 1), random(dtype::f32, {1, 3, 4}, 2)},
           {2, 3, 4}, {2});
  EXPECT_EQ(d.sizes, (ints{2, 3, 4}));
  EXPECT_EQ(d.strides, (std::vector<ints>{{3, 1, 0}, {0, 4, 1}}));
  // A one-element output with a strided input: one dim of size 1.
  const tensor big = random(dtype::f32, {2, 2}, 7);
  const tensor corner = tensor::strided(big.buf(), dtype::f32, {1, 1}, {2, 1}, 3);
  const auto e = plan("add(%0, 1)", {corner}, {1, 1}, {1});
  EXPECT_EQ(e.layout.inputs, (std::vector{fused_input_kind::scalar}));
}

TEST(FusedIndex, ViewsUseTheirOwnStrides) {
  // A transposed [3, 4] view (strides 1, 3) and an offset dense view.
  const tensor storage = random(dtype::f32, {2, 4, 3}, 1);
  const tensor transposed = tensor::strided(storage.buf(), dtype::f32, {3, 4}, {1, 3}, 0);
  const tensor second = tensor::strided(storage.buf(), dtype::f32, {3, 4}, {4, 1}, 12);
  const auto ix = plan("sub(%0, %1)", {transposed, second}, {3, 4}, {2});
  EXPECT_EQ(ix.layout.inputs, (std::vector{fused_input_kind::strided, fused_input_kind::dense}));
  EXPECT_EQ(ix.sizes, (ints{3, 4}));
  EXPECT_EQ(ix.strides, (std::vector<ints>{{1, 3}}));
  // A stride-0 view of the full shape is strided, not dense.
  const tensor row = random(dtype::f32, {4}, 2);
  const tensor bview = tensor::strided(row.buf(), dtype::f32, {3, 4}, {0, 1}, 0);
  const auto bx = plan("neg(%0)", {bview}, {3, 4}, {1});
  EXPECT_EQ(bx.layout.inputs, (std::vector{fused_input_kind::strided}));
  EXPECT_EQ(bx.strides, (std::vector<ints>{{0, 1}}));
}

TEST(FusedIndex, InputsThatDoNotBroadcastAreRejected) {
  expect_invalid(
      [&] {
        (void)plan("add(%0, %1)", {random(dtype::f32, {2, 3}, 1), random(dtype::f32, {4}, 2)},
                   {2, 3}, {2});
      },
      {"input 1", "[4]", "does not broadcast", "[2, 3]"});
  expect_invalid(
      [&] {
        (void)plan("neg(%0)", {random(dtype::f32, {2, 3}, 1)}, {3}, {1});
      },
      {"input 0", "[2, 3]"});
}

// Many strided inputs of high rank: parameters over 4 KiB, which the kernel avoids by
// reading dense copies (checked on a GPU below).
std::vector<tensor> many_strided_inputs(dtype t, int n, int rank, shape& out) {
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank), 2);
  out = shape(dims);
  std::vector<tensor> in;
  for (int i = 0; i < n; ++i) {
    // Alternate dims broadcast, so that no two dims merge.
    std::vector<std::int64_t> s = dims;
    for (int d = i % 2; d < rank; d += 2) s[static_cast<std::size_t>(d)] = 1;
    in.push_back(random(t, shape(s), 100 + static_cast<std::uint64_t>(i)));
  }
  return in;
}

std::string sum_of_inputs(int n) {
  std::string text = "add(%0, %1)";
  for (int i = 2; i < n; ++i) text += fmt::format("; add(%{}, %{})", n + i - 2, i);
  return text;
}

TEST(FusedIndex, ParameterBytesCountEveryArgument) {
  const fused_layout l{
      dtype::f32,
      {fused_input_kind::dense, fused_input_kind::strided, fused_input_kind::scalar,
       fused_input_kind::unused, fused_input_kind::strided},
      3};
  // n, 4 input pointers, 2 output pointers, 3 sizes, 2 x 3 strides.
  EXPECT_EQ(cuda::kernel_param_bytes(l, 2), 8u * (1 + 4 + 2 + 3 + 6));
  shape out;
  const auto in = many_strided_inputs(dtype::f32, 40, 12, out);
  const auto ix = plan(sum_of_inputs(40), in, out, {40 + 38});
  EXPECT_EQ(ix.layout.rank, 12);
  EXPECT_GT(cuda::kernel_param_bytes(ix.layout, 1), 4096u);
}

TEST(FusedCudaKernel, IsRegisteredForTheFloatTypes) {
  const auto kernels = kernel_registry::global().kernels_for("fused_elementwise");
  const kernel_def* cuda_kernel = nullptr;
  for (const auto* k : kernels) {
    if (k->device == device_type::cuda) cuda_kernel = k;
  }
  ASSERT_NE(cuda_kernel, nullptr);
  EXPECT_EQ(cuda_kernel->label, "cuda");
  ASSERT_EQ(cuda_kernel->constraints.size(), 1u);
  EXPECT_EQ(cuda_kernel->constraints[0].first, "T");
  EXPECT_EQ(std::set<dtype>(cuda_kernel->constraints[0].second.begin(),
                            cuda_kernel->constraints[0].second.end()),
            std::set<dtype>(float_types.begin(), float_types.end()));
}

// ---- on a GPU: against the CPU kernel ---------------------------------------------------------

// One session's devices: cpu:0 and cuda:0.
struct devices {
  session s{graph{}};
  device& cpu = s.find_device("cpu:0");
  device& gpu = s.find_device("cuda:0");
};

attr_map fused_attrs(const std::string& expr, const ints& results) {
  return {{"M", static_cast<std::int64_t>(results.size())}, {"expr", expr}, {"results", results}};
}

// Runs the fused node's kernel for `d` directly on `inputs` (tensors on d, which the call
// alone holds when moved in) and returns the outputs on d.
std::vector<tensor> run_on(device& d, const std::string& expr, const ints& results,
                           std::vector<tensor> inputs) {
  graph g;
  node_spec spec{.name = "fused", .op = "fused_elementwise", .attrs = fused_attrs(expr, results)};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    spec.inputs.push_back(
        {g.add_node({.name = fmt::format("x{}", i),
                     .op = "placeholder",
                     .attrs = {{"dtype", inputs[i].type()}, {"shape", inputs[i].shape()}}})
             .id,
         0});
  }
  const node& n = g.add_node(std::move(spec));
  auto kernel = kernel_registry::global().get(n, d.id().type).create(kernel_construction(n, d, &g));
  std::vector<tensor> outs(n.outputs.size());
  variable_store variables;
  kernel_context ctx(n, d, inputs, outs, &variables, nullptr);
  kernel->compute(ctx);
  return outs;
}

// How an input is laid out in device memory.
enum class layout_kind { dense, transposed, offset };

// `host` copied to `d` in the given layout (the same elements).
tensor place(device& d, const tensor& host, layout_kind how) {
  if (how == layout_kind::transposed && host.rank() >= 2) {
    shape stored;
    auto [storage, strides] = transposed_storage(host, stored);
    const tensor dense = d.copy_from_host(make(host.type(), stored, storage));
    return tensor::strided(dense.buf(), host.type(), host.shape(), strides, 0);
  }
  if (how == layout_kind::offset) {
    // The second half of a buffer of twice the elements.
    auto v = values(host);
    std::vector<double> twice(v.size(), 99.0);
    twice.insert(twice.end(), v.begin(), v.end());
    const tensor dense = d.copy_from_host(make(host.type(), {2 * host.num_elements()}, twice));
    return tensor::strided(dense.buf(), host.type(), host.shape(), contiguous_strides(host.shape()),
                           host.num_elements());
  }
  return d.copy_from_host(host);
}

tensor to_host(device& d, const tensor& t) {
  return d.copy_to_host(t, memory::host_resource::instance());
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

double rtol_of(dtype t) {
  return t == dtype::f64 ? 1e-12 : t == dtype::f32 ? 2e-5 : t == dtype::f16 ? 2e-3 : 1e-2;
}
double atol_of(dtype t) {
  return t == dtype::f64 ? 1e-12 : t == dtype::f32 ? 1e-6 : 1e-3;
}

// Ops whose CPU and CUDA code are the same IEEE operations: bit for bit.
bool exact_op(ew_op op, dtype t) {
  switch (op) {
    case ew_op::log:
    case ew_op::erf:
    case ew_op::gelu:
    case ew_op::pow:
      return false;
    case ew_op::exp:
    case ew_op::tanh:
    case ew_op::sigmoid:
    case ew_op::gelu_tanh:
      return t != dtype::f64;  // the CPU's polynomials in float; libm / libdevice in double
    default:
      return true;
  }
}

bool exact_expr(const fused_expr& e, dtype t) {
  const auto live = cuda::live_values(e);
  for (std::size_t k = 0; k < e.instrs.size(); ++k) {
    if (live[static_cast<std::size_t>(e.num_inputs) + k] && !exact_op(e.instrs[k].op, t)) {
      return false;
    }
  }
  return true;
}

// ---- comparing ---------------------------------------------------------------------------------

double ref_op(ew_op op, double a, double b) {
  switch (op) {
    case ew_op::neg:
      return -a;
    case ew_op::abs:
      return std::fabs(a);
    case ew_op::exp:
      return std::exp(a);
    case ew_op::log:
      return std::log(a);
    case ew_op::sqrt:
      return std::sqrt(a);
    case ew_op::rsqrt:
      return 1.0 / std::sqrt(a);
    case ew_op::tanh:
      return std::tanh(a);
    case ew_op::sigmoid:
      return 1.0 / (1.0 + std::exp(-a));
    case ew_op::relu:
      return a < 0.0 ? 0.0 : a;
    case ew_op::gelu:
      return 0.5 * a * std::erfc(-a / std::sqrt(2.0));
    case ew_op::gelu_tanh:
      return 0.5 * a * (1.0 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
    case ew_op::erf:
      return std::erf(a);
    case ew_op::square:
      return a * a;
    case ew_op::reciprocal:
      return 1.0 / a;
    case ew_op::add:
      return a + b;
    case ew_op::sub:
      return a - b;
    case ew_op::mul:
      return a * b;
    case ew_op::div:
      return a / b;
    case ew_op::pow:
      return std::pow(a, b);
    case ew_op::maximum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case ew_op::minimum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case ew_op::relu_grad:
      return b > 0.0 ? a : 0.0;
  }
  return NAN;
}

// Per output element, the largest finite magnitude of any value of the expression there
// (evaluated in float64): the scale of the absolute error that rounding differences in
// intermediate values can leave in a result after cancellation.
std::vector<double> magnitudes(const fused_expr& e, const std::vector<tensor>& inputs,
                               const shape& out) {
  const std::size_t r = out.rank();
  std::vector<std::vector<double>> in_values;
  for (const auto& x : inputs) in_values.push_back(values(x));
  std::vector<double> m(static_cast<std::size_t>(out.num_elements()), 1.0);
  std::vector<double> v(static_cast<std::size_t>(e.num_values()));
  for (std::size_t f = 0; f < m.size(); ++f) {
    std::vector<std::int64_t> idx(r);
    std::size_t rem = f;
    for (std::size_t d = r; d-- > 0;) {
      idx[d] = static_cast<std::int64_t>(rem % static_cast<std::size_t>(out[d]));
      rem /= static_cast<std::size_t>(out[d]);
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const shape& s = inputs[i].shape();
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < s.rank(); ++d) {
        flat = flat * s[d] + (s[d] == 1 ? 0 : idx[r - s.rank() + d]);
      }
      v[i] = in_values[i][static_cast<std::size_t>(flat)];
    }
    for (std::size_t k = 0; k < e.instrs.size(); ++k) {
      const auto& in = e.instrs[k];
      auto arg = [&](std::size_t j) {
        const auto& a = in.args[j];
        return a.is_literal() ? a.literal : v[static_cast<std::size_t>(a.value)];
      };
      v[inputs.size() + k] = ref_op(in.op, arg(0), info(in.op).arity == 2 ? arg(1) : 0.0);
    }
    for (double x : v) {
      if (std::isfinite(x)) m[f] = std::max(m[f], std::fabs(x));
    }
  }
  return m;
}

// How close CUDA's results must be to the CPU's.
struct tolerance {
  bool exact = false;                              // bit for bit (any NaN matching any NaN)
  double scale = 1.0;                              // x the dtype's rtol and atol
  const std::vector<double>* magnitude = nullptr;  // atol scaled per element (magnitudes())
  // Chains of inexact ops: a NaN or infinity on one side only (a value an ulp either side
  // of a domain edge, as log(x - y) for x ~ y) is allowed in at most 1% of the elements.
  bool rare_domain_flips = false;
};

void compare(const tensor& got_host, const tensor& want, const tolerance& tol,
             const std::string& what) {
  const dtype t = want.type();
  const auto g = values(got_host);
  const auto w = values(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  std::size_t flips = 0;
  int reported = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    bool ok = same_value(g[i], w[i]);
    if (!ok && !tol.exact) {
      if (std::isfinite(g[i]) && std::isfinite(w[i])) {
        const double m = tol.magnitude != nullptr ? (*tol.magnitude)[i] : 1.0;
        ok = std::fabs(g[i] - w[i]) <= tol.scale * (atol_of(t) * m + rtol_of(t) * std::fabs(w[i]));
      } else if (tol.rare_domain_flips) {
        ok = ++flips * 100 <= g.size();
      }
    }
    if (!ok && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << ": cuda " << g[i] << ", cpu " << w[i]
                    << (tol.exact ? " (expected bit for bit)" : "");
    }
  }
}

// Runs `expr` on the GPU (inputs laid out per `how`) and on the CPU, and compares: bit for
// bit when every live op is exact, else within `scale` x the dtype's tolerance (chains:
// absolute tolerance scaled by the values' magnitude, rare domain flips allowed).
void check(devices& dv, const std::string& expr, const ints& results,
           const std::vector<tensor>& inputs, const std::string& what,
           const std::vector<layout_kind>& how = {}, double scale = 1.0) {
  SCOPED_TRACE(fmt::format("{} [{}] {}", expr, fmt::join(results, ", "), what));
  const dtype t = inputs.at(0).type();
  const auto e = parse(expr, static_cast<std::int32_t>(inputs.size()), results);
  std::vector<tensor> on_gpu;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    on_gpu.push_back(place(dv.gpu, inputs[i], i < how.size() ? how[i] : layout_kind::dense));
  }
  const auto got = run_on(dv.gpu, expr, results, std::move(on_gpu));
  const auto want = run_on(dv.cpu, expr, results, inputs);
  ASSERT_EQ(got.size(), want.size());
  tolerance tol;
  tol.exact = exact_expr(e, t);
  tol.scale = scale;
  std::vector<double> m;
  if (!tol.exact && e.instrs.size() > 1) {
    m = magnitudes(e, inputs, want.at(0).shape());
    tol.magnitude = &m;
    tol.rare_domain_flips = true;
  }
  for (std::size_t j = 0; j < got.size(); ++j) {
    ASSERT_TRUE(got[j].defined()) << "output " << j;
    EXPECT_EQ(got[j].device(), dv.gpu.id());
    EXPECT_EQ(got[j].type(), t);
    ASSERT_EQ(got[j].shape(), want[j].shape()) << "output " << j;
    compare(to_host(dv.gpu, got[j]), want[j], tol, fmt::format("output {}", j));
  }
}

tensor op_input(ew_op op, dtype t, const shape& s, std::uint64_t seed) {
  const bool positive =
      op == ew_op::log || op == ew_op::sqrt || op == ew_op::rsqrt || op == ew_op::pow;
  return random(t, s, seed, positive ? 0.1 : -3.0, 3.0);
}

TEST(FusedCudaKernel, EveryOpMatchesTheCpuKernel) {
  LOOM_REQUIRE_GPU();
  devices dv;
  for (dtype t : float_types) {
    for (int i = 0; i < num_ew_ops; ++i) {
      const auto op = static_cast<ew_op>(i);
      const std::string name(info(op).name);
      const std::string what = fmt::format("{} {}", name, to_string(t));
      const tensor x = op_input(op, t, {37, 29}, 1 + static_cast<std::uint64_t>(i));
      if (info(op).arity == 1) {
        check(dv, fmt::format("{}(%0)", name), {1}, {x}, what);
        check(dv, fmt::format("mul(%0, 0.75); {}(%1)", name), {2}, {x}, what);
      } else {
        const tensor y =
            op == ew_op::pow ? random(t, {29}, 99, -2.0, 2.0) : op_input(op, t, {29}, 99);
        check(dv, fmt::format("{}(%0, %1)", name), {2}, {x, y}, what);
        check(dv, fmt::format("{}(%1, %0)", name), {2}, {x, y}, what + " (swapped)");
        check(dv, fmt::format("{}(%0, 0.75)", name), {1}, {x}, what + " (literal right)");
        check(dv, fmt::format("{}(1.5, %0)", name), {1}, {x}, what + " (literal left)");
      }
    }
  }
}

TEST(FusedCudaKernel, SpecialValuesBehaveAsOnTheCpu) {
  LOOM_REQUIRE_GPU();
  devices dv;
  const std::vector<double> specials = {NAN,   INFINITY, -INFINITY, 0.0,    -0.0,  1.0,    -1.0,
                                        100.0, -100.0,   88.0,      -104.5, 1e-40, -1e-40, 0.5,
                                        -0.5,  3.0,      -3.0,      1e30,   -1e30, 2.0,    7.5};
  const auto n = static_cast<std::int64_t>(specials.size());
  for (dtype t : float_types) {
    const tensor x = make(t, {n}, specials);
    const tensor y = make(t, {n}, std::vector<double>(specials.rbegin(), specials.rend()));
    for (int i = 0; i < num_ew_ops; ++i) {
      const auto op = static_cast<ew_op>(i);
      const std::string name(info(op).name);
      const bool unary = info(op).arity == 1;
      check(dv, unary ? fmt::format("{}(%0)", name) : fmt::format("{}(%0, %1)", name),
            {unary ? 1 : 2}, {x, y}, fmt::format("{} {}", name, to_string(t)));
    }
  }
}

const char* const chain = "mul(%0, %1); add(%2, 0.5); tanh(%3); sub(%4, %1); maximum(%5, -0.25)";

TEST(FusedCudaKernel, BroadcastInputsOfEveryKind) {
  LOOM_REQUIRE_GPU();
  devices dv;
  const std::vector<std::pair<shape, shape>> shapes = {{{5, 7}, {}},
                                                       {{5, 7}, {1}},
                                                       {{}, {5, 7}},
                                                       {{5, 7}, {7}},
                                                       {{5, 7}, {5, 1}},
                                                       {{5, 1}, {1, 7}},
                                                       {{4, 1, 3}, {2, 3}},
                                                       {{3, 1, 5}, {1, 4, 1}},
                                                       {{2, 3, 4, 5}, {4, 1}},
                                                       {{1, 1, 9}, {9}},
                                                       {{}, {}},
                                                       {{1}, {}}};
  for (dtype t : float_types) {
    for (const auto& [sa, sb] : shapes) {
      check(dv, chain, {6, 2}, {random(t, sa, 1), random(t, sb, 2)},
            fmt::format("{} {} {}", to_string(t), to_string(sa), to_string(sb)));
    }
  }
}

TEST(FusedCudaKernel, StridedAndOffsetViews) {
  LOOM_REQUIRE_GPU();
  devices dv;
  using enum layout_kind;
  for (dtype t : float_types) {
    const tensor a = random(t, {33, 65}, 3);
    const tensor b = random(t, {33, 65}, 4);
    const tensor row = random(t, {65}, 5);
    const std::string ts(to_string(t));
    check(dv, chain, {6}, {a, b}, ts + " transposed", {transposed, dense});
    check(dv, chain, {6}, {a, b}, ts + " both transposed", {transposed, transposed});
    check(dv, chain, {6}, {a, row}, ts + " transposed and row", {transposed, dense});
    check(dv, chain, {6}, {a, b}, ts + " offset", {offset, transposed});
    check(dv, chain, {6, 0}, {random(t, {3, 4, 5}, 6), random(t, {4, 5}, 7)}, ts + " 3-d",
          {transposed, transposed});
  }
}

TEST(FusedCudaKernel, SizesAroundBlocksAndTheGridStride) {
  LOOM_REQUIRE_GPU();
  devices dv;
  for (dtype t : float_types) {
    // Up past the grid the kernel launches (SMs x 8 blocks of 256), so threads loop.
    for (std::int64_t n : ints{1, 2, 255, 256, 257, 100003, std::int64_t{1} << 21}) {
      const std::string what = fmt::format("{} n={}", to_string(t), n);
      check(dv, chain, {6}, {random(t, {n}, 7), random(t, {n}, 8)}, what);
      if (n < 100000)
        check(dv, chain, {6}, {random(t, {n, 1}, 7), random(t, {3}, 8)}, what + " col x row");
    }
  }
}

TEST(FusedCudaKernel, EmptyZeroDimensionalAndMultipleResults) {
  LOOM_REQUIRE_GPU();
  devices dv;
  for (dtype t : float_types) {
    const auto empty = run_on(
        dv.gpu, chain, {6, 3},
        {dv.gpu.copy_from_host(random(t, {0, 3}, 1)), dv.gpu.copy_from_host(random(t, {3}, 2))});
    ASSERT_EQ(empty.size(), 2u);
    for (const auto& o : empty) {
      EXPECT_EQ(o.shape(), (shape{0, 3}));
      EXPECT_EQ(o.type(), t);
    }
    check(dv, chain, {6, 3}, {make(t, {}, {0.75}), make(t, {}, {-1.5})}, "0-d");
    // An instruction result, an input, one result twice, a smaller value broadcast, the last.
    check(dv, "exp(%1); mul(%2, %0); add(%3, 1); sigmoid(%4)", {3, 0, 4, 4, 2, 5, 1},
          {random(t, {6, 40}, 11), random(t, {40}, 12)}, std::string(to_string(t)));
    // Literal-only values and one-element inputs (constants on the CPU).
    check(dv, "add(1, 2); exp(%2); mul(%3, %1); add(%0, %4)", {5, 3},
          {random(t, {9, 11}, 13), make(t, {1, 1}, {0.625})}, "constants");
  }
}

TEST(FusedCudaKernel, RandomExpressionsMatchTheCpuKernel) {
  LOOM_REQUIRE_GPU();
  devices dv;
  const std::vector<shape> pool = {{6, 37}, {37}, {6, 1}, {}, {1, 37}, {6, 37}};
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const int n_in = 1 + static_cast<int>(rng() % 4);
    std::vector<shape> shapes;
    for (int i = 0; i < n_in; ++i) shapes.push_back(pool[rng() % pool.size()]);
    ints results;
    const fused_expr e = random_expr(rng, n_in, results);
    std::vector<layout_kind> how;
    for (int i = 0; i < n_in; ++i) {
      how.push_back(rng() % 4 == 0 ? layout_kind::transposed : layout_kind::dense);
    }
    for (dtype t : float_types) {
      std::vector<tensor> in;
      for (int i = 0; i < n_in; ++i) {
        in.push_back(
            random(t, shapes[static_cast<std::size_t>(i)],
                   1000 * static_cast<std::uint64_t>(trial) + static_cast<std::uint64_t>(i)));
      }
      // Chains of up to 30 ops: 4x the per-op bounds, as docs/passes.md allows fused and
      // unfused forms.
      check(dv, e.to_string(), results, in, fmt::format("trial {} {}", trial, to_string(t)), how,
            4.0);
    }
  }
}

TEST(FusedCudaKernel, OutputsTakeInputBuffersOnlyWhenThatIsSafe) {
  LOOM_REQUIRE_GPU();
  devices dv;
  for (dtype t : float_types) {
    const tensor x = random(t, {3000}, 21);
    const tensor y = random(t, {3000}, 22);
    auto took = [&](const std::string& expr, const ints& results,
                    const std::vector<tensor>& hosts) {
      std::vector<tensor> in;
      std::vector<const void*> ptrs;
      for (const auto& h : hosts) {
        in.push_back(dv.gpu.copy_from_host(h));
        ptrs.push_back(in.back().raw_data());
      }
      const auto outs = run_on(dv.gpu, expr, results, std::move(in));
      std::vector<int> k;
      for (const auto& o : outs) {
        const auto it = std::find(ptrs.begin(), ptrs.end(), o.raw_data());
        k.push_back(it == ptrs.end() ? -1 : static_cast<int>(it - ptrs.begin()));
      }
      // The results are right, in place or not.
      const auto want = run_on(dv.cpu, expr, results, hosts);
      tolerance tol;
      tol.exact = exact_expr(parse(expr, static_cast<std::int32_t>(hosts.size()), results), t);
      for (std::size_t j = 0; j < outs.size(); ++j) {
        compare(to_host(dv.gpu, outs[j]), want[j], tol, fmt::format("{} output {}", expr, j));
      }
      return k;
    };
    EXPECT_EQ(took("neg(%0); exp(%1); add(%2, %0)", {3}, {x}), (std::vector<int>{0}));
    EXPECT_EQ(took("mul(%0, %1); sub(%2, %1); add(%0, %3)", {3, 4}, {x, y}),
              (std::vector<int>{0, 1}));
    // An input that is a result is never overwritten.
    EXPECT_EQ(took("exp(%0)", {0, 1}, {x}), (std::vector<int>{-1, -1}));
    EXPECT_EQ(took("mul(%0, %1)", {2, 0}, {x, y}), (std::vector<int>{1, -1}));
    // Only inputs of the output's shape.
    EXPECT_EQ(took("add(%0, %1)", {2}, {random(t, {100}, 1), random(t, {30, 100}, 2)}),
              (std::vector<int>{1}));
    EXPECT_EQ(took("add(%0, %1)", {2}, {random(t, {100}, 1), random(t, {30, 1}, 2)}),
              (std::vector<int>{-1}));
  }
}

TEST(FusedCudaKernel, ManyStridedInputsReadDenseCopies) {
  LOOM_REQUIRE_GPU();
  devices dv;
  for (dtype t : {dtype::f32, dtype::f16}) {
    shape out;
    const auto in = many_strided_inputs(t, 40, 12, out);
    check(dv, sum_of_inputs(40), {40 + 38}, in, std::string(to_string(t)));
  }
}

// On the GPU too a pass never changes an answer: a fused group gives what the unfused CUDA
// kernels give, bit for bit, for the ops whose fused and unfused code are the same IEEE
// operations and NaN rules (exp, tanh, sigmoid, gelu_tanh, erf, gelu, log, pow use the CPU's
// polynomials fused and libdevice unfused: a few ulp apart, docs/passes.md), over every pair
// of special values, in every type, as a session with the passes on and off runs them.
TEST(FusedCudaKernel, FusedGroupsGiveTheUnfusedCudaKernelsBitsOnSpecialValues) {
  LOOM_REQUIRE_GPU();
  const std::vector<double> specials = {NAN, INFINITY, -INFINITY, 0.0,  -0.0, 1.0,  -1.0, 6.0,
                                        0.5, -2.5,     1e-40,     -1e-40, 3e38, -3e38, 1e-7, 300.0};
  std::vector<double> xs;
  std::vector<double> ys;
  for (double a : specials) {
    for (double b : specials) {
      xs.push_back(a);
      ys.push_back(b);
    }
  }
  const auto n = static_cast<std::int64_t>(xs.size());
  const std::vector<std::string> exprs = {
      "maximum(%0, %1); neg(%2)",          "minimum(%0, %1); neg(%2)",
      "relu(%0); neg(%2)",                 "relu_grad(%0, %1); neg(%2)",
      "maximum(%0, 0); minimum(%2, 6)",    "minimum(%0, 1); maximum(%2, -1)",
      "mul(%0, 0.01); maximum(%0, %2)",    "add(%0, %1); sub(%2, %1); mul(%3, %0)",
      "div(%0, %1); abs(%2); sqrt(%3)",    "square(%0); reciprocal(%2); rsqrt(%1); add(%3, %4)",
      "mul(%0, %0); sub(%2, %2)",          "mul(%0, 1e-3); mul(%2, 1000)"};
  for (const dtype t : float_types) {
    const tensor x = make(t, {n}, xs);
    const tensor y = make(t, {n}, ys);
    for (const auto& text : exprs) {
      SCOPED_TRACE(std::string(to_string(t)) + " " + text);
      // The last instruction's value is the result.
      const auto last = 1 + static_cast<std::int64_t>(std::count(text.begin(), text.end(), ';')) + 1;
      const auto e = parse(text, 2, {last});
      graph g;
      graph_builder bld(g);
      auto px = ops::placeholder(bld, "x", t, x.shape());
      auto py = ops::placeholder(bld, "y", t, y.shape());
      const auto outs = expand(e, {px, py}, {.name = "expr", .device = "cuda:0"});
      ops::identity(outs.at(0), {.name = "out", .device = "cpu:0"});
      auto run = [&](bool passes) {
        session_options opts;
        opts.passes.enabled = passes;
        session s(g, opts);
        if (passes) {
          const graph& planned = s.planned_graph({"x", "y"}, {"out"});
          EXPECT_EQ(std::count_if(planned.nodes().begin(), planned.nodes().end(),
                                  [](const node& nd) { return nd.op() == "fused_elementwise"; }),
                    1);
        }
        return values(s.run({{"x", x}, {"y", y}}, {"out"}).at(0));
      };
      const auto fused = run(true);
      const auto unfused = run(false);
      ASSERT_EQ(fused.size(), unfused.size());
      int reported = 0;
      for (std::size_t i = 0; i < fused.size(); ++i) {
        if (!same_value(fused[i], unfused[i]) && reported++ < 5) {
          ADD_FAILURE() << "element " << i << " (" << xs[i] << ", " << ys[i] << "): fused "
                        << fused[i] << ", unfused " << unfused[i];
        }
      }
    }
  }
}

TEST(FusedCudaKernel, ASessionPlacesTheFusedNodeOnTheGpu) {
  LOOM_REQUIRE_GPU();
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const tensor a = random(t, {64, 33}, 1);
    const tensor b = random(t, {33}, 2);
    auto run = [&](const std::string& dev) {
      graph g;
      graph_builder bld(g);
      auto x = ops::placeholder(bld, "x", t, a.shape());
      auto y = ops::placeholder(bld, "y", t, b.shape());
      const auto outs =
          ops::fused_elementwise({x, y}, parse(chain, 2, {6, 2}), {.name = "fused", .device = dev});
      // Identities on the CPU: the fetched results are host tensors.
      std::vector<std::string> fetches;
      for (const auto& o : outs) fetches.push_back(ops::identity(o, {.device = "cpu:0"}).name());
      session_options opts;
      opts.passes.enabled = false;
      session s(std::move(g), opts);
      std::vector<tensor> res = s.run({{"x", a}, {"y", b}}, fetches);
      const auto placed = s.explain_placement({"x", "y"}, fetches);
      const auto it = std::find_if(placed.begin(), placed.end(),
                                   [](const placement_decision& p) { return p.node == "fused"; });
      EXPECT_NE(it, placed.end());
      if (it != placed.end()) {
        EXPECT_NE(it->device.find(dev == "cuda:0" ? "CUDA" : "CPU"), std::string::npos)
            << it->device;
      }
      std::vector<std::vector<double>> v;
      for (const auto& r : res) v.push_back(values(r));
      return v;
    };
    const auto gpu = run("cuda:0");
    const auto cpu = run("cpu:0");
    ASSERT_EQ(gpu.size(), cpu.size());
    for (std::size_t j = 0; j < gpu.size(); ++j) {
      ASSERT_EQ(gpu[j].size(), cpu[j].size());
      for (std::size_t i = 0; i < gpu[j].size(); ++i) {
        EXPECT_TRUE(same_value(gpu[j][i], cpu[j][i])) << j << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom
