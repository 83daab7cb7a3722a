// `loom bench runtime`: the runtime core against its peers, measured in the same run.
//   - executor overhead: a dependent chain of 10,000 tiny element-wise nodes through a
//     session (target: at most 250 ns per node), next to the same kernels called directly;
//   - matmul f32 1024³ and 2048³ and a ResNet-style conv2d through loom's kernels, against a
//     direct oneDNN call with the same thread count (target: at least 95%).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/executor_bench.hpp"
#include "runtime/onednn_peer.hpp"

namespace loom::bench {

struct runtime_bench_options {
  int repetitions = 15;
  int threads = 2;
  bool quick = false;
  /// Which parts run (`loom bench runtime --only executor|kernels`).
  bool run_executor = true;
  bool run_kernels = true;
};

struct runtime_bench_result {
  runtime_bench_options options;
  executor_bench_result executor;
  runtime_kernel_results kernels;
};

runtime_bench_result run_runtime_bench(const runtime_bench_options& options);
nlohmann::json to_json(const runtime_bench_result& r);
std::string to_text(const runtime_bench_result& r);

}  // namespace loom::bench
