// `loom bench fusion --only batch_norm`: batch normalisation in training, forward and
// forward+backward, through a session, against PyTorch's torch.nn.BatchNorm2d in train()
// measured in the same run (python/bench/batch_norm_torch.py, same thread count), and as a
// fraction of the bandwidth floor:
//   - forward: batch_norm_train(x, scale, bias, running_mean, running_var) fed x, fetching
//     y (the running statistics updated, as PyTorch's are);
//   - forward+backward: the same and its gradients with respect to x, scale and bias
//     (gradients(y, ..., dy): one batch_norm_train_grad node), fetching y, dx, dscale, dbias;
//   - the floor: the bytes that must move (forward: read x, write y; backward: read dy and
//     x, write dx) at STREAM triad's bandwidth over arrays of the batch's size, measured in
//     the same run.
// Cases: [32, 64, 56, 56] and [64, 256, 14, 14] float32 NCHW against BatchNorm2d, and the
// first in NHWC against BatchNorm2d on a channels_last batch. Medians of `repetitions`
// timed runs; the target is loom at least 1.5x faster than PyTorch in both.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::bench {

struct batch_norm_case {
  std::vector<std::int64_t> shape;  // [N, C, H, W] (for NHWC: the batch is [N, H, W, C])
  std::string data_format;
  double triad_gb_per_s = 0;       // over arrays of the batch's size, same run
  double forward_ms = 0;           // median session.run
  double forward_backward_ms = 0;  // median session.run
  double forward_floor_ms = 0;     // 2 x bytes at the triad's bandwidth
  double forward_backward_floor_ms = 0;  // 5 x bytes
  bool peer_available = false;
  std::string peer_unavailable_reason;
  double torch_forward_ms = 0;
  double torch_forward_backward_ms = 0;
};

struct batch_norm_bench_result {
  int threads = 0;
  int repetitions = 0;
  std::string torch_version;
  std::vector<batch_norm_case> cases;
  double target_speedup = 1.5;
};

batch_norm_bench_result run_batch_norm_bench(int threads, int repetitions, bool quick);
nlohmann::json to_json(const batch_norm_bench_result& r);
std::string to_text(const batch_norm_bench_result& r);

}  // namespace loom::bench
