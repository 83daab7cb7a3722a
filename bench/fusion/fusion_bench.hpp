// `loom bench fusion`: what the graph passes buy, each figure beside its peer measured in
// the same run.
//   - chain: an 8-op element-wise chain on 16M f32, fused (one fused_elementwise node)
//     against the same graph with the passes off (8 kernels), and against the STREAM triad
//     (both move 2 reads + 1 write per element). Targets: fused >= 4x unfused, and
//     >= 75% of the triad's bandwidth.
//   - mlp: the MLP training step (784-512-512-10, batch 128, per-tensor Adam so the
//     optimizer pass has work) with the passes on and off.
//   - layer_norm: LayerNorm forward and forward+backward on [4096, 1024] f32 against
//     PyTorch's CPU layer_norm (bench/fusion/layer_norm_bench.hpp). Target: >= 1.5x.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fusion/batch_norm_bench.hpp"
#include "fusion/layer_norm_bench.hpp"

namespace loom::bench {

struct fusion_bench_options {
  int threads = 2;
  int repetitions = 10;
  bool quick = false;
  bool run_chain = true;
  bool run_mlp = true;
  bool run_layer_norm = true;
  bool run_batch_norm = true;
};

struct chain_bench_result {
  std::int64_t elements = 0;
  int ops = 8;
  double fused_ms = 0;  // medians
  double unfused_ms = 0;
  double triad_gb_per_s = 0;
  double fused_gb_per_s = 0;  // 12 bytes per element, as the triad counts
  std::string fused_expr;     // what the pass made
};

struct mlp_passes_result {
  double on_samples_per_second = 0;
  double off_samples_per_second = 0;
  std::size_t rewrites = 0;
};

struct fusion_bench_result {
  int threads = 0;
  int repetitions = 0;
  std::optional<chain_bench_result> chain;
  std::optional<mlp_passes_result> mlp;
  std::optional<layer_norm_bench_result> layer_norm;
  std::optional<batch_norm_bench_result> batch_norm;
};

fusion_bench_result run_fusion_bench(const fusion_bench_options& o);
nlohmann::json to_json(const fusion_bench_result& r);
std::string to_text(const fusion_bench_result& r);

}  // namespace loom::bench
