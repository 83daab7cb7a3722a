// The CUDA layer_norm, layer_norm_grad and bias_add kernels (src/backends/cuda/
// normalization_kernels.cpp, nn_kernels.cpp)
// against the CPU kernels of the same nodes (themselves tested against float64 references in
// tests/kernels): every float dtype, rows of 1, 256, 257, 1000, 1023, 4097 and 20000 elements
// (warp rows, block rows cached in shared memory, block rows too long for it), several
// normalised dims, many rows (dgamma/dbeta cut in chunks), large means with small spreads,
// empty tensors, non-contiguous inputs, outputs written in place, the same bits on a second
// run, and the whole forward and backward through a session. Without a GPU the registry and
// the argument checks (made before any CUDA call) are still tested; the rest skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/kernels/bias_add.cuh"
#include "backends/cuda/kernels/layer_norm.cuh"
#include "cuda/kernel_compare.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using namespace testing::cuda_compare;

const std::vector<dtype> floats{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

const kernel_def* find_def(const std::string& op, device_type d) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == d) return k;
  }
  return nullptr;
}

// tolerance_for(t) with its relative part scaled by r and its absolute part by a.
struct slack {
  double r = 1;
  double a = 1;
};
tolerance tol(dtype t, slack k) {
  tolerance r = tolerance_for(t);
  r.rtol *= k.r;
  r.atol *= k.a;
  return r;
}

// Runs n on the CPU and the GPU; expects output i within tol(dtype, k[i]) (the last entry of
// k for the outputs beyond it).
std::vector<tensor> compare(const op_node& n, const std::vector<tensor>& inputs,
                            const std::string& what, const std::vector<slack>& k) {
  const auto want = n.run(reference_cpu(), inputs);
  std::vector<tensor> on_gpu;
  for (const auto& x : inputs) on_gpu.push_back(to_gpu(x));
  const auto got_gpu = n.run(test_gpu(), on_gpu);
  std::vector<tensor> got;
  for (std::size_t i = 0; i < got_gpu.size(); ++i) {
    EXPECT_EQ(got_gpu[i].device().type, device_type::cuda) << what << ": output " << i;
    got.push_back(to_host(got_gpu[i]));
    expect_same(got.back(), want[i], tol(want[i].type(), k[std::min(i, k.size() - 1)]),
                what + ", output " + std::to_string(i));
  }
  return got;
}

// Slack for layer_norm_grad's outputs: dx row by row; dgamma and dbeta are sums over `rows`
// rows in another order than the CPU's, whose rounding grows as the root of the count.
std::vector<slack> grad_slack(std::int64_t rows) {
  const double a = 20.0 * std::sqrt(static_cast<double>(std::max<std::int64_t>(rows, 1)));
  return {{40.0, 40.0}, {20.0, a}, {20.0, a}};
}

std::int64_t rows_of(const shape& s, std::int64_t axis) {
  const auto a =
      static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(s.rank()) : axis);
  std::int64_t r = 1;
  for (std::size_t k = 0; k < a; ++k) r *= s[k];
  return r;
}

std::string label(const std::string& op, dtype t, const shape& s, const std::string& more = "") {
  return op + " " + to_string(t) + to_string(s) + (more.empty() ? "" : " " + more);
}

// ---- without a GPU ---------------------------------------------------------------------------

