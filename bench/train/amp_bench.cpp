#include "train/amp_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "bench_stats.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"
#include "train/model_bench.hpp"

namespace loom::bench {
namespace {

struct measured {
  double samples_per_second = 0;
  std::size_t peak_bytes = 0;
  std::size_t lowered = 0;
  std::string kept_reason;
};

// Samples/s of the second of two short epochs (the first warms up the pools, oneDNN's
// primitive caches and the plan), median over repetitions; peak memory of the last one.
measured measure(const train::dataset& data, const std::string& model, int threads,
                 std::int64_t steps, int repetitions, dtype amp) {
  train::train_options o = bench_train_options(model, threads, steps);
  o.passes.amp.type = amp;
  measured m;
  std::vector<double> rates;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto report = train::train(data, data, o);
    rates.push_back(report.epochs.back().samples_per_second);
    m.peak_bytes = report.peak_bytes;
    const passes::amp_summary a = passes::summarize_amp(report.passes);
    m.lowered = a.lowered;
    m.kept_reason = a.kept_reason;
  }
  m.samples_per_second = median(rates);
  return m;
}

}  // namespace

amp_bench_result run_amp_bench(int threads, int repetitions, bool quick) {
  amp_bench_result r;
  r.repetitions = std::max(1, quick ? 1 : std::min(repetitions, 5));
  r.steps = quick ? 8 : 40;
  const train::dataset data = train::make_digits(128 * r.steps, 1);
  for (const auto& [model, name, steps] : {std::tuple{"mlp", "mlp 784-512-512-10", r.steps},
                                           std::tuple{"cnn", "cnn conv32-pool-conv64-pool-fc10",
                                                      std::max<std::int64_t>(4, r.steps / 4)}}) {
    const measured f32 = measure(data, model, threads, steps, r.repetitions, dtype::f32);
    const measured low = measure(data, model, threads, steps, r.repetitions, dtype::bf16);
    r.rows.push_back({name, threads, f32.samples_per_second, low.samples_per_second, f32.peak_bytes,
                      low.peak_bytes, low.lowered,
                      low.lowered == 0 ? low.kept_reason : std::string()});
  }
  return r;
}

nlohmann::json to_json(const amp_bench_result& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    rows.push_back({{"model", row.model},
                    {"threads", row.threads},
                    {"batch", 128},
                    {"fp32_samples_per_second", row.fp32_samples_per_second},
                    {"amp_samples_per_second", row.amp_samples_per_second},
                    {"speedup", row.amp_samples_per_second / row.fp32_samples_per_second},
                    {"target_speedup", 1.5},
                    {"fp32_peak_bytes", row.fp32_peak_bytes},
                    {"amp_peak_bytes", row.amp_peak_bytes},
                    {"lowered_nodes", row.lowered_nodes},
                    {"kept_reason", row.kept_reason}});
  }
  return {{"repetitions", r.repetitions}, {"steps", r.steps}, {"amp", r.type}, {"rows", rows}};
}

std::string to_text(const amp_bench_result& r) {
  std::string out = fmt::format(
      "mixed precision ({} AMP) against float32, batch 128, Adam (fused), median of {} (second "
      "of two {}-step epochs)\n  {:<34} {:>7} {:>11} {:>11} {:>8} {:>10} {:>10} {:>8}  target\n",
      r.type, r.repetitions, r.steps, "model", "threads", "fp32 /s", "amp /s", "speedup",
      "fp32 peak", "amp peak", "lowered");
  for (const auto& row : r.rows) {
    const double s = row.amp_samples_per_second / row.fp32_samples_per_second;
    out += fmt::format(
        "  {:<34} {:>7} {:>11.0f} {:>11.0f} {:>8.2f} {:>9.1f}M {:>9.1f}M {:>8}  >= 1.5: {}\n",
        row.model, row.threads, row.fp32_samples_per_second, row.amp_samples_per_second, s,
        static_cast<double>(row.fp32_peak_bytes) / 1e6,
        static_cast<double>(row.amp_peak_bytes) / 1e6, row.lowered_nodes,
        s >= 1.5 ? "met" : "NOT met");
    if (!row.kept_reason.empty()) out += fmt::format("    no node lowered: {}\n", row.kept_reason);
  }
  return out;
}

}  // namespace loom::bench
