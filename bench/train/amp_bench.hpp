// `loom bench train --only amp`: mixed precision against float32 on the same machine in the
// same run, through loom::train (batch 128, fused Adam): samples/s and the devices' peak
// memory of the MLP 784-512-512-10 and the CNN, float32 and bfloat16 AMP, and how many
// nodes the amp pass lowered (with the reason when it lowered none: a CPU without native
// bfloat16). Target: AMP at least 1.5x float32's samples/s.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct amp_bench_row {
  std::string model;
  int threads = 0;
  double fp32_samples_per_second = 0;  // medians over repetitions
  double amp_samples_per_second = 0;
  std::size_t fp32_peak_bytes = 0;
  std::size_t amp_peak_bytes = 0;
  std::size_t lowered_nodes = 0;  // nodes the amp pass lowered in the training step
  std::string kept_reason;        // why it lowered none, when it did not
};

struct amp_bench_result {
  int repetitions = 0;
  std::int64_t steps = 0;
  std::string type = "bfloat16";
  std::vector<amp_bench_row> rows;
};

amp_bench_result run_amp_bench(int threads, int repetitions, bool quick);
nlohmann::json to_json(const amp_bench_result& r);
std::string to_text(const amp_bench_result& r);

}  // namespace loom::bench