TEST(CudaNnRegistry, EveryOpHasACudaKernelForTheCpuTypes) {
  for (const std::string op : {"layer_norm", "layer_norm_grad", "bias_add"}) {
    const kernel_def* c = find_def(op, device_type::cpu);
    const kernel_def* g = find_def(op, device_type::cuda);
    ASSERT_NE(c, nullptr) << op;
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

// Declared with unknown dims, so that inference passes and the kernel's checks run.
TEST(CudaNnChecks, RunTimeErrorsFailAsOnTheCpu) {
  const dtype f = dtype::f32;
  const tensor x = random(f, {2, 3, 4}, 1);
  {
    const op_node n("layer_norm", {{f, {-1, -1, -1}}, {f, {-1}}, {f, {-1}}},
                    {{"axis", std::int64_t{-1}}, {"epsilon", 1e-5}});
    expect_same_failure(n, {x, random(f, {5}, 2), random(f, {4}, 3)},
                        "gamma [5] and beta [4] must both have shape x.shape[2:] = [4]");
  }
  {
    const op_node n("layer_norm", {{f, {-1, -1, -1}}, {f, {-1}}, {f, {-1}}},
                    {{"axis", std::int64_t{2}}, {"epsilon", 1e-5}});
    expect_same_failure(n, {random(f, {2, 3}, 4), random(f, {3}, 5), random(f, {3}, 6)},
                        "axis 2 is out of range for input of shape [2, 3]");
  }
  const std::vector<std::pair<dtype, shape>> grad_decl{
      {f, {-1, -1, -1}}, {f, {-1, -1, -1}}, {f, {-1}}, {f, {-1, -1}}, {f, {-1, -1}}};
  const op_node g("layer_norm_grad", grad_decl, {{"axis", std::int64_t{-1}}});
  const tensor gamma = random(f, {4}, 7);
  const tensor stats = random(f, {2, 3}, 8);
  expect_same_failure(g, {random(f, {2, 3, 5}, 9), x, gamma, stats, stats},
                      "dy of shape [2, 3, 5] does not match x of shape [2, 3, 4]");
  expect_same_failure(g, {x, x, random(f, {3}, 10), stats, stats},
                      "gamma of shape [3] does not match x.shape[2:] = [4]");
  expect_same_failure(g, {x, x, gamma, random(f, {3, 2}, 11), stats},
                      "must both have shape x.shape[:2] = [2, 3]");
  {
    const op_node n("bias_add", {{f, {-1, -1, -1}}, {f, {-1}}},
                    {{"data_format", std::string("NHWC")}});
    expect_same_failure(n, {x, random(f, {3}, 12)}, "does not match the 4 channels of input");
    const op_node c("bias_add", {{f, {-1, -1, -1}}, {f, {-1}}},
                    {{"data_format", std::string("NCHW")}});
    expect_same_failure(c, {x, random(f, {4}, 13)}, "does not match the 3 channels of input");
  }
}

// Host code of the launchers, checked without a GPU.
TEST(CudaNnLaunchers, TypesAndTheGradientsTemporary) {
  using cuda::kernels::elem_type;
  for (int k = 0; k < dtype_count; ++k) {
    const auto t = static_cast<dtype>(k);
    const auto e = static_cast<elem_type>(k);
    EXPECT_EQ(cuda::kernels::layer_norm_supports(e), is_floating(t)) << to_string(t);
    EXPECT_EQ(cuda::kernels::bias_add_supports(e), t != dtype::boolean) << to_string(t);
  }
  // dgamma/dbeta partials: [chunks, 2, n] in the compute type, 1 <= chunks <= rows.
  for (const auto& [rows, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {4096, 1024}, {4097, 33}, {7, 20000}, {1000000, 8}}) {
    for (const elem_type t : {elem_type::f32, elem_type::f64, elem_type::f16, elem_type::bf16}) {
      const std::size_t c = t == elem_type::f64 ? 8 : 4;
      const std::size_t bytes = cuda::kernels::layer_norm_grad_temp_bytes(t, rows, n);
      const std::size_t per_chunk = 2 * static_cast<std::size_t>(n) * c;
      EXPECT_EQ(bytes % per_chunk, 0u) << rows << "x" << n;
      EXPECT_GE(bytes / per_chunk, 1u) << rows << "x" << n;
      EXPECT_LE(bytes / per_chunk, static_cast<std::size_t>(rows)) << rows << "x" << n;
    }
  }
}

// ---- layer_norm ---------------------------------------------------------------------------------

struct ln_case {
  shape s;
  std::int64_t axis;
};

// Rows of 1, warp rows (<= 256), block rows cached (257 .. 12288 floats) and not (20000),
// several normalised dims, many rows.
const std::vector<ln_case> ln_cases{
    {{7, 1}, -1},     {{5, 256}, -1},   {{5, 257}, -1}, {{4, 1000}, -1}, {{3, 1023}, 1},
    {{2, 4097}, -1},  {{2, 20000}, -1}, {{6, 3, 5}, 1}, {{6, 3, 5}, -1}, {{2, 3, 4, 5}, 0},
    {{4097, 33}, -1}, {{1000, 700}, 1}, {{1, 1}, 0},
    // f32 rows of n % 4 == 0 up to 2048 take the kernel that keeps each row in registers.
    {{17, 1024}, -1}, {{3, 1536}, -1}, {{9, 2048}, -1}, {{5, 2052}, -1}, {{11, 4}, -1}};

// Inputs of layer_norm for x of shape s normalised from `axis`.
std::vector<tensor> ln_inputs(dtype t, const shape& s, std::int64_t axis, std::uint64_t seed,
                              double lo = -2.0, double hi = 2.0) {
  const auto a =
      static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(s.rank()) : axis);
  shape normalized;
  for (std::size_t k = a; k < s.rank(); ++k) normalized.push_back(s[k]);
  return {random(t, s, seed, lo, hi), random(t, normalized, seed + 1, 0.5, 1.5),
          random(t, normalized, seed + 2, -0.5, 0.5)};
}

attr_map ln_attrs(std::int64_t axis) {
  return {{"axis", axis}, {"epsilon", 1e-5}};
}

TEST(CudaLayerNorm, ForwardMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 100;
  for (const dtype t : floats) {
    for (const auto& c : ln_cases) {
      const auto in = ln_inputs(t, c.s, c.axis, seed += 3);
      const op_node n = op_node::of("layer_norm", in, ln_attrs(c.axis));
      compare(n, in, label("layer_norm", t, c.s, "axis " + std::to_string(c.axis)), {{20.0, 20.0}});
    }
  }
}

TEST(CudaLayerNorm, LargeMeansAndConstantRowsKeepTheirAccuracy) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::f32, dtype::f64}) {
    // Mean 1e4, spread 1e-2: the centred two-pass variance keeps y (Note [layer_norm row
    // kernels]); a naive E[x²] - E[x]² in float would not.
    for (const shape& s : {shape{8, 1000}, shape{3, 4097}, shape{16, 100}}) {
      auto in = ln_inputs(t, s, -1, 200, 1e4 - 1e-2, 1e4 + 1e-2);
      const op_node n = op_node::of("layer_norm", in, ln_attrs(-1));
      compare(n, in, label("layer_norm", t, s, "mean 1e4"), {{20.0, 20.0}});
      // Constant rows: variance 0, y = beta.
      auto v = values(in[0]);
      for (auto& e : v) e = 3.0;
      in[0] = make(t, s, v);
      compare(n, in, label("layer_norm", t, s, "constant rows"), {{20.0, 20.0}});
    }
  }
}

