#include "train/model_bench.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "bench_stats.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

namespace loom::bench {

train::train_options bench_train_options(const std::string& model, int threads, std::int64_t steps) {
  train::train_options o;
  o.model = model;
  o.batch = 128;
  o.epochs = 2;
  o.threads = threads;
  o.max_steps_per_epoch = steps;
  o.evaluate = false;
  o.sample_optimizer_time = false;
  return o;
}

namespace {

// Samples/s of the second of two short epochs (the first warms up the pools, oneDNN's
// primitive caches and the plan), median over repetitions.
double measure(const train::dataset& data, const std::string& model, int threads,
               std::int64_t steps, int repetitions) {
  const train::train_options o = bench_train_options(model, threads, steps);
  std::vector<double> rates;
  for (int rep = 0; rep < repetitions; ++rep) {
    rates.push_back(train::train(data, data, o).epochs.back().samples_per_second);
  }
  return median(rates);
}

}  // namespace

model_bench_result run_model_bench(int threads, int repetitions, bool quick) {
  model_bench_result r;
  r.repetitions = std::max(1, quick ? 1 : std::min(repetitions, 5));
  r.steps = quick ? 8 : 40;
  const train::dataset data = train::make_digits(128 * r.steps, 1);
  // PyTorch's figures on this machine, quoted: MLP about 24,000 samples/s; CNN
  // between about 3,100 and 3,800 by thread settings (the better one is the bar).
  for (int t : {1, threads}) {
    if (t == 1 && threads == 1 && !r.rows.empty()) continue;
    r.rows.push_back(
        {"mlp 784-512-512-10", t, measure(data, "mlp", t, r.steps, r.repetitions), 24000.0});
  }
  r.rows.push_back(
      {"cnn conv32-pool-conv64-pool-fc10", threads,
       measure(data, "cnn", threads, std::max<std::int64_t>(4, r.steps / 4), r.repetitions),
       3800.0});
  return r;
}

nlohmann::json to_json(const model_bench_result& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    rows.push_back({{"model", row.model},
                    {"threads", row.threads},
                    {"batch", 128},
                    {"samples_per_second", row.samples_per_second},
                    {"pytorch_samples_per_second_quoted", row.pytorch_samples_per_second},
                    {"ratio", row.samples_per_second / row.pytorch_samples_per_second},
                    {"target_ratio", row.target_ratio},
                    {"meets_target",
                     row.samples_per_second >= row.target_ratio * row.pytorch_samples_per_second}});
  }
  return {{"repetitions", r.repetitions}, {"steps", r.steps}, {"rows", rows}};
}

std::string to_text(const model_bench_result& r) {
  std::string out = fmt::format(
      "training throughput, batch 128, Adam (fused), median of {} (second of two {}-step "
      "epochs)\n  {:<34} {:>7} {:>12} {:>12} {:>7}  target\n",
      r.repetitions, r.steps, "model", "threads", "samples/s", "PyTorch*", "ratio");
  for (const auto& row : r.rows) {
    const double ratio = row.samples_per_second / row.pytorch_samples_per_second;
    out += fmt::format("  {:<34} {:>7} {:>12.0f} {:>12.0f} {:>7.2f}  >= {:.1f}: {}\n", row.model,
                       row.threads, row.samples_per_second, row.pytorch_samples_per_second, ratio,
                       row.target_ratio, ratio >= row.target_ratio ? "met" : "NOT met");
  }
  out +=
      "  * PyTorch's CPU throughput on this machine as quoted (not measured here:\n"
      "    PyTorch is not installed)\n";
  return out;
}

}  // namespace loom::bench
