// matmul and fused_matmul on CUDA (cuBLASLt, src/backends/cuda/nn_matmul.cpp) against a
// float64 reference written here (an explicit sum over K, then bias, residual and the
// activation) and against the CPU kernel of the same node: transposes, batches with
// broadcasting (one strided call and the grouped form), odd sizes, K = 0 and empty outputs,
// non-contiguous inputs, every epilogue, every float dtype; fused_matmul against the unfused
// graph on the GPU, bit for bit, over NaN, infinities and signed zeros (Note [cuda matmul
// epilogues]); bad input at run time. The registry test runs without a GPU; the others skip
// there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/matmul_batches.hpp"
#include "cuda/cuda_test_support.hpp"
#include "loom/core/half.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace cuda {
// For failure messages.
inline void PrintTo(const gemm_call& c, std::ostream* os) {
  *os << "{a " << c.a_offset << " b " << c.b_offset << " c " << c.c_offset << " count " << c.count
      << " strides " << c.a_stride << ", " << c.b_stride << "}";
}
}  // namespace cuda

namespace {

using cuda::gemm_call;
using cuda::plan_gemm_calls;
using ints = std::vector<std::int64_t>;

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// ---- host tensors -------------------------------------------------------------------------

// Element i (counted from the tensor's first element, in elements) of a host tensor.
double get(const tensor& t, std::int64_t i) {
  switch (t.type()) {
    case dtype::f64:
      return static_cast<const double*>(t.raw_data())[i];
    case dtype::f16:
      return static_cast<double>(static_cast<float>(static_cast<const half*>(t.raw_data())[i]));
    case dtype::bf16:
      return static_cast<double>(static_cast<float>(static_cast<const bfloat16*>(t.raw_data())[i]));
    default:
      return static_cast<double>(static_cast<const float*>(t.raw_data())[i]);
  }
}

void put(tensor& t, std::int64_t i, double v) {
  switch (t.type()) {
    case dtype::f64:
      t.data<double>()[i] = v;
      return;
    case dtype::f16:
      t.data<half>()[i] = half(static_cast<float>(v));
      return;
    case dtype::bf16:
      t.data<bfloat16>()[i] = bfloat16(static_cast<float>(v));
      return;
    default:
      t.data<float>()[i] = static_cast<float>(v);
  }
}

// A dense host tensor of uniform values in [-1, 1) (rounded to t), reproducible from seed.
tensor random_tensor(dtype t, const shape& s, std::uint64_t seed) {
  tensor out = memory::host_tensor(t, s);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::int64_t i = 0; i < out.num_elements(); ++i) put(out, i, u(rng));
  return out;
}

// The row-major elements of a host tensor of any strides, as doubles.
std::vector<double> values_of(const tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.num_elements()));
  const shape& s = t.shape();
  std::vector<std::int64_t> idx(s.rank(), 0);
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < s.rank(); ++d) off += idx[d] * t.strides()[d];
    out[flat] = get(t, off);
    for (std::size_t d = s.rank(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// A view of `x` with the same elements whose last two dimensions are stored transposed.
tensor transposed_storage(const tensor& x) {
  const shape& s = x.shape();
  const std::size_t r = s.rank();
  shape stored = s;
  std::swap(stored[r - 1], stored[r - 2]);
  tensor buf = memory::host_tensor(x.type(), stored);
  const std::int64_t rows = s[r - 2];
  const std::int64_t cols = s[r - 1];
  const std::int64_t mats = x.num_elements() / std::max<std::int64_t>(1, rows * cols);
  for (std::int64_t b = 0; b < mats; ++b) {
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        put(buf, b * rows * cols + j * rows + i, get(x, b * rows * cols + i * cols + j));
      }
    }
  }
  shape strides = contiguous_strides(stored);
  std::swap(strides[r - 1], strides[r - 2]);
  return tensor::strided(buf.buf(), x.type(), s, strides, 0);
}

// ---- sessions -----------------------------------------------------------------------------

// A host copy of a fetched tensor (fetches from a GPU may stay in device memory).
tensor to_host(session& s, const tensor& t) {
  if (t.device().type != device_type::cuda) return t;
  return s.find_device(to_string(t.device()))
      .copy_to_host(t, memory::get_device_resource(device_id{device_type::cpu, 0}));
}

