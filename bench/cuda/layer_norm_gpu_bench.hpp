// `loom bench cuda` layer_norm: LayerNorm forward and forward+backward on [4096, 1024] f32 on
// GPU 0, the figures to set beside PyTorch's F.layer_norm on the same GPU (the lead's Python
// side measures the peer).
//   - kernel: loom's CUDA kernels (src/backends/cuda/kernels/layer_norm.cu) launched directly
//     on a stream of their own, timed with CUDA events around each repetition, as PyTorch
//     is timed: forward = layer_norm; forward+backward = layer_norm then layer_norm_grad (dx,
//     dgamma, dbeta);
//   - session: the same through session::run with x, gamma, beta and dy held as variables on
//     cuda:0 and the results left there, by the wall clock up to cudaDeviceSynchronize (the
//     executor's and plan's overhead included).
// Figures are medians of `repetitions` timed runs after warm-up runs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::bench {

struct layer_norm_gpu_result {
  /// False when there is no GPU (or loom was built without CUDA); `reason` says why.
  bool available = false;
  std::string reason;
  std::string device;  // loom::cuda::describe()
  int repetitions = 0;
  std::int64_t rows = 4096;
  std::int64_t cols = 1024;
  double forward_ms = 0;           // median, CUDA events: the forward kernel
  double forward_backward_ms = 0;  // median, CUDA events: forward and backward kernels
  /// Through a session (0 when it failed: session_error says why).
  double session_forward_ms = 0;
  double session_forward_backward_ms = 0;
  std::string session_error;
};

/// Measures the LayerNorm kernels on cuda:0 (medians of `repetitions` >= 1 runs). Without a
/// GPU returns available = false and the reason; throws loom::error when a CUDA call fails
/// on a machine that has one.
layer_norm_gpu_result run_layer_norm_gpu_bench(int repetitions);
nlohmann::json to_json(const layer_norm_gpu_result& r);
std::string to_text(const layer_norm_gpu_result& r);

}  // namespace loom::bench
