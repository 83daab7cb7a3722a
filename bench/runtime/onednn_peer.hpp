// loom's matmul and conv2d kernels against the same computation as a direct oneDNN call.
//
// The peer is written the way a user of oneDNN writes it: an engine and a stream, memory
// descriptors in the tensors' plain layouts (row-major matrices; NCHW activations and OIHW
// filters), a primitive built once and executed `repetitions` times after a warm-up, with
// OpenMP set to the same thread count. loom's side builds a graph (placeholders and one
// matmul or conv2d node), makes the node's kernel through kernel_registry::global() on a
// cpu_device with that many threads, and calls compute() through a kernel_context, with
// inputs and outputs from the device's pool: the path the executor takes, without it.
// The two are timed in alternation (one direct call, one loom call, ...) so that load on
// the machine falls on both alike; each figure is the median.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

/// A ResNet-style convolution: x [n, channels, size, size], filter [filters, channels,
/// kernel, kernel], stride 1, padding kernel / 2 on every side.
struct conv2d_case {
  int n = 1;
  int channels = 64;
  int filters = 64;
  int size = 56;
  int kernel = 3;
};

/// One workload measured both ways.
struct kernel_peer_result {
  std::string name;                // "matmul f32 1024x1024x1024", "conv2d f32 ..."
  double flop = 0;                 // floating-point operations per call
  double direct_seconds = 0;       // median, direct oneDNN call
  double loom_seconds = 0;         // median, loom's kernel
  double direct_gflops = 0;        // flop / direct_seconds / 1e9
  double loom_gflops = 0;          // flop / loom_seconds / 1e9
  double ratio = 0;                // loom_gflops / direct_gflops (target: >= 0.95)
  double direct_best_seconds = 0;  // fastest call, direct (less sensitive to other load)
  double loom_best_seconds = 0;    // fastest call, loom
  double best_ratio = 0;           // direct_best_seconds / loom_best_seconds
  std::string implementation;      // oneDNN's implementation of the direct primitive
};

/// Every workload of a run.
struct runtime_kernel_results {
  int threads = 0;
  int repetitions = 0;
  double target_ratio = 0.95;
  std::vector<kernel_peer_result> results;

  /// True when every ratio reaches target_ratio.
  [[nodiscard]] bool met() const;
};

/// Median seconds of a direct oneDNN f32 matmul, n x n by n x n, on `threads` OpenMP
/// threads, over `repetitions` calls after a warm-up.
double time_onednn_matmul(int n, int threads, int repetitions);
/// Median seconds of the same matmul through loom's kernel on a cpu_device of `threads`.
double time_loom_matmul(int n, int threads, int repetitions);
/// Median seconds of a direct oneDNN f32 convolution_forward (inference) of `c`.
double time_onednn_conv2d(const conv2d_case& c, int threads, int repetitions);
/// Median seconds of the same convolution through loom's conv2d kernel.
double time_loom_conv2d(const conv2d_case& c, int threads, int repetitions);

/// Measures matmul f32 n = 1024 and 2048 and ResNet-style conv2d layers (64 channels at
/// 56x56 and 128 at 28x28, batch 8) both ways, in alternation, on `threads` threads;
/// `quick`: matmul n = 1024 and one conv2d of batch 1 only. Takes seconds to a minute.
/// Throws loom::error when a kernel fails.
runtime_kernel_results run_kernel_peers(int threads, int repetitions, bool quick);

/// A table: one line per workload with both GFLOP/s figures and the ratio.
std::string to_text(const runtime_kernel_results& r);
nlohmann::json to_json(const runtime_kernel_results& r);

}  // namespace loom::bench