session_options cpu_only() {
  session_options o;
  o.devices.cuda_device_count = 0;
  return o;
}

// ---- the reference -------------------------------------------------------------------------

double act_ref(const std::string& act, double x) {
  if (act == "relu") return x > 0 ? x : 0.0;
  if (act == "gelu") return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
  if (act == "gelu_tanh") {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  if (act == "tanh") return std::tanh(x);
  if (act == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  return x;
}

struct case_spec {
  ints a, b;
  bool ta = false, tb = false;
  bool bias = false, residual = false;
  std::string act = "none";
  bool non_contiguous = false;
};

struct expected {
  shape s;
  std::vector<double> v;
  std::vector<double> scale;  // Σ|a·b| + |bias| + |residual|, what rounding errors grow with
};

expected reference(const case_spec& c, const tensor& a, const tensor& b, const tensor* bias,
                   const tensor* residual) {
  const auto av = values_of(a);
  const auto bv = values_of(b);
  const shape& sa = a.shape();
  const shape& sb = b.shape();
  const std::size_t ra = sa.rank();
  const std::size_t rb = sb.rank();
  const std::int64_t m = c.ta ? sa[ra - 1] : sa[ra - 2];
  const std::int64_t k = c.ta ? sa[ra - 2] : sa[ra - 1];
  const std::int64_t n = c.tb ? sb[rb - 2] : sb[rb - 1];
  // Batch dimensions right-aligned: dimension i of the output's batch is dimension
  // i - (rank - ra) of a's (missing: broadcast).
  const auto rank = static_cast<std::int64_t>(std::max(ra, rb));
  const auto ra_i = static_cast<std::int64_t>(ra);
  const auto rb_i = static_cast<std::int64_t>(rb);
  const auto dim_of = [&](const shape& x, std::int64_t rx, std::int64_t i) -> std::int64_t {
    const std::int64_t j = i - (rank - rx);
    return j >= 0 ? x[static_cast<std::size_t>(j)] : 1;
  };
  shape batch = shape::filled(static_cast<std::size_t>(rank - 2), 1);
  for (std::int64_t i = 0; i + 2 < rank; ++i) {
    // Broadcasting: a dimension of 1 takes the other's size (0 included, so not max).
    const std::int64_t da = dim_of(sa, ra_i, i);
    batch[static_cast<std::size_t>(i)] = da == 1 ? dim_of(sb, rb_i, i) : da;
  }
  expected e;
  e.s = batch;
  e.s.push_back(m);
  e.s.push_back(n);
  const std::int64_t batches = batch.num_elements();
  e.v.assign(static_cast<std::size_t>(batches * m * n), 0.0);
  e.scale.assign(e.v.size(), 0.0);
  const auto bias_v = bias != nullptr ? values_of(*bias) : std::vector<double>{};
  const auto res_v = residual != nullptr ? values_of(*residual) : std::vector<double>{};
  for (std::int64_t bo = 0; bo < batches; ++bo) {
    // The batch offsets of a and b (broadcast dimensions contribute nothing).
    std::int64_t rem = bo;
    std::int64_t oa = 0;
    std::int64_t ob = 0;
    std::int64_t stride_a = sa[ra - 2] * sa[ra - 1];
    std::int64_t stride_b = sb[rb - 2] * sb[rb - 1];
    for (std::int64_t i = rank - 3; i >= 0; --i) {
      const std::int64_t idx = rem % batch[static_cast<std::size_t>(i)];
      rem /= batch[static_cast<std::size_t>(i)];
      const std::int64_t da = dim_of(sa, ra_i, i);
      const std::int64_t db = dim_of(sb, rb_i, i);
      if (da != 1) oa += idx * stride_a;
      if (db != 1) ob += idx * stride_b;
      stride_a *= da;
      stride_b *= db;
    }
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0.0, mag = 0.0;
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const double x = av[static_cast<std::size_t>(oa + (c.ta ? kk * m + i : i * k + kk))];
          const double y = bv[static_cast<std::size_t>(ob + (c.tb ? j * k + kk : kk * n + j))];
          sum += x * y;
          mag += std::abs(x * y);
        }
        const auto o = static_cast<std::size_t>((bo * m + i) * n + j);
        if (bias != nullptr) {
          sum += bias_v[static_cast<std::size_t>(j)];
          mag += std::abs(bias_v[static_cast<std::size_t>(j)]);
        }
        if (residual != nullptr) {
          sum += res_v[o];
          mag += std::abs(res_v[o]);
        }
        e.v[o] = act_ref(c.act, sum);
        e.scale[o] = mag;
      }
    }
  }
  return e;
}

