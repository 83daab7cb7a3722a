// `loom bench onnx MODEL`: an ONNX model's inference latency (batch 1) and throughput
// (batch 32) through loom, and through ONNX Runtime in the same run (its CPU library from
// the npm package onnxruntime-node, driven by bench/onnx/ort_bench.js with the same .onnx
// file and thread count).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::bench {

struct onnx_bench_options {
  std::string model;
  std::vector<int> batches{1, 32};
  std::vector<int> threads{1, 2};
  int warmup = 3;
  /// Timed runs at batch 1; larger batches run max(3, iterations * 4 / batch).
  int iterations = 20;
  /// Values of symbolic dimensions other than the batch, by name ("seq" -> 128).
  std::map<std::string, std::int64_t> dims;
  /// The ONNX Runtime peer: `node <script>`; empty: $LOOM_ORT_BENCH or
  /// bench/onnx/ort_bench.js under the working directory. "none" skips it.
  std::string ort_script;
  /// Also trace a few runs of each row and report loom's time per op (profile).
  bool profile = false;
};

/// loom's time in one op over a traced run: the sum of its nodes' durations.
struct op_time {
  std::string op;
  int nodes = 0;
  double ms = 0;
};

struct latency {
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double mean_ms = 0;
  double samples_per_s = 0;
};

struct onnx_bench_row {
  int batch = 1;
  int threads = 1;
  latency loom;
  std::optional<latency> ort;
  /// Why ONNX Runtime did not run, when it did not.
  std::string ort_missing;
  /// With onnx_bench_options::profile: per op, most time first (the median of 5 traced runs).
  std::vector<op_time> profile;
};

struct onnx_bench_result {
  std::string model;
  std::string ort_version;
  std::vector<onnx_bench_row> rows;
};

onnx_bench_result run_onnx_bench(const onnx_bench_options& options);
std::string to_text(const onnx_bench_result& r);
nlohmann::json to_json(const onnx_bench_result& r);

}  // namespace loom::bench