TEST(CudaLayerNorm, EmptyStridedAndInPlaceInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : floats) {
    for (const shape& s : {shape{0, 8}, shape{3, 0}}) {
      const auto in = ln_inputs(t, s, -1, 300);
      const op_node n = op_node::of("layer_norm", in, ln_attrs(-1));
      compare(n, in, label("layer_norm", t, s, "empty"), {{1.0, 1.0}});
    }
    const auto in = ln_inputs(t, {9, 1500}, -1, 310);
    const op_node n = op_node::of("layer_norm", in, ln_attrs(-1));
    for (const tensor& view : {transposed_storage(in[0]), spread(in[0])}) {
      compare(n, {view, in[1], in[2]}, label("layer_norm", t, in[0].shape(), "strided"),
              {{20.0, 20.0}});
    }
    const auto want = n.run(reference_cpu(), in);
    const auto got = n.run(test_gpu(), {to_gpu(in[0]), to_gpu(in[1]), to_gpu(in[2])});
    for (std::size_t i = 0; i < 3; ++i) {
      expect_same(to_host(got[i]), want[i], tol(t, {20.0, 20.0}),
                  label("layer_norm", t, in[0].shape(), "in place, output " + std::to_string(i)));
    }
  }
}

// ---- layer_norm_grad ----------------------------------------------------------------------------