// Relative rounding of the accumulation and of the result's dtype.
double rtol_of(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-12;
    case dtype::f16:
      return 2e-3;
    case dtype::bf16:
      return 1.6e-2;
    default:
      return 2e-6;
  }
}

struct built {
  graph g;
  std::vector<feed> feeds;
  tensor a, b, bias, residual;
};

// One matmul or fused_matmul node "y" on `device` over fed inputs; the residual goes through
// neg(neg(.)) so that the node holds the only reference to it (which the kernel may not
// write: the product is computed before the residual is read).
built build(const case_spec& c, dtype t, const std::string& device, bool fused,
            std::uint64_t seed) {
  built out;
  graph_builder b(out.g);
  out.a = random_tensor(t, shape(c.a), seed);
  out.b = random_tensor(t, shape(c.b), seed + 1);
  auto pa = ops::placeholder(b, "a", t, shape(c.a));
  auto pb = ops::placeholder(b, "b", t, shape(c.b));
  out.feeds = {{"a", c.non_contiguous ? transposed_storage(out.a) : out.a},
               {"b", c.non_contiguous ? transposed_storage(out.b) : out.b}};
  if (!fused) {
    (void)ops::matmul(pa, pb, c.ta, c.tb, {.name = "y", .device = device});
    return out;
  }
  ops::epilogue e;
  e.activation = c.act;
  const std::int64_t n = c.tb ? c.b[c.b.size() - 2] : c.b.back();
  if (c.bias) {
    out.bias = random_tensor(t, shape{n}, seed + 2);
    e.bias = ops::placeholder(b, "bias", t, shape{n});
    out.feeds.emplace_back("bias", out.bias);
  }
  if (c.residual) {
    const expected shape_only =
        reference(case_spec{c.a, c.b, c.ta, c.tb}, out.a, out.b, nullptr, nullptr);
    out.residual = random_tensor(t, shape_only.s, seed + 3);
    auto r = ops::placeholder(b, "residual", t, shape_only.s);
    e.residual = ops::neg(ops::neg(r, {.device = device}), {.device = device});
    out.feeds.emplace_back("residual", out.residual);
  }
  (void)ops::fused_matmul(pa, pb, e, c.ta, c.tb, {.name = "y", .device = device});
  return out;
}

