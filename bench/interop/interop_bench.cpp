#include "interop/interop_bench.hpp"

#include <algorithm>

namespace loom::bench {

const std::vector<std::string>& interop_bench_parts() {
  static const std::vector<std::string> parts{"dlpack", "layout"};
  return parts;
}

interop_bench_result run_interop_bench(const interop_bench_options& options) {
  interop_bench_result r;
  r.options = options;
  const auto wanted = [&](const char* part) {
    return options.only.empty() || options.only == part;
  };
  const int reps = options.quick ? std::min(options.repetitions, 3) : options.repetitions;
  if (wanted("dlpack")) r.dlpack = run_dlpack_bench(reps, options.quick);
  if (wanted("layout")) {
    layout_bench_options lo;
    lo.repetitions = reps;
    lo.threads = options.threads;
    lo.quick = options.quick;
    r.layout = run_layout_bench(lo);
  }
  return r;
}

nlohmann::json to_json(const interop_bench_result& r) {
  nlohmann::json out = {{"threads", r.options.threads}, {"quick", r.options.quick}};
  if (r.dlpack) out["dlpack"] = to_json(*r.dlpack);
  if (r.layout) out["layout"] = to_json(*r.layout);
  return out;
}

std::string to_text(const interop_bench_result& r) {
  std::string out;
  if (r.dlpack) out += to_text(*r.dlpack);
  if (r.layout) out += to_text(*r.layout);
  return out;
}

}  // namespace loom::bench
