// The optimizers on CUDA (src/backends/cuda/optimizer_kernels.cpp) against the CPU kernels
// run on the same graph and gradients: per-tensor and fused SGD/Adam/AdamW over many
// parameters of odd sizes (more than 1,000 once, more chunks than one launch takes once),
// every combination of the precision matrix (parameter, gradient and moment dtypes, master
// weights on and off), clipping, loss scaling, the inf/NaN skip (state untouched, no state
// created on a skipped first step) and bad input. The element math is the CPU's rounded the
// same way, so without clipping f32 results agree bit for bit; with clipping the norm's
// summation order differs, so within a few ulps. The registry test runs without a GPU.
#include "loom/graph/ops/optimizer.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/optimizer.cuh"
#include "backends/cuda/optimizer_launches.hpp"
#include "cuda/cuda_test_support.hpp"
#include "loom/core/half.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/multi_tensor_apply.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

// ---- host tensors --------------------------------------------------------------------------

double get(const tensor& t, std::int64_t i) {
  switch (t.type()) {
    case dtype::f16:
      return static_cast<double>(static_cast<float>(t.data<half>()[i]));
    case dtype::bf16:
      return static_cast<double>(static_cast<float>(t.data<bfloat16>()[i]));
    case dtype::f64:
      return t.data<double>()[i];
    default:
      return static_cast<double>(t.data<float>()[i]);
  }
}

void put(tensor& t, std::int64_t i, double v) {
  switch (t.type()) {
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

tensor random_tensor(dtype t, const shape& s, std::uint64_t seed) {
  tensor out = memory::host_tensor(t, s);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::int64_t i = 0; i < out.num_elements(); ++i) put(out, i, u(rng));
  return out;
}

tensor f32_scalar(float v) {
  tensor t = memory::host_tensor(dtype::f32, shape{});
  *t.data<float>() = v;
  return t;
}

tensor i64_scalar(std::int64_t v) {
  tensor t = memory::host_tensor(dtype::i64, shape{});
  *t.data<std::int64_t>() = v;
  return t;
}

// A host copy of any tensor of a session (device tensors come back through their device).
tensor to_host(session& s, const tensor& t) {
  if (!t.defined()) return t;
  if (t.device().type != device_type::cuda) {
    tensor out = memory::host_tensor(t.type(), t.shape());
    if (t.nbytes() > 0) std::memcpy(out.raw_data(), t.raw_data(), t.nbytes());
    return out;
  }
  return s.find_device(to_string(t.device()))
      .copy_to_host(t, memory::get_device_resource(device_id{device_type::cpu, 0}));
}

// ---- graphs ----------------------------------------------------------------------------------

enum class algo { sgd, adam, adamw };

struct param_spec {
  std::int64_t size;
  dtype param;
  dtype grad;
};

struct run_config {
  algo kind = algo::adam;
  ops::sgd_options sgd;
  ops::adam_options adam;
  ops::fused_options fused;
  float lr = 1e-2f;
};

std::string pname(std::size_t k) {
  return fmt::format("p{}", k);
}
std::string gname(std::size_t k) {
  return fmt::format("g{}", k);
}

// Parameters p<k> (initial values from seed 1000 + k), gradient placeholders g<k>, lr, step
// and grad_scale placeholders; one fused node "update" or one per-tensor node per parameter,
// asking for `device` (their variables follow them).
struct optimizer_graph {
  graph g;
  std::vector<std::string> targets;
  bool fused = false;
  std::size_t count = 0;
};

std::unique_ptr<optimizer_graph> build(const std::vector<param_spec>& specs, const run_config& c,
                                       bool fused, const std::string& device) {
  auto out = std::make_unique<optimizer_graph>();
  out->fused = fused;
  out->count = specs.size();
  graph_builder b(out->g);
  std::vector<output> params, grads;
  for (std::size_t k = 0; k < specs.size(); ++k) {
    params.push_back(
        ops::variable(b, pname(k), random_tensor(specs[k].param, {specs[k].size}, 1000 + k)));
    grads.push_back(ops::placeholder(b, gname(k), specs[k].grad, {specs[k].size}));
  }
  auto lr = ops::placeholder(b, "lr", dtype::f32, {});
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  auto scale = ops::placeholder(b, "grad_scale", dtype::f32, {});
  const node_options o{.name = "update", .device = device};
  if (fused) {
    if (c.kind == algo::sgd) {
      (void)ops::fused_sgd(params, grads, lr, scale, c.sgd, c.fused, o);
    } else if (c.kind == algo::adam) {
      (void)ops::fused_adam(params, grads, lr, step, scale, c.adam, c.fused, o);
    } else {
      (void)ops::fused_adamw(params, grads, lr, step, scale, c.adam, c.fused, o);
    }
  } else {
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const node_options ok{.name = fmt::format("update_{}", k), .device = device};
      if (c.kind == algo::sgd) {
        out->targets.push_back(ops::apply_sgd(params[k], grads[k], lr, c.sgd, ok));
      } else if (c.kind == algo::adam) {
        out->targets.push_back(ops::apply_adam(params[k], grads[k], lr, step, c.adam, ok));
      } else {
        out->targets.push_back(ops::apply_adamw(params[k], grads[k], lr, step, c.adam, ok));
      }
    }
  }
  return out;
}