void expect_matches(const tensor& got, const expected& e, dtype t, const std::string& what) {
  ASSERT_EQ(got.shape(), e.s) << what;
  const auto v = values_of(got);
  const double rtol = rtol_of(t);
  int bad = 0;
  for (std::size_t i = 0; i < v.size() && bad < 5; ++i) {
    const double tol = rtol * (e.scale[i] + std::abs(e.v[i])) + 1e-30;
    if (!(std::abs(v[i] - e.v[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << v[i] << ", expected " << e.v[i]
                    << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

// Runs the case on cuda:0 against the reference and against the CPU kernel.
void check_case(const case_spec& c, dtype t, bool fused, std::uint64_t seed = 7) {
  const std::string what = std::string(fused ? "fused_matmul" : "matmul") + " " + to_string(t) +
                           " a" + to_string(shape(c.a)) + (c.ta ? "^T" : "") + " b" +
                           to_string(shape(c.b)) + (c.tb ? "^T" : "") + (c.bias ? " +bias" : "") +
                           (c.residual ? " +residual" : "") + " " + c.act +
                           (c.non_contiguous ? " (strided inputs)" : "");
  SCOPED_TRACE(what);
  built gpu = build(c, t, "cuda:0", fused, seed);
  built cpu = build(c, t, "cpu:0", fused, seed);
  const expected e = reference(c, gpu.a, gpu.b, gpu.bias.defined() ? &gpu.bias : nullptr,
                               gpu.residual.defined() ? &gpu.residual : nullptr);
  session gs(std::move(gpu.g));
  const tensor got = to_host(gs, gs.run(gpu.feeds, {"y"}).at(0));
  expect_matches(got, e, t, what + " on cuda:0");
  session cs(std::move(cpu.g), cpu_only());
  const tensor want = cs.run(cpu.feeds, {"y"}).at(0);
  // Against the CPU: each is within the reference's tolerance, so within twice of each other.
  expected cpu_e = e;
  cpu_e.v = values_of(want);
  for (double& s : cpu_e.scale) s *= 2.0;
  expect_matches(got, cpu_e, t, what + " against cpu:0");
}

// ---- tests ---------------------------------------------------------------------------------

TEST(CudaMatmul, RegistryHasTheKernels) {
  // Runs without a GPU: the CUDA kernels are registered whether or not one is present.
  const auto& r = kernel_registry::global();
  for (const char* op : {"matmul", "fused_matmul"}) {
    bool found = false;
    for (const kernel_def* k : r.kernels_for(op)) {
      if (k->device != device_type::cuda) continue;
      found = true;
      EXPECT_EQ(k->label, "cublaslt");
      ASSERT_EQ(k->constraints.size(), 1u);
      EXPECT_EQ(k->constraints[0].first, "T");
      EXPECT_EQ(k->constraints[0].second,
                (std::vector<dtype>{dtype::f32, dtype::f64, dtype::f16, dtype::bf16}));
    }
    EXPECT_TRUE(found) << op << " has no CUDA kernel";
  }
}

const std::vector<case_spec> shapes = {
    {{7, 5}, {5, 3}},
    {{1, 1}, {1, 1}},
    {{33, 17}, {17, 65}},
    {{17, 33}, {17, 65}, true, false},
    {{33, 17}, {65, 17}, false, true},
    {{17, 33}, {65, 17}, true, true},
    {{3, 4, 5}, {5, 6}},           // b broadcast over the batch (stride 0)
    {{4, 5}, {2, 5, 3}},           // a broadcast
    {{2, 3, 4, 5}, {2, 3, 5, 6}},  // two batch dims, one strided call
    {{2, 1, 4, 5}, {1, 3, 5, 6}},  // broadcast in both: one call per run of the last dim
    {{2, 3, 1, 5, 4}, {3, 1, 2, 5}, true, true},  // K = 5 on both sides
    {{129, 257}, {257, 63}},
};

TEST(CudaMatmul, MatchesReferenceAndCpuForEveryDtype) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : float_types) {
    for (const auto& c : shapes) check_case(c, t, false);
  }
}

TEST(CudaMatmul, StridedInputs) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::f32, dtype::bf16}) {
    check_case({{9, 7}, {7, 5}, false, false, false, false, "none", true}, t, false);
    check_case({{2, 9, 7}, {2, 5, 7}, false, true, false, false, "none", true}, t, false);
  }
}

TEST(CudaMatmul, EmptyAndZeroK) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : float_types) {
    check_case({{3, 0}, {0, 4}}, t, false);  // K = 0: zeros
    check_case({{0, 5}, {5, 3}}, t, false);  // no rows
    check_case({{2, 0, 5}, {5, 3}}, t, false);
    check_case({{0, 3, 5}, {5, 3}}, t, false);  // no batches
  }
}

TEST(CudaFusedMatmul, EveryEpilogue) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : float_types) {
    for (const char* act : {"none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"}) {
      for (int mask = 0; mask < 4; ++mask) {
        case_spec c{{19, 23}, {23, 37}};
        c.bias = (mask & 1) != 0;
        c.residual = (mask & 2) != 0;
        c.act = act;
        check_case(c, t, true);
      }
    }
  }
}

TEST(CudaFusedMatmul, BatchedTransposedAndZeroK) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::f32, dtype::f16}) {
    check_case({{3, 17, 9}, {3, 11, 17}, true, true, true, true, "relu"}, t, true);
    check_case({{2, 1, 4, 5}, {1, 3, 5, 6}, false, false, true, true, "gelu_tanh"}, t, true);
    check_case({{4, 5}, {2, 5, 3}, false, false, true, false, "sigmoid"}, t, true);
    check_case({{3, 0}, {0, 4}, false, false, true, true, "tanh"}, t, true);  // K = 0
    check_case({{3, 0}, {0, 4}, false, false, true, false, "gelu"}, t, true);
    check_case({{0, 3}, {3, 4}, false, false, true, true, "relu"}, t, true);
  }
}

