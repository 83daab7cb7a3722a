#include "runtime/runtime_bench.hpp"

#include <fmt/format.h>

namespace loom::bench {

runtime_bench_result run_runtime_bench(const runtime_bench_options& options) {
  runtime_bench_result r;
  r.options = options;
  if (options.run_executor) {
    r.executor = run_executor_bench(10'000, std::max(options.repetitions, 5));
  }
  if (options.run_kernels) {
    r.kernels = run_kernel_peers(options.threads, options.repetitions, options.quick);
  }
  return r;
}

nlohmann::json to_json(const runtime_bench_result& r) {
  nlohmann::json j = nlohmann::json::object();
  if (r.options.run_executor) j["executor"] = to_json(r.executor);
  if (r.options.run_kernels) j["kernels"] = to_json(r.kernels);
  return j;
}

std::string to_text(const runtime_bench_result& r) {
  std::string out;
  if (r.options.run_executor) {
    const auto& e = r.executor;
    out += fmt::format(
        "executor: dependent chain of {} element-wise nodes (neg/abs on 1 element), median of {}\n"
        "  session.run        {:8.1f} ns/node   (target <= {:.0f} ns/node: {})\n"
        "  kernels directly   {:8.1f} ns/node\n"
        "  executor overhead  {:8.1f} ns/node   plans made: {}\n\n",
        e.nodes, e.repetitions, e.session_ns_per_node, e.target_ns_per_node,
        e.session_ns_per_node <= e.target_ns_per_node ? "met" : "NOT met", e.direct_ns_per_node,
        e.overhead_ns_per_node, e.plans);
  }
  if (r.options.run_kernels) out += to_text(r.kernels);
  return out;
}

}  // namespace loom::bench
