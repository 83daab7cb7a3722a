// `loom train`: loom's main job. Trains a classifier (MLP or CNN) on the embedded digits
// dataset or a CSV file, shows progress, and prints a summary.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "commands.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/memory/allocation_log.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "memory_report_files.hpp"
#include "loom/core/memory_stats.hpp"
#include "loom/core/progress.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

namespace loom::tools {
namespace {

struct train_flags {
  train::train_options options;
  std::string data;
  std::int64_t examples = 24000;
  double test_fraction = 1.0 / 6.0;
  bool no_fused = false;
  bool quiet = false;
  bool explain_fusion = false;
  bool no_passes = false;
  std::string memory_report;  // --memory-report: the page (memory_report_files.hpp)
};

// What a training run's allocation log is replayed against for its report: a pool made as
// cpu:0's is (cpu_pool_options), over host memory.
class train_pool {
 public:
  train_pool() : pool_(memory::host_resource::instance(), cpu_pool_options(0, 0)) {}
  [[nodiscard]] memory::memory_resource& resource() const noexcept { return pool_; }
  [[nodiscard]] memory::bfc_pool* pool() const noexcept { return &pool_; }
  [[nodiscard]] std::string describe() const {
    return fmt::format("cpu:0's pool (growing bfc_pool, growth step {}), replayed from the "
                       "training run's allocation log",
                       format_bytes(pool_.options().growth_step));
  }