TEST(CudaFusedMatmul, LargeWithBiasRelu) {
  LOOM_REQUIRE_GPU();
  check_case({{256, 512}, {512, 384}, false, false, true, false, "relu"}, dtype::f32, true);
  check_case({{256, 512}, {512, 384}, false, false, true, true, "gelu_tanh"}, dtype::bf16, true);
}

// fused_matmul gives what matmul, bias_add, add and the activation give on the GPU, bit for
// bit (Note [cuda matmul epilogues]): inputs with NaN and infinities in a and b, every
// special value in the bias and spread over the residual (NaN, +-inf, -0, subnormals, the
// largest magnitudes), a row of zeros in a (a core of zeros), every activation, every type.
TEST(CudaFusedMatmul, SpecialValuesAsTheUnfusedGraphBitForBit) {
  LOOM_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const dtype t : float_types) {
    const double huge = t == dtype::f16 ? 6e4 : t == dtype::f64 ? 1.7e308 : 3e38;
    const double sub = t == dtype::f16 ? 1e-7 : t == dtype::f64 ? 1e-310 : 1e-40;
    const std::vector<double> specials{nan, inf, -inf, 0.0, -0.0, sub, -sub, huge, -huge, 1.5};
    const auto ns = static_cast<std::int64_t>(specials.size());
    const std::int64_t m = 6, k = 9, n = ns + 3;
    tensor a = random_tensor(t, {m, k}, 11);
    tensor b = random_tensor(t, {k, n}, 12);
    tensor bias = random_tensor(t, {n}, 13);
    tensor r = random_tensor(t, {m, n}, 14);
    put(a, 2, nan);
    put(a, k + 4, inf);
    for (std::int64_t j = 0; j < k; ++j) put(a, 2 * k + j, 0.0);
    put(b, 3 * n + 1, -inf);
    for (std::int64_t j = 0; j < ns; ++j) put(bias, j, specials[static_cast<std::size_t>(j)]);
    for (std::int64_t i = 0; i < m * n; i += 5) {
      put(r, i, specials[static_cast<std::size_t>(i / 5 % ns)]);
    }
    // clip: maximum(., 0) and minimum(., 1.5) (ReLU6's form, the bound a special value);
    // clip_lo: maximum(., -0) alone (the pass fuses both as activation clip).
    for (const char* act :
         {"none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "clip", "clip_lo"}) {
      SCOPED_TRACE(std::string(to_string(t)) + " " + act);
      graph g;
      graph_builder gb(g);
      const node_options on_gpu{.device = "cuda:0"};
      auto pa = ops::placeholder(gb, "a", t, a.shape());
      auto pb = ops::placeholder(gb, "b", t, b.shape());
      auto pbias = ops::placeholder(gb, "bias", t, bias.shape());
      auto pr = ops::placeholder(gb, "r", t, r.shape());
      output y = ops::add(ops::bias_add(ops::matmul(pa, pb, false, false, on_gpu), pbias, "NHWC",
                                        on_gpu),
                          pr, on_gpu);
      const std::string a_name(act);
      if (a_name == "relu") y = ops::relu(y, on_gpu);
      if (a_name == "gelu") y = ops::gelu(y, "none", on_gpu);
      if (a_name == "gelu_tanh") y = ops::gelu(y, "tanh", on_gpu);
      if (a_name == "tanh") y = ops::tanh(y, on_gpu);
      if (a_name == "sigmoid") y = ops::sigmoid(y, on_gpu);
      if (a_name == "clip") {
        y = ops::minimum(ops::maximum(y, ops::scalar(gb, 0.0, t), on_gpu), ops::scalar(gb, 1.5, t),
                         on_gpu);
      }
      if (a_name == "clip_lo") y = ops::maximum(y, ops::scalar(gb, -0.0, t), on_gpu);
      ops::identity(y, {.name = "y", .device = "cpu:0"});
      const std::vector<feed> feeds{{"a", a}, {"b", b}, {"bias", bias}, {"r", r}};
      session fused(g);
      session_options off;
      off.passes.enabled = false;
      session unfused(g, off);
      const graph& planned = fused.planned_graph({"a", "b", "bias", "r"}, {"y"});
      EXPECT_EQ(std::count_if(planned.nodes().begin(), planned.nodes().end(),
                              [](const node& nd) { return nd.op() == "fused_matmul"; }),
                1);
      const auto got = values_of(to_host(fused, fused.run(feeds, {"y"}).at(0)));
      const auto want = values_of(to_host(unfused, unfused.run(feeds, {"y"}).at(0)));
      ASSERT_EQ(got.size(), want.size());
      int reported = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                              : std::memcmp(&got[i], &want[i], sizeof(double)) == 0;
        if (!same && reported++ < 8) {
          ADD_FAILURE() << "element " << i << ": fused " << got[i] << ", unfused " << want[i];
        }
      }
    }
  }
}