// Runs one step; returns {grad_norm, found_inf} on the host for fused graphs.
std::vector<tensor> step(session& s, const optimizer_graph& og, const std::vector<tensor>& grads,
                         std::int64_t t, float lr, float grad_scale = 1.0f) {
  std::vector<feed> feeds;
  for (std::size_t k = 0; k < grads.size(); ++k) feeds.emplace_back(gname(k), grads[k]);
  feeds.emplace_back("lr", f32_scalar(lr));
  feeds.emplace_back("step", i64_scalar(t));
  feeds.emplace_back("grad_scale", f32_scalar(grad_scale));
  std::vector<feed> used;  // only the feeds some node reads
  for (auto& f : feeds) {
    bool read = false;
    for (const auto& n : og.g.nodes()) {
      for (const auto& e : n.inputs) read |= og.g.at(e.node).name == f.first;
    }
    if (read) used.push_back(std::move(f));
  }
  if (og.fused) {
    auto out = s.run(used, {"update:0", "update:1"});
    return {to_host(s, out[0]), to_host(s, out[1])};
  }
  s.run(used, {}, og.targets);
  return {};
}

std::vector<tensor> grads_for(const std::vector<param_spec>& specs, std::int64_t t) {
  std::vector<tensor> out;
  for (std::size_t k = 0; k < specs.size(); ++k) {
    out.push_back(
        random_tensor(specs[k].grad, {specs[k].size}, static_cast<std::uint64_t>(t) * 7919u + k));
  }
  return out;
}

// Sessions over copies of the graph: step() reads the graph to pick the feeds it uses (a
// moved-from graph had no nodes, so no feed was sent).
std::unique_ptr<session> cpu_session(const graph& g) {
  session_options o;
  o.devices.cuda_device_count = 0;
  return std::make_unique<session>(graph(g), o);
}

std::unique_ptr<session> gpu_session(const graph& g) {
  return std::make_unique<session>(graph(g));
}

// A pair of sessions over the same graph: the reference on CPU, the tested one on cuda:0.
struct pair_run {
  std::unique_ptr<optimizer_graph> cg, gg;
  std::unique_ptr<session> cpu, gpu;
};

pair_run make_pair_run(const std::vector<param_spec>& specs, const run_config& c, bool fused) {
  pair_run p;
  p.cg = build(specs, c, fused, "cpu:0");
  p.gg = build(specs, c, fused, "cuda:0");
  p.cpu = cpu_session(p.cg->g);
  p.gpu = gpu_session(p.gg->g);
  return p;
}

// The ulp of a storage type at |x|.
double ulp_of(dtype t, double x) {
  const double a = std::max(std::abs(x), 1e-30);
  const int bits = t == dtype::f16 ? 10 : t == dtype::bf16 ? 7 : 23;
  return std::ldexp(1.0, std::ilogb(a) - bits);
}

// Every variable of the CPU session's store exists in the GPU's with the same dtype and shape
// and the same values: bitwise when `ulps` is 0, else within `ulps` of the storage type plus
// `relative` times the variable's largest magnitude (for results that depend on the
// clipping coefficient, which the two devices' norms may round differently).
void expect_same_store(session& cpu, session& gpu, double ulps, const std::string& when,
                       double relative = 0.0) {
  const auto names = cpu.variables().names();
  std::vector<std::string> defined_cpu, defined_gpu;
  for (const auto& n : names) {
    if (cpu.variables().find(n)->value.defined()) defined_cpu.push_back(n);
  }
  for (const auto& n : gpu.variables().names()) {
    if (gpu.variables().find(n)->value.defined()) defined_gpu.push_back(n);
  }
  ASSERT_EQ(defined_cpu, defined_gpu) << when;
  for (const auto& n : defined_cpu) {
    const tensor a = to_host(cpu, cpu.variables().find(n)->value);
    const tensor b = to_host(gpu, gpu.variables().find(n)->value);
    ASSERT_EQ(a.type(), b.type()) << when << ": " << n;
    ASSERT_EQ(a.shape(), b.shape()) << when << ": " << n;
    if (ulps == 0.0) {
      ASSERT_TRUE(a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0)
          << when << ": variable " << n << " differs in its bits";
      continue;
    }
    double largest = 0.0;
    for (std::int64_t i = 0; i < a.num_elements(); ++i)
      largest = std::max(largest, std::abs(get(a, i)));
    int bad = 0;
    for (std::int64_t i = 0; i < a.num_elements() && bad < 3; ++i) {
      const double x = get(a, i);
      const double y = get(b, i);
      const double tol = ulps * ulp_of(a.type(), x) + relative * largest;
      if (!(std::abs(x - y) <= tol) && !(std::isnan(x) && std::isnan(y))) {
        ADD_FAILURE() << when << ": " << n << "[" << i << "] is " << y << " on cuda, " << x
                      << " on cpu";
        ++bad;
      }
    }
  }
}

