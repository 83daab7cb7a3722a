#include "train/optimizer_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "bench_stats.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "stream_triad.hpp"

namespace loom::bench {
namespace {

tensor random_f32(std::int64_t n, std::uint32_t seed) {
  tensor t = memory::host_tensor(dtype::f32, shape{n});
  float* p = t.data<float>();
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;  // an LCG: values in [-1, 1)
    p[i] = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return t;
}

// The graph of one Adam step over `tensors` parameters: variables p<k>, gradients as
// constants (copied to the device once, when the plan is made, and then read in place
// every step, so no feed copy is timed: what a training step's backward pass would leave
// in device memory), lr and step as constants. Unfused: one apply_adam per parameter,
// grouped under a no_op target; fused: one fused_adam node.
enum class adam_form { per_tensor, fused, op_by_op };

// One parameter's Adam step as PyTorch's single-tensor (foreach=False) code launches it:
// a chain of element-wise kernels, each one pass over memory (exp_avg.lerp_,
// exp_avg_sq.mul_().addcmul_(), sqrt, div, add eps, param.addcdiv_), with the results
// written back into the variables. Step fixed at `step` (bias corrections as constants).
std::vector<std::string> op_by_op_adam(graph_builder& b, int k, output p, output g, double lr,
                                       std::int64_t elements, std::int64_t step) {
  constexpr double beta1 = 0.9;
  constexpr double beta2 = 0.999;
  constexpr double eps = 1e-8;
  const auto zeros = [&] { return memory::host_tensor(dtype::f32, shape{elements}); };
  tensor z1 = zeros();
  tensor z2 = zeros();
  std::fill_n(z1.data<float>(), elements, 0.0f);
  std::fill_n(z2.data<float>(), elements, 0.0f);
  const output m = ops::variable(b, fmt::format("m{}", k), z1);
  const output v = ops::variable(b, fmt::format("v{}", k), z2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const output m_new = m + (g - m) * (1.0 - beta1);
  const output v_new = v * beta2 + g * g * (1.0 - beta2);
  const output denom = ops::sqrt(v_new) * (1.0 / std::sqrt(bc2)) + eps;
  const output p_new = p - (m_new / denom) * (lr / bc1);
  return {ops::assign(m, m_new).producer().name, ops::assign(v, v_new).producer().name,
          ops::assign(p, p_new).producer().name};
}

graph adam_graph(int tensors, std::int64_t elements, adam_form form, bool check_finite) {
  graph g;
  graph_builder b(g);
  std::vector<output> params, grads;
  for (int k = 0; k < tensors; ++k) {
    params.push_back(ops::variable(b, fmt::format("p{}", k),
                                   random_f32(elements, static_cast<std::uint32_t>(k))));
    grads.push_back(ops::constant(b, random_f32(elements, static_cast<std::uint32_t>(1000 + k))));
  }
  auto lr = ops::scalar(b, 1e-3);
  auto step = ops::scalar(b, 10, dtype::i64);
  node_spec target;
  target.name = "train_step";
  target.op = "no_op";
  if (form == adam_form::fused) {
    auto scale = ops::scalar(b, 1.0);
    const auto u =
        ops::fused_adam(params, grads, lr, step, scale, {}, {.check_finite = check_finite});
    target.control_inputs.push_back(g.get(u.name).id);
  } else if (form == adam_form::per_tensor) {
    for (int k = 0; k < tensors; ++k) {
      target.control_inputs.push_back(
          g.get(ops::apply_adam(params[static_cast<std::size_t>(k)],
                                grads[static_cast<std::size_t>(k)], lr, step))
              .id);
    }
  } else {
    for (int k = 0; k < tensors; ++k) {
      for (const std::string& n :
           op_by_op_adam(b, k, params[static_cast<std::size_t>(k)],
                         grads[static_cast<std::size_t>(k)], 1e-3, elements, 10)) {
        target.control_inputs.push_back(g.get(n).id);
      }
    }
  }
  g.add_node(std::move(target));
  return g;
}

struct step_times {
  double run_ms = 0;     // median wall time of session.run
  double kernel_ms = 0;  // median time inside the optimizer kernels (a traced run), summed
};

step_times adam_step_ms(int tensors, std::int64_t elements, adam_form form, bool check_finite,
                        int threads, int repetitions) {
  session_options o;
  o.devices.cpu_threads = threads;
  // Each form is measured as written: optimizer_fusion and elementwise_fusion would turn
  // the per-tensor and op-by-op forms into the fused one (that is `loom bench fusion`'s).
  o.passes.enabled = false;
  session s(adam_graph(tensors, elements, form, check_finite), o);
  const std::vector<std::string> targets = {"train_step"};
  for (int w = 0; w < 3; ++w) s.run({}, {}, targets);  // plan, state, caches
  std::vector<double> t, k;
  for (int r = 0; r < repetitions; ++r) {
    t.push_back(seconds_of([&] { s.run({}, {}, targets); }));
    run_metadata m;
    s.run({}, {}, targets, &m, {.trace = true});
    double ns = 0;
    for (const auto& e : m.nodes) {
      if (e.op == "apply_adam" || e.op == "fused_adam") ns += static_cast<double>(e.duration_ns);
    }
    k.push_back(ns * 1e-9);
  }
  return {median(std::move(t)) * 1e3, median(std::move(k)) * 1e3};
}

}  // namespace

optimizer_bench_result run_optimizer_bench(const optimizer_bench_options& options) {
  optimizer_bench_result r;
  r.repetitions = options.repetitions;
  r.threads = options.threads;
  const std::int64_t triad_elements = (std::int64_t{64} << 20) / 4;  // 64 MiB of f32 per array
  r.triad_mib_per_array = 64;
  r.triad_gb_per_s =
      triad_gb_per_s(options.threads, triad_elements, std::max(options.repetitions, 5));

  struct workload {
    const char* label;
    int tensors;
    std::int64_t elements;
    double pytorch_ms;
  };
  const workload workloads[] = {{"200 x 4096", 200, 4096, 4.1},
                                {"8 x 1M", 8, std::int64_t{1} << 20, 12.0}};
  for (const auto& w : workloads) {
    adam_case_result c;
    c.label = w.label;
    c.tensors = w.tensors;
    c.elements = w.elements;
    c.pytorch_ms = w.pytorch_ms;
    const auto unfused = adam_step_ms(w.tensors, w.elements, adam_form::per_tensor, true,
                                      options.threads, options.repetitions);
    const auto fused = adam_step_ms(w.tensors, w.elements, adam_form::fused, true, options.threads,
                                    options.repetitions);
    const auto one_pass = adam_step_ms(w.tensors, w.elements, adam_form::fused, false,
                                       options.threads, options.repetitions);
    const auto chain = adam_step_ms(w.tensors, w.elements, adam_form::op_by_op, true,
                                    options.threads, options.repetitions);
    c.op_by_op_ms = chain.run_ms;
    c.speedup_vs_op_by_op = chain.run_ms / fused.run_ms;
    c.unfused_ms = unfused.run_ms;
    c.unfused_kernels_ms = unfused.kernel_ms;
    c.fused_ms = fused.run_ms;
    c.fused_kernel_ms = fused.kernel_ms;
    c.fused_one_pass_ms = one_pass.run_ms;
    c.fused_one_pass_kernel_ms = one_pass.kernel_ms;
    c.speedup = c.unfused_ms / c.fused_ms;
    c.bytes = 28.0 * static_cast<double>(w.tensors) * static_cast<double>(w.elements);
    c.floor_ms = c.bytes / (r.triad_gb_per_s * 1e9) * 1e3;
    c.fused_over_floor = c.fused_ms / c.floor_ms;
    r.cases.push_back(c);
  }
  return r;
}

nlohmann::json to_json(const optimizer_bench_result& r) {
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases) {
    cases.push_back({{"label", c.label},
                     {"tensors", c.tensors},
                     {"elements_per_tensor", c.elements},
                     {"unfused_ms", c.unfused_ms},
                     {"fused_ms", c.fused_ms},
                     {"fused_one_pass_ms", c.fused_one_pass_ms},
                     {"unfused_kernels_ms", c.unfused_kernels_ms},
                     {"fused_kernel_ms", c.fused_kernel_ms},
                     {"fused_one_pass_kernel_ms", c.fused_one_pass_kernel_ms},
                     {"speedup", c.speedup},
                     {"op_by_op_ms", c.op_by_op_ms},
                     {"speedup_vs_op_by_op", c.speedup_vs_op_by_op},
                     {"bytes", c.bytes},
                     {"floor_ms", c.floor_ms},
                     {"fused_over_floor", c.fused_over_floor},
                     {"pytorch_1_13_ms_quoted", c.pytorch_ms}});
  }
  return {{"repetitions", r.repetitions},
          {"threads", r.threads},
          {"triad_gb_per_s", r.triad_gb_per_s},
          {"triad_mib_per_array", r.triad_mib_per_array},
          {"target_speedup", r.target_speedup},
          {"target_floor_ratio", r.target_floor_ratio},
          {"adam", cases}};
}

std::string to_text(const optimizer_bench_result& r) {
  std::string out = fmt::format(
      "optimizer: one Adam step over f32 parameters through a session, {} threads, median of {}\n"
      "  STREAM triad bandwidth  {:6.1f} GB/s   (3 x {:.0f} MiB arrays; the floor below uses it)\n",
      r.threads, r.repetitions, r.triad_gb_per_s, r.triad_mib_per_array);
  for (std::size_t i = 0; i < r.cases.size(); ++i) {
    const auto& c = r.cases[i];
    out += fmt::format(
        "  {:<10}  session.run: per-tensor {:8.3f} ms   fused {:8.3f} ms   fused, one pass {:8.3f} "
        "ms"
        "   speedup {:5.2f}x\n"
        "              in kernels: per-tensor {:8.3f} ms   fused {:8.3f} ms   fused, one pass "
        "{:8.3f} ms"
        "   (per-tensor: summed over threads)\n"
        "              floor {:8.3f} ms ({:.0f} MB at triad bandwidth)   fused / floor {:5.2f}   "
        "PyTorch 1.13 (quoted, not measured): {:.1f} ms\n",
        c.label, c.unfused_ms, c.fused_ms, c.fused_one_pass_ms, c.speedup, c.unfused_kernels_ms,
        c.fused_kernel_ms, c.fused_one_pass_kernel_ms, c.floor_ms, c.bytes / 1e6,
        c.fused_over_floor, c.pytorch_ms);
    out += fmt::format(
        "              op by op (PyTorch's single-tensor chain of element-wise kernels): {:8.3f} "
        "ms   fused is {:5.2f}x faster\n",
        c.op_by_op_ms, c.speedup_vs_op_by_op);
    if (i == 0) {
      out += fmt::format(
          "              target: fused >= {:.0f}x faster than unfused: per-tensor kernels {}, "
          "op-by-op chain {}\n",
          r.target_speedup, c.speedup >= r.target_speedup ? "met" : "NOT met",
          c.speedup_vs_op_by_op >= r.target_speedup ? "met" : "NOT met");
    } else {
      out += fmt::format("              target: fused within {:.2f}x of the floor: {}\n",
                         r.target_floor_ratio,
                         c.fused_over_floor <= r.target_floor_ratio ? "met" : "NOT met");
    }
  }
  return out;
}

}  // namespace loom::bench