// ---- without a GPU ---------------------------------------------------------------------------

TEST(CudaMatmulPlan, OneStridedCallWhenEveryOperandProgresses) {
  // [3, 4, 5] x [5, 6]: b broadcast (stride 0), a every 20 elements, output every 24.
  EXPECT_EQ(plan_gemm_calls({3, 4, 5}, {5, 6}, {3, 4, 6}, 24),
            (std::vector<gemm_call>{{0, 0, 0, 3, 20, 0}}));
  // [4, 5] x [2, 5, 3]: a broadcast.
  EXPECT_EQ(plan_gemm_calls({4, 5}, {2, 5, 3}, {2, 4, 3}, 12),
            (std::vector<gemm_call>{{0, 0, 0, 2, 0, 15}}));
  // Two batch dimensions, neither broadcast: one call over all six.
  EXPECT_EQ(plan_gemm_calls({2, 3, 4, 5}, {2, 3, 5, 6}, {2, 3, 4, 6}, 24),
            (std::vector<gemm_call>{{0, 0, 0, 6, 20, 30}}));
  // No batch: one matrix.
  EXPECT_EQ(plan_gemm_calls({4, 5}, {5, 6}, {4, 6}, 24),
            (std::vector<gemm_call>{{0, 0, 0, 1, 0, 0}}));
}

TEST(CudaMatmulPlan, BroadcastsInSeveralDimensionsTakeOneCallPerRunOfTheLast) {
  // [2, 1, 4, 5] x [1, 3, 5, 6] -> [2, 3, 4, 6]: a's offset is 20 x i, b's 30 x j.
  EXPECT_EQ(plan_gemm_calls({2, 1, 4, 5}, {1, 3, 5, 6}, {2, 3, 4, 6}, 24),
            (std::vector<gemm_call>{{0, 0, 0, 3, 0, 30}, {20, 0, 72, 3, 0, 30}}));
  // [3, 1, 4, 5] x [2, 5, 6] -> [3, 2, 4, 6].
  EXPECT_EQ(
      plan_gemm_calls({3, 1, 4, 5}, {2, 5, 6}, {3, 2, 4, 6}, 24),
      (std::vector<gemm_call>{{0, 0, 0, 2, 0, 30}, {20, 0, 48, 2, 0, 30}, {40, 0, 96, 2, 0, 30}}));
}

// Runs the CUDA kernel of node "y" on a CPU device: what it checks before its first CUDA
// call fails as on a GPU; input that passes the checks stops at "no CUDA device".
void run_on_cpu_device(const graph& g, std::vector<tensor> inputs) {
  auto devices = device_factory_registry::global().find(device_type::cpu)->create_devices({});
  device& dev = *devices.at(0);
  const node& n = *g.find("y");
  const kernel_def& def = kernel_registry::global().get(n, device_type::cuda);
  auto k = def.create(kernel_construction(n, dev, &g));
  std::vector<tensor> outputs(n.outputs.size());
  variable_store vars;
  kernel_context ctx(n, dev, inputs, outputs, &vars, nullptr);
  k->compute(ctx);
}

void expect_node_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a node_error";
  } catch (const node_error& e) {
    const std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m;
  }
}

