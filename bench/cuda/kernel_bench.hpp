// `loom bench cuda` (kernels): loom's CUDA kernels against the raw library call or the
// memory-bandwidth peer, measured in the same run with CUDA events on the device's compute
// stream (medians of repeated batches of launches).
//   - matmul: loom's matmul / fused_matmul kernels, run through a session over variables
//     already on the GPU, against a direct cublasLtMatmul of the same shapes, dtypes and
//     epilogue on the same buffers, stream and workspace size (4096^3 f32 and bf16; 1024 x
//     4096 x 4096 with bias + relu). Target: loom at >= 0.95 of the peer's speed.
//   - fused_adam: one fused_adam step over 200 f32 tensors of 256M parameters in all
//     (bytes moved: 28 per element, read p, g, m, v and write p, m, v) against a
//     cudaMemcpyAsync device-to-device copy of as many bytes (read + write) in the same run.
//     Target: loom at >= 80% of the copy's bandwidth.
// Without a GPU (or without the CUDA headers in this build) the results say why
// (available = false, reason).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct gpu_bench_options {
  int repetitions = 10;  // batches timed; the median is reported
  bool quick = false;    // smaller shapes and fewer launches (smoke runs)
};

/// One measured case: loom's time against the peer's on the same work.
struct gpu_bench_row {
  std::string name;
  std::string peer;
  double loom_ms = 0;  // median time of one call
  double peer_ms = 0;
  double loom_rate = 0;  // TFLOP/s (matmul) or GB/s (fused_adam)
  double peer_rate = 0;
  std::string rate_unit;
  double ratio = 0;  // loom_rate / peer_rate
  double target = 0;  // 0: no target (reported for comparison)
  nlohmann::json params = nlohmann::json::object();  // the case's parameters, for peers
};

struct gpu_bench_result {
  bool available = false;
  std::string reason;  // why not, when !available
  std::string device;
  int repetitions = 0;
  std::vector<gpu_bench_row> rows;
};

/// The matmul rows (see above). Never throws for a missing GPU; errors of a run propagate.
gpu_bench_result run_matmul_gpu_bench(const gpu_bench_options& options = {});
/// The fused_adam row (see above).
gpu_bench_result run_fused_adam_gpu_bench(const gpu_bench_options& options = {});

nlohmann::json to_json(const gpu_bench_result& r);
std::string to_text(const gpu_bench_result& r);

}  // namespace loom::bench