// Runs `steps` steps on both sessions and compares after each.
void expect_gpu_equals_cpu(const std::vector<param_spec>& specs, const run_config& c, bool fused,
                           std::int64_t steps, double ulps, float grad_scale = 1.0f,
                           double relative = 0.0) {
  auto p = make_pair_run(specs, c, fused);
  for (std::int64_t t = 1; t <= steps; ++t) {
    auto grads = grads_for(specs, t);
    if (grad_scale != 1.0f) {
      for (auto& g : grads) {
        for (std::int64_t i = 0; i < g.num_elements(); ++i) put(g, i, get(g, i) * grad_scale);
      }
    }
    const auto want = step(*p.cpu, *p.cg, grads, t, c.lr, grad_scale);
    const auto got = step(*p.gpu, *p.gg, grads, t, c.lr, grad_scale);
    const std::string when = "step " + std::to_string(t);
    expect_same_store(*p.cpu, *p.gpu, ulps, when, relative);
    if (fused) {
      const double n_cpu = *want[0].data<float>();
      const double n_gpu = *got[0].data<float>();
      EXPECT_NEAR(n_gpu, n_cpu, 1e-5 * std::abs(n_cpu) + 1e-30) << when << ": grad_norm";
      EXPECT_EQ(*got[1].data<bool>(), *want[1].data<bool>()) << when << ": found_inf";
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Sizes around the chunk (65,536 elements) and block (256 threads x 4) boundaries.
std::vector<param_spec> varied_specs(dtype param = dtype::f32, dtype grad = dtype::f32) {
  const std::int64_t sizes[] = {0,    1,      2,    3,     7,  255,   256,   257,  1023,
                                1024, 1025,   4097, 65535, 5,  65536, 65537, 100,  0,
                                1,    131073, 333,  70001, 11, 999,   13,    8191, 200000};
  std::vector<param_spec> out;
  for (const auto n : sizes) out.push_back({n, param, grad});
  return out;
}

// ---- tests -----------------------------------------------------------------------------------

TEST(CudaOptimizer, RegistryHasTheKernels) {
  // Runs without a GPU: the CUDA kernels are registered whether or not one is present.
  const auto& r = kernel_registry::global();
  for (const char* op :
       {"apply_sgd", "apply_adam", "apply_adamw", "fused_sgd", "fused_adam", "fused_adamw"}) {
    int cuda = 0;
    for (const kernel_def* k : r.kernels_for(op)) cuda += k->device == device_type::cuda ? 1 : 0;
    EXPECT_EQ(cuda, 1) << op;
  }
}

// ---- without a GPU ---------------------------------------------------------------------------

// Every chunk in exactly one launch, in order; no launch over its limits; a launch ends
// only where the next chunk would pass a limit.
void expect_valid_groups(const std::vector<tensor_chunk>& table, int max_tensors,
                         std::size_t max_chunks) {
  const auto groups = cuda::group_chunks(table, max_tensors, max_chunks);
  std::size_t next = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    ASSERT_EQ(g.chunk_begin, next);
    ASSERT_GT(g.chunk_end, g.chunk_begin);
    ASSERT_LE(g.chunk_end - g.chunk_begin, max_chunks);
    int tensors = 0;
    for (std::size_t c = g.chunk_begin; c < g.chunk_end; ++c) {
      if (c == g.chunk_begin || table[c].tensor != table[c - 1].tensor) ++tensors;
    }
    ASSERT_LE(tensors, max_tensors);
    if (g.chunk_end < table.size()) {
      const bool new_tensor = table[g.chunk_end].tensor != table[g.chunk_end - 1].tensor;
      EXPECT_TRUE(g.chunk_end - g.chunk_begin == max_chunks ||
                  (new_tensor && tensors == max_tensors))
          << "launch " << i << " ends early";
    }
    next = g.chunk_end;
  }
  EXPECT_EQ(next, table.size());
}

TEST(CudaOptimizerLaunches, GroupsCoverTheTableWithinTheLimits) {
  EXPECT_TRUE(cuda::group_chunks({}, 64, 1024).empty());
  // 1,100 one-chunk tensors: launches of 64 tensors.
  std::vector<std::int64_t> small(1100, 1000);
  const auto t1 = make_chunk_table(small);
  const auto g1 = cuda::group_chunks(t1, 64, 1024);
  ASSERT_EQ(g1.size(), 18u);  // 17 x 64 + 12
  EXPECT_EQ(g1[0], (cuda::launch_group{0, 64}));
  EXPECT_EQ(g1[17], (cuda::launch_group{1088, 1100}));
  // A tensor of more chunks than a launch takes is split across launches.
  const std::vector<std::int64_t> big = {3, 1025 * multi_tensor_chunk_elements + 17, 5};
  const auto t2 = make_chunk_table(big);
  ASSERT_EQ(t2.size(), 1028u);
  EXPECT_EQ(cuda::group_chunks(t2, 64, 1024),
            (std::vector<cuda::launch_group>{{0, 1024}, {1024, 1028}}));
  // Random tables and small limits.
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::int64_t> sizes(rng() % 40);
    for (auto& n : sizes) n = static_cast<std::int64_t>(rng() % 50);
    const auto table = make_chunk_table(sizes, 8);
    expect_valid_groups(table, 1 + static_cast<int>(rng() % 5), 1 + rng() % 9);
  }
  EXPECT_THROW((void)cuda::group_chunks(t1, 0, 10), invalid_argument);
}

// Runs the CUDA kernel of node "update" on a CPU device: what it checks before its first
// CUDA call fails as on a GPU; input that passes the checks stops at "no CUDA device".
void run_on_cpu_device(const graph& g, std::vector<tensor> inputs) {
  auto devices = device_factory_registry::global().find(device_type::cpu)->create_devices({});
  device& dev = *devices.at(0);
  const node& n = *g.find("update");
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

TEST(CudaOptimizer, ChecksHostInputsBeforeAnyCudaCall) {
  graph g;
  graph_builder b(g);
  auto w = ops::variable(b, "w", random_tensor(dtype::f32, {4, 3}, 1));
  auto grad = ops::placeholder(b, "grad", dtype::f32, {-1, -1});
  auto lr = ops::placeholder(b, "lr", dtype::f32, {});
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  auto scale = ops::placeholder(b, "scale", dtype::f32, {});
  (void)ops::fused_adam({w}, {grad}, lr, step, scale, {}, {}, {.name = "update"});
  const tensor param = random_tensor(dtype::f32, {4, 3}, 1);
  const auto run = [&](const tensor& gr, const tensor& l, const tensor& st, const tensor& sc) {
    run_on_cpu_device(g, {param, gr, l, st, sc});
  };
  const tensor good = random_tensor(dtype::f32, {4, 3}, 2);
  tensor f64_lr = memory::host_tensor(dtype::f64, shape{});
  *f64_lr.data<double>() = 0.1;
  expect_node_error([&] { run(good, f64_lr, i64_scalar(1), f32_scalar(1)); },
                    {"'update'", "lr (input 2) must be a float32 scalar"});
  expect_node_error([&] { run(good, f32_scalar(-1), i64_scalar(1), f32_scalar(1)); },
                    {"lr (input 2) must be finite and >= 0, got -1"});
  expect_node_error([&] { run(good, f32_scalar(0.1f), i64_scalar(0), f32_scalar(1)); },
                    {"step (input 3) is the 1-based step number; got 0"});
  expect_node_error([&] { run(good, f32_scalar(0.1f), f32_scalar(1), f32_scalar(1)); },
                    {"step (input 3) must be an int64 scalar"});
  expect_node_error(
      [&] {
        run(good, f32_scalar(0.1f), i64_scalar(1),
            f32_scalar(std::numeric_limits<float>::infinity()));
      },
      {"grad_scale (input 4) must be finite and > 0"});
  expect_node_error(
      [&] {
        run(random_tensor(dtype::f32, {3, 4}, 2), f32_scalar(0.1f), i64_scalar(1), f32_scalar(1));
      },
      {"grads[0] (input 1) has shape [3, 4] but parameter 'w' has shape [4, 3]"});
  tensor ints = memory::host_tensor(dtype::i32, {4, 3});
  std::memset(ints.raw_data(), 0, ints.nbytes());
  expect_node_error([&] { run(ints, f32_scalar(0.1f), i64_scalar(1), f32_scalar(1)); },
                    {"grads[0] (input 1)", "gradients must be float32, float16 or bfloat16"});
  expect_node_error([&] { run(good, f32_scalar(0.1f), i64_scalar(1), f32_scalar(1)); },
                    {"no CUDA device"});
}

TEST(CudaOptimizer, FusedAdamMatchesCpuBitwise) {
  LOOM_REQUIRE_GPU();
  expect_gpu_equals_cpu(varied_specs(), {.kind = algo::adam}, true, 5, 0.0);
  expect_gpu_equals_cpu(varied_specs(), {.kind = algo::adam, .adam = {.weight_decay = 0.1}}, true,
                        3, 0.0);
  // beta1 <= 0.5: torch's lerp takes its second form.
  expect_gpu_equals_cpu(varied_specs(), {.kind = algo::adam, .adam = {.beta1 = 0.3}}, true, 3, 0.0);
}

TEST(CudaOptimizer, FusedAdamWMatchesCpuBitwise) {
  LOOM_REQUIRE_GPU();
  expect_gpu_equals_cpu(varied_specs(), {.kind = algo::adamw, .adam = {.weight_decay = 0.05}}, true,
                        5, 0.0);
}

TEST(CudaOptimizer, FusedSgdMatchesCpuBitwise) {
  LOOM_REQUIRE_GPU();
  expect_gpu_equals_cpu(varied_specs(), {.kind = algo::sgd}, true, 3, 0.0);
  expect_gpu_equals_cpu(varied_specs(),
                        {.kind = algo::sgd, .sgd = {.momentum = 0.9, .dampening = 0.1}}, true, 4,
                        0.0);
  expect_gpu_equals_cpu(
      varied_specs(),
      {.kind = algo::sgd, .sgd = {.momentum = 0.9, .weight_decay = 0.01, .nesterov = true}}, true,
      4, 0.0);
}

// Parameters and gradients of one 16-bit type with float32 moments: the update compiled for
// those types (Note [optimizer vector access] in kernels/optimizer.cu).
TEST(CudaOptimizer, SixteenBitParametersMatchTheCpu) {
  LOOM_REQUIRE_GPU();
  for (const dtype t : {dtype::bf16, dtype::f16}) {
    for (const bool master : {true, false}) {
      SCOPED_TRACE(std::string(to_string(t)) + (master ? ", master weights" : ""));
      run_config adam{.kind = algo::adam};
      adam.adam.master_weights = master;
      expect_gpu_equals_cpu(varied_specs(t, t), adam, true, 3, 1.0);
      run_config sgd{.kind = algo::sgd};
      sgd.sgd.momentum = 0.9;
      sgd.sgd.master_weights = master;
      expect_gpu_equals_cpu(varied_specs(t, t), sgd, true, 3, 1.0);
    }
  }
}

// The update moves four elements per access where its arrays are aligned to four elements
// and one where they are not: the same bits either way, and the same sum of squares up to
// its order.
TEST(CudaOptimizer, UnalignedArraysGiveTheAlignedBits) {
  LOOM_REQUIRE_GPU();
  namespace kn = cuda::kernels;
  const std::int64_t n = 70001;  // two chunks, the second partial, an odd tail
  const auto count = static_cast<std::size_t>(n);
  std::vector<float> init[4];  // param, grad, m, v
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (auto& a : init) a.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    init[0][i] = normal(rng);
    init[1][i] = normal(rng);
    init[2][i] = 0.1f * normal(rng);
    init[3][i] = 0.01f * std::abs(normal(rng));
  }
  struct result {
    std::vector<float> arrays[4];
    double partial[2] = {0.0, 0.0};
  };
  const auto run = [&](std::int64_t offset) {
    const std::size_t pitch = count + 4;
    float* buf = nullptr;
    kn::optim_step_state* state = nullptr;
    double* partial = nullptr;
    EXPECT_EQ(cudaMalloc(&buf, 4 * pitch * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&state, sizeof(kn::optim_step_state)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&partial, 2 * sizeof(double)), cudaSuccess);
    float* a[4];
    for (std::size_t j = 0; j < 4; ++j) {
      a[j] = buf + j * pitch + offset;
      EXPECT_EQ(cudaMemcpy(a[j], init[j].data(), count * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    kn::optim_hyper h;
    h.algo = kn::optim_algorithm::adamw;
    h.weight_decay = 0.01;
    kn::optim_scalars sc;
    sc.lr_value = 1e-3f;
    sc.step_value = 3;
    sc.grad_scale_value = 2.0f;
    kn::optim_tensor_list l{};
    l.param[0] = a[0];
    l.grad[0] = a[1];
    l.state0[0] = a[2];
    l.state1[0] = a[3];
    l.size[0] = n;
    for (int c = 0; c < 2; ++c) {
      l.chunk_tensor[c] = 0;
      l.chunk_begin[c] = c * kn::optim_chunk_elements;
    }
    l.chunks = 2;
    EXPECT_EQ(kn::optim_prologue(h, sc, state, nullptr), cudaSuccess);
    EXPECT_EQ(kn::optim_update(h.algo, l, state, partial, 0, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    result r;
    for (std::size_t j = 0; j < 4; ++j) {
      r.arrays[j].resize(count);
      EXPECT_EQ(cudaMemcpy(r.arrays[j].data(), a[j], count * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    EXPECT_EQ(cudaMemcpy(r.partial, partial, 2 * sizeof(double), cudaMemcpyDeviceToHost),
              cudaSuccess);
    (void)cudaFree(buf);
    (void)cudaFree(state);
    (void)cudaFree(partial);
    return r;
  };
  const result aligned = run(0);
  const result unaligned = run(1);
  for (std::size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(0, std::memcmp(aligned.arrays[j].data(), unaligned.arrays[j].data(),
                             count * sizeof(float)))
        << "array " << j;
  }
  EXPECT_NE(aligned.arrays[0], init[0]) << "the step changed nothing";
  for (int c = 0; c < 2; ++c) {
    EXPECT_GT(aligned.partial[c], 0.0);
    EXPECT_NEAR(aligned.partial[c], unaligned.partial[c], 1e-12 * aligned.partial[c]);
  }
}

TEST(CudaOptimizer, PerTensorMatchesCpuBitwise) {
  LOOM_REQUIRE_GPU();
  const std::vector<param_spec> specs = {{1, dtype::f32, dtype::f32},
                                         {70001, dtype::f32, dtype::f32},
                                         {300, dtype::bf16, dtype::f16},
                                         {0, dtype::f32, dtype::f32}};
  expect_gpu_equals_cpu(specs, {.kind = algo::adam}, false, 3, 0.0);
  expect_gpu_equals_cpu(specs, {.kind = algo::adamw, .adam = {.weight_decay = 0.05}}, false, 3,
                        0.0);
  expect_gpu_equals_cpu(specs, {.kind = algo::sgd, .sgd = {.momentum = 0.5}}, false, 3, 0.0);
}

// Every parameter x gradient dtype, f32 and bf16 moments, masters on and off, in one call.
TEST(CudaOptimizer, PrecisionMatrix) {
  LOOM_REQUIRE_GPU();
  const dtype floats[] = {dtype::f32, dtype::f16, dtype::bf16};
  std::vector<param_spec> specs;
  for (const dtype p : floats) {
    for (const dtype g : floats) {
      specs.push_back({1000, p, g});
      specs.push_back({65537, p, g});
    }
  }
  for (const dtype moments : {dtype::f32, dtype::bf16}) {
    for (const bool master : {true, false}) {
      SCOPED_TRACE(std::string("moments ") + to_string(moments) +
                   (master ? ", master weights" : ", no master weights"));
      run_config adam{.kind = algo::adam};
      adam.adam.moment_dtype = moments;
      adam.adam.master_weights = master;
      expect_gpu_equals_cpu(specs, adam, true, 3, 1.0);
      run_config sgd{.kind = algo::sgd};
      sgd.sgd.momentum = 0.9;
      sgd.sgd.moment_dtype = moments;
      sgd.sgd.master_weights = master;
      expect_gpu_equals_cpu(specs, sgd, true, 3, 1.0);
    }
  }
}

// Over 1,000 tensors: many launches of at most 64 tensors each.
TEST(CudaOptimizer, ManyTensors) {
  LOOM_REQUIRE_GPU();
  std::vector<param_spec> specs;
  std::mt19937 rng(3);
  const dtype floats[] = {dtype::f32, dtype::f16, dtype::bf16};
  for (int k = 0; k < 1100; ++k) {
    specs.push_back(
        {static_cast<std::int64_t>(rng() % 3000), floats[rng() % 3], floats[rng() % 3]});
  }
  expect_gpu_equals_cpu(specs, {.kind = algo::adam}, true, 2, 1.0);
  expect_gpu_equals_cpu(specs, {.kind = algo::sgd, .sgd = {.momentum = 0.9}}, true, 2, 1.0);
}

// One tensor of more chunks than one launch takes (1,024 chunks of 65,536 elements).
TEST(CudaOptimizer, ChunksBeyondOneLaunch) {
  LOOM_REQUIRE_GPU();
  const std::vector<param_spec> specs = {{3, dtype::f32, dtype::f32},
                                         {1025 * 65536 + 17, dtype::f32, dtype::f32}};
  expect_gpu_equals_cpu(specs, {.kind = algo::sgd}, true, 1, 0.0);
}

TEST(CudaOptimizer, ClippingAndGradScale) {
  LOOM_REQUIRE_GPU();
  for (const double max_norm : {0.5, 1e6}) {
    run_config c{.kind = algo::adam};
    c.fused.max_grad_norm = max_norm;
    // The norms' summation orders differ, so the clipping coefficients may differ by an ulp:
    // results within a few ulps plus 1e-5 of each variable's largest magnitude.
    expect_gpu_equals_cpu(varied_specs(), c, true, 3, 4.0, 8.0f, 1e-5);
    c.kind = algo::sgd;
    c.sgd.momentum = 0.9;
    expect_gpu_equals_cpu(varied_specs(dtype::bf16, dtype::f16), c, true, 3, 4.0, 0.5f, 1e-5);
  }
  run_config one_pass{.kind = algo::adamw};
  one_pass.fused.check_finite = false;
  expect_gpu_equals_cpu(varied_specs(), one_pass, true, 3, 0.0, 4.0f);
}

std::vector<std::pair<std::string, tensor>> snapshot_store(session& s) {
  std::vector<std::pair<std::string, tensor>> out;
  for (const auto& n : s.variables().names()) {
    if (s.variables().find(n)->value.defined()) {
      out.emplace_back(n, to_host(s, s.variables().find(n)->value));
    }
  }
  return out;
}

void expect_store_equals(session& s, const std::vector<std::pair<std::string, tensor>>& before) {
  const auto now = snapshot_store(s);
  ASSERT_EQ(now.size(), before.size());
  for (std::size_t i = 0; i < now.size(); ++i) {
    EXPECT_EQ(now[i].first, before[i].first);
    const tensor& a = now[i].second;
    const tensor& b = before[i].second;
    EXPECT_TRUE(a.nbytes() == b.nbytes() &&
                (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0))
        << "variable " << now[i].first << " changed";
  }
}

// An inf or NaN skips the whole step on the device: nothing changes, and a skipped first
// step creates no state (so SGD's momentum later starts from the first applied gradient).
TEST(CudaOptimizer, InfOrNanGradientSkipsTheStep) {
  LOOM_REQUIRE_GPU();
  const std::vector<param_spec> specs = {{1000, dtype::bf16, dtype::f16},
                                         {70000, dtype::f32, dtype::f32},
                                         {1, dtype::f32, dtype::bf16}};
  for (const algo kind : {algo::adam, algo::sgd}) {
    run_config c{.kind = kind};
    c.sgd.momentum = 0.9;
    c.sgd.dampening = 0.5;
    auto p = make_pair_run(specs, c, true);
    auto bad = grads_for(specs, 1);
    bad[1].data<float>()[69999] = std::numeric_limits<float>::quiet_NaN();
    for (auto* s : {p.cpu.get(), p.gpu.get()}) {
      const auto& og = s == p.cpu.get() ? *p.cg : *p.gg;
      const auto out = step(*s, og, bad, 1, c.lr);
      EXPECT_TRUE(*out[1].data<bool>());
      EXPECT_TRUE(std::isnan(*out[0].data<float>()));
    }
    expect_same_store(*p.cpu, *p.gpu, 0.0, "after a skipped first step");
    for (std::int64_t t = 1; t <= 3; ++t) {
      const auto grads = grads_for(specs, t);
      (void)step(*p.cpu, *p.cg, grads, t, c.lr);
      const auto out = step(*p.gpu, *p.gg, grads, t, c.lr);
      EXPECT_FALSE(*out[1].data<bool>());
      expect_same_store(*p.cpu, *p.gpu, 1.0, "step " + std::to_string(t));
    }
    const auto before = snapshot_store(*p.gpu);
    for (const float poison :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      auto grads = grads_for(specs, 4);
      grads[1].data<float>()[35000] = poison;
      const auto out = step(*p.gpu, *p.gg, grads, 4, c.lr);
      EXPECT_TRUE(*out[1].data<bool>());
      EXPECT_FALSE(std::isfinite(*out[0].data<float>()));
      expect_store_equals(*p.gpu, before);
    }
    // A finite gradient that overflows once unscaled (scale < 1) counts too.
    auto grads = grads_for(specs, 4);
    grads[1].data<float>()[0] = 3e38f;
    const auto out = step(*p.gpu, *p.gg, grads, 4, c.lr, 0.25f);
    EXPECT_TRUE(*out[1].data<bool>());
    expect_store_equals(*p.gpu, before);
  }
}

TEST(CudaOptimizer, WithoutCheckFiniteTheStepIsTakenAndReported) {
  LOOM_REQUIRE_GPU();
  const std::vector<param_spec> specs = {{100, dtype::f32, dtype::f32}};
  run_config c{.kind = algo::sgd};
  c.fused.check_finite = false;
  auto og = build(specs, c, true, "cuda:0");
  auto s = gpu_session(og->g);
  auto grads = grads_for(specs, 1);
  double want = 0.0;
  for (std::int64_t i = 0; i < 100; ++i) want += get(grads[0], i) * get(grads[0], i);
  auto out = step(*s, *og, grads, 1, c.lr);
  EXPECT_FALSE(*out[1].data<bool>());
  EXPECT_NEAR(*out[0].data<float>(), std::sqrt(want), 1e-6 * std::sqrt(want));
  grads[0].data<float>()[5] = std::numeric_limits<float>::infinity();
  out = step(*s, *og, grads, 2, c.lr);
  EXPECT_TRUE(*out[1].data<bool>());
  const tensor p0 = to_host(*s, s->variables().find("p0")->value);
  EXPECT_TRUE(std::isinf(get(p0, 5)));  // updated regardless
}

TEST(CudaOptimizer, EmptyListAndEmptyTensors) {
  LOOM_REQUIRE_GPU();
  for (const auto& specs :
       {std::vector<param_spec>{}, std::vector<param_spec>{{0, dtype::f32, dtype::f32}}}) {
    auto og = build(specs, {.kind = algo::adam}, true, "cuda:0");
    auto s = gpu_session(og->g);
    const auto out = step(*s, *og, grads_for(specs, 1), 1, 1e-2f);
    EXPECT_EQ(*out[0].data<float>(), 0.0f);
    EXPECT_FALSE(*out[1].data<bool>());
  }
}

// Invalid scalars: a node_error naming lr or step when the kernel can tell on the host (the
// first step, which would create state, or host-resident scalars); otherwise the step does
// nothing and reports found_inf (Note [cuda optimizer steps]).
TEST(CudaOptimizer, InvalidScalars) {
  LOOM_REQUIRE_GPU();
  const std::vector<param_spec> specs = {{10, dtype::f32, dtype::f32}};
  auto og = build(specs, {.kind = algo::adam}, true, "cuda:0");
  auto s = gpu_session(og->g);
  try {
    (void)step(*s, *og, grads_for(specs, 1), 1, -1.0f);
    FAIL() << "expected a node_error";
  } catch (const node_error& e) {
    EXPECT_NE(std::string(e.what()).find("lr (input"), std::string::npos) << e.what();
  }
  try {
    (void)step(*s, *og, grads_for(specs, 1), 0, 1e-2f);
    FAIL() << "expected a node_error";
  } catch (const node_error& e) {
    EXPECT_NE(std::string(e.what()).find("step"), std::string::npos) << e.what();
  }
  (void)step(*s, *og, grads_for(specs, 1), 1, 1e-2f);  // creates the state
  const auto before = snapshot_store(*s);
  try {
    const auto out = step(*s, *og, grads_for(specs, 2), 2, std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(*out[1].data<bool>());
    EXPECT_TRUE(std::isnan(*out[0].data<float>()));
  } catch (const node_error& e) {
    EXPECT_NE(std::string(e.what()).find("lr (input"), std::string::npos) << e.what();
  }
  expect_store_equals(*s, before);
}

TEST(CudaOptimizer, GradientOfTheWrongShapeFails) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto w = ops::variable(b, "w", random_tensor(dtype::f32, {4, 3}, 1));
  auto grad = ops::placeholder(b, "grad", dtype::f32, {-1, -1});
  auto lr = ops::scalar(b, 0.1);
  const std::string update = ops::apply_sgd(w, grad, lr, {}, {.device = "cuda:0"});
  session s(std::move(g));
  try {
    s.run({{"grad", random_tensor(dtype::f32, {3, 4}, 2)}}, {}, {update});
    FAIL() << "expected a node_error";
  } catch (const node_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("grad (input 1) has shape [3, 4] but parameter 'w' has shape [4, 3]"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace loom
