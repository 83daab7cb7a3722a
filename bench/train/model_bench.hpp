// `loom bench train --only models`: training throughput of the two built-in models through
// loom::train (graph, gradients, fused Adam, session), in samples per second.
//   - MLP 784-512-512-10, batch 128, Adam, at 1 and 2 threads;
//   - CNN (conv 3×3 32, relu, max-pool, conv 3×3 64, relu, max-pool, fc 10) on 1×28×28,
//     batch 128, Adam, at the bench's thread count.
// The peer is PyTorch's CPU throughput on the same models on this machine, as quoted
// for it (PyTorch is not installed here, so it is not measured in the same run).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "loom/train/trainer.hpp"

namespace loom::bench {

struct model_bench_row {
  std::string model;
  int threads = 0;
  double samples_per_second = 0;  // median over repetitions
  double pytorch_samples_per_second = 0;
  double target_ratio = 1.5;
};

struct model_bench_result {
  int repetitions = 0;
  std::int64_t steps = 0;
  std::vector<model_bench_row> rows;
};

/// What the training benches train with: `model` at batch 128 with fused Adam, two epochs
/// of `steps` steps (the second is the one timed), no evaluation, no traced steps.
train::train_options bench_train_options(const std::string& model, int threads, std::int64_t steps);

model_bench_result run_model_bench(int threads, int repetitions, bool quick);
nlohmann::json to_json(const model_bench_result& r);
std::string to_text(const model_bench_result& r);

}  // namespace loom::bench