// Inputs of layer_norm_grad: dy, x, gamma, and the mean and rstd of the CPU's forward.
std::vector<tensor> grad_inputs(dtype t, const shape& s, std::int64_t axis, std::uint64_t seed) {
  const auto in = ln_inputs(t, s, axis, seed);
  const op_node f = op_node::of("layer_norm", in, ln_attrs(axis));
  const auto out = f.run(reference_cpu(), in);
  return {random(t, s, seed + 5), in[0], in[1], out[1], out[2]};
}

TEST(CudaLayerNormGrad, DxDgammaAndDbetaMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  std::uint64_t seed = 400;
  for (const dtype t : floats) {
    for (const auto& c : ln_cases) {
      const auto in = grad_inputs(t, c.s, c.axis, seed += 7);
      const op_node n = op_node::of("layer_norm_grad", in, {{"axis", c.axis}});
      // dgamma and dbeta are sums over the rows, in another order than the CPU's.
      compare(n, in, label("layer_norm_grad", t, c.s, "axis " + std::to_string(c.axis)),
              grad_slack(rows_of(c.s, c.axis)));
    }
  }
}

TEST(CudaLayerNormGrad, EmptyStridedAndInPlaceInputsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : floats) {
    for (const shape& s : {shape{0, 8}, shape{3, 0}}) {
      const auto in = grad_inputs(t, s, -1, 500);
      const op_node n = op_node::of("layer_norm_grad", in, {{"axis", std::int64_t{-1}}});
      const auto got = compare(n, in, label("layer_norm_grad", t, s, "empty"), {{1.0, 1.0}});
      for (const double v : values(got[1])) EXPECT_EQ(v, 0.0);
    }
    const auto in = grad_inputs(t, {9, 1500}, -1, 510);
    const op_node n = op_node::of("layer_norm_grad", in, {{"axis", std::int64_t{-1}}});
    compare(n, {spread(in[0]), transposed_storage(in[1]), in[2], in[3], in[4]},
            label("layer_norm_grad", t, in[0].shape(), "strided"), grad_slack(9));
    // dx in dy's buffer: dgamma and dbeta read dy before dx is written.
    const auto want = n.run(reference_cpu(), in);
    const auto got = n.run(
        test_gpu(), {to_gpu(in[0]), to_gpu(in[1]), to_gpu(in[2]), to_gpu(in[3]), to_gpu(in[4])});
    for (std::size_t i = 0; i < 3; ++i) {
      expect_same(
          to_host(got[i]), want[i], tol(t, grad_slack(9)[i]),
          label("layer_norm_grad", t, in[0].shape(), "in place, output " + std::to_string(i)));
    }
  }
}

TEST(CudaLayerNormGrad, RepeatedRunsGiveTheSameBits) {
  LOOM_REQUIRE_GPU();
  const auto in = grad_inputs(dtype::f32, {4096, 1024}, -1, 600);
  const op_node n = op_node::of("layer_norm_grad", in, {{"axis", std::int64_t{-1}}});
  std::vector<tensor> on_gpu;
  for (const auto& x : in) on_gpu.push_back(to_gpu(x));
  const auto a = n.run(test_gpu(), on_gpu);
  const auto b = n.run(test_gpu(), on_gpu);
  for (std::size_t i = 0; i < 3; ++i) {
    const tensor ha = to_host(a[i]);
    const tensor hb = to_host(b[i]);
    ASSERT_EQ(ha.nbytes(), hb.nbytes());
    EXPECT_EQ(std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()), 0) << "output " << i;
  }
}