 private:
  mutable memory::bfc_pool pool_;
};

// The report of a training run: its log, replayed (memory_report_files.hpp).
void write_training_report(const std::filesystem::path& log_path, std::ofstream& out,
                           const std::string& path, const std::string& title) {
  const memory::allocation_log log = memory::parse_allocation_log(log_path);
  memory::replay_options o;
  o.samples = report_samples;
  const memory::replay_report report = memory::replay(log, train_pool().resource(), o);
  write_report(out, path, picture_of(log, report, [] { return train_pool(); }, title));
}

// "epoch 1/3 [##########..........] 15360/20000  77%  15234 samples/s  ETA 0:01  loss 0.3521
// acc 91.4%" on a terminal; plain lines at most every 5 s otherwise (loom::progress).
void show_progress(progress& bar, const train::step_progress& p, std::int64_t batch,
                   std::int64_t examples) {
  const std::string label = fmt::format("epoch {}/{}", p.epoch, p.epochs);
  if (p.step <= 1) bar.relabel(label);
  const std::int64_t done = std::min(p.step * batch, examples);
  bar.update(done, examples, fmt::format("loss {:.4f}  acc {:.1f}%", p.loss, 100 * p.accuracy));
}

// The slowest nodes, in ms per step, against the mean step time.
void print_profile(const train::train_report& report) {
  const double step_ms = 1e3 * report.train_seconds / static_cast<double>(report.steps);
  fmt::print("\nprofile (mean per step over {} traced steps; a step takes {:.2f} ms)\n",
             report.steps, step_ms);
  fmt::print("  {:<32} {:<24} {:>9} {:>7}\n", "node", "op", "ms", "% step");
  constexpr std::size_t shown = 20;
  double rest = 0;
  for (std::size_t i = 0; i < report.profile.size(); ++i) {
    const double ms = 1e3 * report.profile[i].seconds_per_step;
    if (i >= shown) {
      rest += ms;
    } else {
      fmt::print("  {:<32} {:<24} {:>9.3f} {:>6.1f}%\n", report.profile[i].node,
                 report.profile[i].op, ms, 100 * ms / step_ms);
    }
  }
  if (report.profile.size() > shown) {
    fmt::print("  {:<57} {:>9.3f} {:>6.1f}%\n",
               fmt::format("{} more nodes", report.profile.size() - shown), rest,
               100 * rest / step_ms);
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train", "Train a classifier (MLP or CNN) on the embedded digits dataset or a CSV file");
  auto f = std::make_shared<train_flags>();
  auto& o = f->options;
  cmd->add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  cmd->add_option("--data", f->data,
                  "A CSV file of label,feature,... rows (default: the embedded digits dataset)");
  cmd->add_option("--examples", f->examples, "Examples of the embedded dataset")
      ->check(CLI::Range(std::int64_t{20}, std::int64_t{10'000'000}));
  cmd->add_option("--epochs", o.epochs, "Epochs")->check(CLI::Range(0, 100000));
  cmd->add_option("--batch", o.batch, "Batch size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--lr", o.lr, "Learning rate")->check(CLI::PositiveNumber);
  cmd->add_option("--optimizer", o.optimizer, "adam, adamw or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  cmd->add_flag("--fused,!--no-fused", o.fused,
                "One fused multi-tensor update (default) or one update per parameter");
  cmd->add_option("--devices", o.devices, "Virtual CPU devices to spread the layers over")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--threads", o.threads, "CPU threads in all (0: the machine's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "Seed of the data, the initial weights and the shuffling");
  cmd->add_option("--trace", o.trace_path, "Write a Chrome trace of one training step here");
  cmd->add_option("--checkpoint", o.checkpoint_dir,
                  "Save variables and optimizer state here after every epoch");
  cmd->add_flag("--resume", o.resume, "Continue from the checkpoint in --checkpoint");
  cmd->add_flag("--quiet", f->quiet, "No progress (a bar on a terminal, else a line every 5 s)");
  cmd->add_flag("--explain-fusion", f->explain_fusion,
                "Print what the graph passes rewrote and refused in the training step, and why");
  cmd->add_flag("--no-passes", f->no_passes, "Run the training graph as written (no graph passes)");
  cmd->add_option("--memory-report", f->memory_report,
                  "Write a memory report of cpu:0's pool here: one self-contained HTML page "
                  "(docs/memory.md)");
  cmd->add_flag("--profile", o.profile,
                "Trace every step and print the nodes that take the most time per step");
  cmd->callback([f] {
    auto& opts = f->options;
    opts.passes.enabled = !f->no_passes;
    // The report's file first: one that cannot be written fails before any training.
    std::ofstream report_file;
    if (!f->memory_report.empty()) {
      report_file = open_report(f->memory_report);
      opts.memory_log = std::filesystem::temp_directory_path() /
                        fmt::format("loom-train-{}.alloc.csv", ::getpid());
    }
    train::dataset all =
        f->data.empty() ? train::make_digits(f->examples, opts.seed) : train::load_csv(f->data);
    auto [train_set, test_set] = train::split(all, f->test_fraction, opts.seed);
    const bool tty = isatty(fileno(stderr)) != 0;
    fmt::print(
        "loom train: {} examples of {} ({} train, {} test, {} classes), model {}, "
        "{} optimizer ({}), batch {}, lr {}\n",
        all.size(), all.name, train_set.size(), test_set.size(), all.num_classes, opts.model,
        opts.optimizer, opts.fused ? "fused" : "per-tensor", opts.batch, opts.lr);
    std::fflush(stdout);
    progress bar("epoch", "samples", tty);
    const auto examples = static_cast<std::int64_t>(train_set.size());
    const auto report = train::train(train_set, test_set, opts, [&](const train::step_progress& p) {
      if (!f->quiet) show_progress(bar, p, opts.batch, examples);
    });
    bar.finish();
    if (!f->memory_report.empty()) {
      write_training_report(opts.memory_log, report_file, f->memory_report,
                            fmt::format("loom train --model {} ({} epochs, batch {})", opts.model,
                                        opts.epochs, opts.batch));
      std::filesystem::remove(opts.memory_log);
    }
    if (report.resumed_epoch > 0) fmt::print("resumed after epoch {}\n", report.resumed_epoch);
    for (const auto& e : report.epochs) {
      fmt::print(
          "epoch {:>3}: loss {:.4f}  train acc {:6.2f}%  test acc {:6.2f}%  {:.0f} samples/s\n",
          e.epoch, e.loss, 100 * e.train_accuracy, 100 * e.test_accuracy, e.samples_per_second);
    }
    fmt::print("\nsummary\n");
    fmt::print("  model              {} ({} parameters)\n", report.model_summary,
               report.parameters);
    fmt::print("  test accuracy      {:.2f}%\n", 100 * report.test_accuracy);
    fmt::print("  throughput         {:.0f} samples/s ({} steps in {:.2f} s)\n",
               report.samples_per_second, report.steps, report.train_seconds);
    fmt::print(
        "  optimizer steps    {:.3f} s ({:.1f}% of training, estimated from traced steps)\n",
        report.optimizer_seconds,
        report.train_seconds > 0 ? 100 * report.optimizer_seconds / report.train_seconds : 0.0);
    fmt::print("  peak memory        {}\n", format_bytes(report.peak_bytes));
    fmt::print("  fragmentation      {:.3f}\n", report.fragmentation);
    if (!opts.checkpoint_dir.empty()) {
      fmt::print("  checkpoint         {}\n",
                 (opts.checkpoint_dir / "checkpoint.safetensors").string());
    }
    if (!opts.trace_path.empty()) fmt::print("  trace              {}\n", opts.trace_path.string());
    if (!report.profile.empty()) print_profile(report);
    if (f->explain_fusion) {
      fmt::print("\ngraph passes (training step)\n");
      for (const auto& r : report.passes) fmt::print("  {}\n", passes::to_string(r));
    }
  });
}

}  // namespace loom::tools
