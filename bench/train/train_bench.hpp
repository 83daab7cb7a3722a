// `loom bench train`: the parts of a training step, each measured against its peer or its
// floor in the same run. Parts: the optimizer step (train/optimizer_bench.hpp); the model
// parts (an MLP and a CNN step) join here as they land.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/amp_bench.hpp"
#include "train/model_bench.hpp"
#include "train/optimizer_bench.hpp"

namespace loom::bench {

struct train_bench_options {
  int repetitions = 15;
  int threads = 2;
  /// Fewer repetitions (a smoke run).
  bool quick = false;
  /// Run one part only ("optimizer", "models" or "amp"); empty: every part.
  std::string only;
};

struct train_bench_result {
  train_bench_options options;
  std::optional<optimizer_bench_result> optimizer;
  std::optional<model_bench_result> models;
  std::optional<amp_bench_result> amp;
};

/// The part names `only` accepts.
const std::vector<std::string>& train_bench_parts();

/// Runs the parts selected by options.only. Throws loom::invalid_argument for an unknown part.
train_bench_result run_train_bench(const train_bench_options& options);
nlohmann::json to_json(const train_bench_result& r);
std::string to_text(const train_bench_result& r);

}  // namespace loom::bench