// Forward and backward through sessions placed on each device: the gradient graph builds one
// layer_norm_grad node (src/graph/ops/normalization_grads.cpp).
TEST(CudaLayerNormSession, ForwardAndGradientsMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  const shape s{64, 768};
  auto build = [&](const std::string& dev) {
    graph g;
    graph_builder b(g);
    const auto guard = b.with_device(dev);
    auto x = ops::placeholder(b, "x", dtype::f32, s);
    auto gamma = ops::placeholder(b, "gamma", dtype::f32, {768});
    auto beta = ops::placeholder(b, "beta", dtype::f32, {768});
    auto dy = ops::placeholder(b, "dy", dtype::f32, s);
    auto ln = ops::layer_norm(x, gamma, beta, -1, 1e-5, {.name = "ln"});
    auto grads = gradients(ln.y, {x, gamma, beta}, dy);
    ops::identity(grads[0], {.name = "dx"});
    ops::identity(grads[1], {.name = "dgamma"});
    ops::identity(grads[2], {.name = "dbeta"});
    return g;
  };
  const auto in = ln_inputs(dtype::f32, s, -1, 700);
  const tensor dy = random(dtype::f32, s, 710);
  const std::vector<feed> feeds{{"x", in[0]}, {"gamma", in[1]}, {"beta", in[2]}, {"dy", dy}};
  const std::vector<std::string> fetches{"ln:0", "ln:1", "ln:2", "dx", "dgamma", "dbeta"};
  session_options cpu_opts;
  cpu_opts.devices.cuda_device_count = 0;
  session cpu(build("cpu:0"), cpu_opts);
  session gpu(build("cuda:0"));
  const auto want = cpu.run(feeds, fetches);
  const auto got = gpu.run(feeds, fetches);
  for (std::size_t i = 0; i < fetches.size(); ++i) {
    tensor h = got[i];
    if (h.device().type == device_type::cuda) {
      h = gpu.find_device(to_string(h.device())).copy_to_host(h, memory::host_resource::instance());
    }
    expect_same(h, want[i], tol(dtype::f32, i < 3 ? slack{20.0, 20.0} : grad_slack(64)[i - 3]),
                "session fetch " + fetches[i]);
  }
}

// ---- bias_add -----------------------------------------------------------------------------------

TEST(CudaBiasAdd, EveryDtypeAndLayoutMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  const std::vector<dtype> types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                 dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  std::uint64_t seed = 800;
  for (const dtype t : types) {
    for (const std::string format : {"NHWC", "NCHW"}) {
      for (const shape& s : {shape{5, 7}, shape{2, 3, 4, 5}, shape{8, 33, 17}, shape{0, 4},
                             shape{3, 1}, shape{1, 1000, 3}}) {
        const std::size_t axis = format == "NCHW" ? 1 : s.rank() - 1;
        const double lo = t == dtype::u8 ? 0.0 : -100.0;
        const tensor x = random(t, s, ++seed, lo, 100.0);
        const tensor bias = random(t, {s[axis]}, ++seed, lo, 100.0);
        const op_node n = op_node::of("bias_add", {x, bias}, {{"data_format", format}});
        compare(n, {x, bias}, label("bias_add", t, s, format), {{1.0, 1.0}});
        if (s.rank() >= 2 && s.num_elements() > 0) {
          compare(n, {transposed_storage(x), bias}, label("bias_add", t, s, format + " strided"),
                  {{1.0, 1.0}});
          const auto want = n.run(reference_cpu(), {x, bias});
          const auto got = n.run(test_gpu(), {to_gpu(x), to_gpu(bias)});  // in place
          expect_same(to_host(got[0]), want[0], tol(t, {1.0, 1.0}),
                      label("bias_add", t, s, "in place"));
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
