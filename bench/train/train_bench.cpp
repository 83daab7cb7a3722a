#include "train/train_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::bench {

const std::vector<std::string>& train_bench_parts() {
  static const std::vector<std::string> parts = {"optimizer", "models", "amp"};
  return parts;
}

train_bench_result run_train_bench(const train_bench_options& options) {
  const auto& parts = train_bench_parts();
  if (!options.only.empty() && std::find(parts.begin(), parts.end(), options.only) == parts.end()) {
    throw invalid_argument(fmt::format("loom bench train: unknown part '{}' (parts: {})",
                                       options.only, fmt::join(parts, ", ")));
  }
  auto wants = [&](const char* part) { return options.only.empty() || options.only == part; };
  train_bench_result r;
  r.options = options;
  const int repetitions = options.quick ? std::min(options.repetitions, 3) : options.repetitions;
  if (wants("optimizer")) {
    r.optimizer = run_optimizer_bench(
        {.repetitions = repetitions, .threads = options.threads, .quick = options.quick});
  }
  if (wants("models")) r.models = run_model_bench(options.threads, repetitions, options.quick);
  if (wants("amp")) r.amp = run_amp_bench(options.threads, repetitions, options.quick);
  return r;
}

nlohmann::json to_json(const train_bench_result& r) {
  nlohmann::json j = nlohmann::json::object();
  if (r.optimizer) j["optimizer"] = to_json(*r.optimizer);
  if (r.models) j["models"] = to_json(*r.models);
  if (r.amp) j["amp"] = to_json(*r.amp);
  return j;
}

std::string to_text(const train_bench_result& r) {
  std::string out;
  if (r.optimizer) out += to_text(*r.optimizer);
  if (r.models) {
    if (!out.empty()) out += '\n';
    out += to_text(*r.models);
  }
  if (r.amp) {
    if (!out.empty()) out += '\n';
    out += to_text(*r.amp);
  }
  return out;
}

}  // namespace loom::bench
