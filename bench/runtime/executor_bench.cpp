#include "runtime/executor_bench.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_stats.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// x -> neg -> abs -> neg -> abs ...: every node a real element-wise kernel on one element.
graph chain(std::int64_t nodes, std::string& last) {
  graph g;
  graph_builder b(g);
  output cur = ops::placeholder(b, "x", dtype::f32, {1});
  for (std::int64_t i = 0; i < nodes; ++i) cur = (i % 2 == 0) ? ops::neg(cur) : ops::abs(cur);
  last = cur.name();
  return g;
}

}  // namespace

executor_bench_result run_executor_bench(std::int64_t nodes, int repetitions) {
  executor_bench_result r;
  r.nodes = nodes;
  r.repetitions = repetitions;
  std::string last;
  graph g = chain(nodes, last);

  // The floor: each node's kernel called directly, outputs forwarded by hand.
  cpu_device dev(0, 1, 0, "bench");
  std::vector<std::unique_ptr<op_kernel>> kernels;
  for (const node& n : g.nodes()) {
    if (n.op() == "placeholder") continue;
    kernels.push_back(
        kernel_registry::global().get(n, device_type::cpu).create(kernel_construction(n, dev, &g)));
  }
  variable_store vars;
  std::vector<double> direct;
  session_options options;
  options.devices.virtual_cpu_devices = 1;
  // The executor's cost per node is the figure: the passes would fuse the chain away.
  options.passes.enabled = false;
  session s(std::move(g), options);
  std::vector<double> via_session;
  const tensor x = memory::host_tensor({1}, {1.5f});
  (void)s.run({{"x", x}}, {last});  // plan once
  for (int rep = 0; rep < repetitions; ++rep) {
    // Interleaved, so both see the same machine state.
    tensor cur = memory::contiguous_copy(x, dev.allocator(), dev.id());
    const auto t0 = clock_type::now();
    for (auto& k : kernels) {
      tensor in[1] = {std::move(cur)};
      tensor out[1];
      kernel_context ctx(k->node(), dev, in, out, &vars, nullptr);
      k->compute(ctx);
      cur = std::move(out[0]);
    }
    const auto t1 = clock_type::now();
    direct.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                     static_cast<double>(nodes));
    const auto t2 = clock_type::now();
    (void)s.run({{"x", x}}, {last});
    const auto t3 = clock_type::now();
    via_session.push_back(std::chrono::duration<double, std::nano>(t3 - t2).count() /
                          static_cast<double>(nodes));
  }
  r.direct_ns_per_node = median(direct);
  r.session_ns_per_node = median(via_session);
  r.overhead_ns_per_node = r.session_ns_per_node - r.direct_ns_per_node;
  r.plans = static_cast<std::int64_t>(s.plan_count());
  return r;
}

nlohmann::json to_json(const executor_bench_result& r) {
  return {{"nodes", r.nodes},
          {"repetitions", r.repetitions},
          {"session_ns_per_node", r.session_ns_per_node},
          {"direct_kernel_ns_per_node", r.direct_ns_per_node},
          {"executor_overhead_ns_per_node", r.overhead_ns_per_node},
          {"target_session_ns_per_node", r.target_ns_per_node},
          {"meets_target", r.session_ns_per_node <= r.target_ns_per_node},
          {"plans", r.plans}};
}

}  // namespace loom::bench
