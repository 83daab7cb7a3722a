// `loom bench interop`: zero-copy interop, each part against its target or floor in the
// same run. Parts: dlpack (interop/dlpack_bench.hpp) and layout, AoS <-> SoA against the
// STREAM-triad floor (interop/layout_bench.hpp).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "interop/dlpack_bench.hpp"
#include "interop/layout_bench.hpp"

namespace loom::bench {

struct interop_bench_options {
  int repetitions = 15;
  int threads = 2;
  /// Fewer repetitions and smaller problems (a smoke run).
  bool quick = false;
  /// Run one part only; empty: every part.
  std::string only;
};

struct interop_bench_result {
  interop_bench_options options;
  std::optional<dlpack_bench_result> dlpack;
  std::optional<layout_bench_result> layout;
};

/// The part names `only` accepts.
const std::vector<std::string>& interop_bench_parts();

/// Runs the parts selected by options.only.
interop_bench_result run_interop_bench(const interop_bench_options& options);
nlohmann::json to_json(const interop_bench_result& r);
std::string to_text(const interop_bench_result& r);

}  // namespace loom::bench
