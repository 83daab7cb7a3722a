// `loom bench` layer_norm: LayerNorm forward and forward+backward on [4096, 1024] f32
// through a session, against PyTorch's F.layer_norm measured in the same run.
//   - forward: a session running layer_norm(x, gamma, beta), fed x, gamma and beta,
//     fetching y;
//   - forward+backward: the same graph and its gradients with respect to x, gamma and beta
//     (gradients(y, {x, gamma, beta}, dy): one layer_norm_grad node), fed x, gamma, beta
//     and dy, fetching y, dx, dgamma and dbeta;
//   - the peer: python/bench/layer_norm_torch.py run by /usr/bin/python3 as a subprocess
//     with the same thread count. Where that python cannot import torch (or the script is
//     missing), the result says the peer is unavailable and why, instead of failing.
// Figures are medians of `repetitions` timed runs after warm-up runs; the target
// is loom at least 1.5x faster than PyTorch in both, as ratios measured in the same run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::bench {

struct layer_norm_bench_result {
  int threads = 0;
  int repetitions = 0;
  std::int64_t rows = 4096;
  std::int64_t cols = 1024;
  double forward_ms = 0;           // median session.run: layer_norm, fetching y
  double forward_backward_ms = 0;  // median session.run: y, dx, dgamma, dbeta
  double forward_kernel_ms = 0;    // median time inside the layer_norm kernel (traced runs)
  double backward_kernel_ms = 0;   // median time inside the layer_norm_grad kernel
  /// The peer: measured (peer_available) or why not (peer_unavailable_reason).
  bool peer_available = false;
  std::string peer_unavailable_reason;
  std::string torch_version;
  double torch_forward_ms = 0;
  double torch_forward_backward_ms = 0;
  double forward_speedup = 0;           // torch / loom (0 when the peer is unavailable)
  double forward_backward_speedup = 0;  // torch / loom
  double target_speedup = 1.5;
};

/// Measures loom's layer_norm forward and forward+backward on [4096, 1024] f32 on a CPU
/// device of `threads` threads (medians of `repetitions` runs; `quick`: at most 5), and
/// PyTorch's through python/bench/layer_norm_torch.py with the same threads and
/// repetitions. Throws what session::run throws; a missing or failing peer is reported in
/// the result, not thrown.
layer_norm_bench_result run_layer_norm_bench(int threads, int repetitions, bool quick);
nlohmann::json to_json(const layer_norm_bench_result& r);
std::string to_text(const layer_norm_bench_result& r);

}  // namespace loom::bench
