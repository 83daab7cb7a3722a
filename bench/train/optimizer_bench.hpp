// `loom bench train --only optimizer`: one Adam step, fused against per-tensor, through a
// session, next to the memory-bandwidth floor measured in the same run.
//   - STREAM triad (a = b + s*c, f32, 3 arrays of 64 MiB) on the device's threads: the
//     bandwidth the floor is computed from (bytes as STREAM counts them: 12 per element,
//     no write-allocate);
//   - 200 tensors x 4,096 f32: per-tensor (one apply_adam node each) vs one fused_adam
//     node; target: fused at least 3x faster;
//   - 8 tensors x 1M f32: the same, and fused against the floor: 28 bytes per element
//     (read p, g, m, v; write p, m, v) over the triad bandwidth; target: within 1.25x.
// PyTorch 1.13's Adam on this machine (4.1 ms and 12 ms, quoted figures) is printed as
// context only; it is not measured here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct optimizer_bench_options {
  int repetitions = 15;
  int threads = 2;
  bool quick = false;
};

/// One workload: `tensors` f32 parameters of `elements` each.
struct adam_case_result {
  std::string label;
  int tensors = 0;
  std::int64_t elements = 0;
  double unfused_ms = 0;          // median: one apply_adam node per tensor
  double fused_ms = 0;            // median: one fused_adam node (check_finite: two passes)
  double fused_one_pass_ms = 0;   // median: fused_adam with check_finite = false
  double unfused_kernels_ms = 0;  // median of traced runs: time inside apply_adam, summed
  double fused_kernel_ms = 0;     // median of traced runs: time inside fused_adam
  double fused_one_pass_kernel_ms = 0;
  double speedup = 0;   // unfused / fused
  /// median: PyTorch's single-tensor Adam as a chain of element-wise nodes per parameter
  double op_by_op_ms = 0;
  double speedup_vs_op_by_op = 0;  // op_by_op / fused
  double bytes = 0;     // 28 per element
  double floor_ms = 0;  // bytes / triad bandwidth
  double fused_over_floor = 0;
  double pytorch_ms = 0;  // a quoted figure, for context
};

struct optimizer_bench_result {
  int repetitions = 0;
  int threads = 0;
  double triad_gb_per_s = 0;  // median
  double triad_mib_per_array = 0;
  std::vector<adam_case_result> cases;
  double target_speedup = 3.0;       // on the 200 x 4096 case
  double target_floor_ratio = 1.25;  // on the 8 x 1M case
};

optimizer_bench_result run_optimizer_bench(const optimizer_bench_options& options);
nlohmann::json to_json(const optimizer_bench_result& r);
std::string to_text(const optimizer_bench_result& r);

}  // namespace loom::bench