TEST(CudaMatmul, ChecksInputsBeforeAnyCudaCall) {
  graph g;
  graph_builder b(g);
  auto pa = ops::placeholder(b, "a", dtype::f32, {-1, -1, -1});
  auto pb = ops::placeholder(b, "b", dtype::f32, {-1, -1, -1});
  (void)ops::matmul(pa, pb, false, true, {.name = "y"});
  const auto run = [&](const shape& a, const shape& bs) {
    run_on_cpu_device(g, {random_tensor(dtype::f32, a, 1), random_tensor(dtype::f32, bs, 2)});
  };
  expect_node_error(
      [&] {
        run({2, 3, 4}, {2, 5, 3});
      },
      {"'y'", "inner dimensions differ", "K = 4", "K = 3"});
  expect_node_error([&] { run({2, 3, 4}, {3, 5, 4}); }, {"batch dimensions", "do not broadcast"});
  expect_node_error([&] { run({2, 3, 4}, {2, 5, 4}); }, {"no CUDA device"});
}

TEST(CudaFusedMatmul, ChecksTheEpilogueBeforeAnyCudaCall) {
  graph g;
  graph_builder b(g);
  auto pa = ops::placeholder(b, "a", dtype::f32, {-1, -1});
  auto pb = ops::placeholder(b, "b", dtype::f32, {-1, -1});
  ops::epilogue e;
  e.bias = ops::placeholder(b, "bias", dtype::f32, {-1});
  e.residual = ops::placeholder(b, "residual", dtype::f32, {-1, -1});
  e.activation = "gelu";
  (void)ops::fused_matmul(pa, pb, e, false, false, {.name = "y"});
  const auto run = [&](const shape& bias, const shape& residual) {
    run_on_cpu_device(g,
                      {random_tensor(dtype::f32, {2, 3}, 1), random_tensor(dtype::f32, {3, 5}, 2),
                       random_tensor(dtype::f32, bias, 3), random_tensor(dtype::f32, residual, 4)});
  };
  expect_node_error(
      [&] {
        run({4}, {2, 5});
      },
      {"'y'", "bias", "[4]", "does not match the 5 channels", "[2, 5]"});
  expect_node_error([&] { run({5}, {5, 2}); }, {"residual", "[5, 2]", "output's shape [2, 5]"});
  expect_node_error([&] { run({5}, {2, 5}); }, {"no CUDA device"});
}

// Placeholders declared with unknown dimensions, so that inference passes and the kernel
// sees the mismatch.
TEST(CudaMatmul, BadShapesFailInTheKernelNamingThem) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto pa = ops::placeholder(b, "a", dtype::f32, {-1, -1});
  auto pb = ops::placeholder(b, "b", dtype::f32, {-1, -1});
  (void)ops::matmul(pa, pb, false, false, {.name = "y", .device = "cuda:0"});
  session s(std::move(g));
  try {
    (void)s.run(
        {{"a", random_tensor(dtype::f32, {2, 3}, 1)}, {"b", random_tensor(dtype::f32, {4, 5}, 2)}},
        {"y"});
    FAIL() << "expected a node_error";
  } catch (const node_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'y'"), std::string::npos) << m;
    EXPECT_NE(m.find("inner dimensions differ"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
}

TEST(CudaFusedMatmul, BadBiasFailsInTheKernel) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto pa = ops::placeholder(b, "a", dtype::f32, {-1, -1});
  auto pb = ops::placeholder(b, "b", dtype::f32, {-1, -1});
  auto bias = ops::placeholder(b, "bias", dtype::f32, {-1});
  ops::epilogue e;
  e.bias = bias;
  (void)ops::fused_matmul(pa, pb, e, false, false, {.name = "y", .device = "cuda:0"});
  session s(std::move(g));
  try {
    (void)s.run({{"a", random_tensor(dtype::f32, {2, 3}, 1)},
                 {"b", random_tensor(dtype::f32, {3, 5}, 2)},
                 {"bias", random_tensor(dtype::f32, {4}, 3)}},
                {"y"});
    FAIL() << "expected a node_error";
  } catch (const node_error& e2) {
    const std::string m = e2.what();
    EXPECT_NE(m.find("bias"), std::string::npos) << m;
    EXPECT_NE(m.find("does not match the 5 channels"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace loom
