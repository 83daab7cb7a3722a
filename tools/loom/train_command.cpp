// `loom train`: loom's main job. Trains a classifier (MLP or CNN) on the embedded digits
// dataset or a CSV file, shows progress, and prints a summary.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "commands.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/core/memory_stats.hpp"
#include "loom/core/progress.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/allocation_log.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"
#include "memory_report_files.hpp"

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
  std::string resume;         // --resume: "" (no), "auto" or "require"
  train::csv_options csv;     // --classes
  double bucket_mb = 25;      // --bucket-mb
  bool no_overlap = false;    // --no-overlap
  std::string amp = "off";    // --amp
};

// Under mpirun: the world, and each rank's share of the machine's cores when --threads
// does not say (the ranks on this machine split them; OMPI_COMM_WORLD_LOCAL_SIZE).
void join_the_world(train::train_options& o) {
  if (!distributed::launched_with_peers()) return;
  o.communicator = distributed::world();
  if (o.threads != 0) return;
  int local = 1;
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    try {
      local = std::max(1, parse_number<int>(v, "OMPI_COMM_WORLD_LOCAL_SIZE"));
    } catch (const error&) {
      local = 1;
    }
  }
  o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
}

// What a training run's allocation log is replayed against for its report: a pool made as
// cpu:0's is (cpu_pool_options), over host memory.
class train_pool {
 public:
  train_pool() : pool_(memory::host_resource::instance(), cpu_pool_options(0, 0)) {}
  [[nodiscard]] memory::memory_resource& resource() const noexcept { return pool_; }
  [[nodiscard]] memory::bfc_pool* pool() const noexcept { return &pool_; }
  [[nodiscard]] std::string describe() const {
    return fmt::format(
        "cpu:0's pool (growing bfc_pool, growth step {}), replayed from the "
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
  write_report(out, path,
               picture_of(
                   log, report, [] { return train_pool(); }, title));
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

// Removes a file when it goes out of scope (nothing when the path is empty).
struct remove_on_exit {
  explicit remove_on_exit(std::filesystem::path p) : path(std::move(p)) {}
  std::filesystem::path path;
  remove_on_exit(const remove_on_exit&) = delete;
  remove_on_exit& operator=(const remove_on_exit&) = delete;
  ~remove_on_exit() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove(path, ec);
  }
};

// A path option's check, made before any work: a usage error naming the option when the
// path cannot be used (Note [exit statuses] in commands.hpp).
template <class Check>
void check_path_option(const std::string& option, Check&& check) {
  try {
    check();
  } catch (const error& e) {
    usage_error(option, e.what());
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train", "Train a classifier (MLP or CNN) on the embedded digits dataset or a CSV file");
  auto f = std::make_shared<train_flags>();
  auto& o = f->options;
  cmd->add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  auto* data =
      cmd->add_option("--data", f->data,
                      "A CSV file of label,feature,... rows (default: the embedded digits dataset)")
          ->check(CLI::ExistingFile);
  cmd->add_option("--classes", f->csv.classes,
                  "The number of classes of --data: labels must be below it (default: the "
                  "largest label + 1, at most 10000)")
      ->check(CLI::Range(1, 1'000'000))
      ->needs(data);
  cmd->add_option("--examples", f->examples, "Examples of the embedded dataset")
      ->check(CLI::Range(std::int64_t{20}, std::int64_t{1'000'000}));
  cmd->add_option("--epochs", o.epochs, "Epochs (with --resume: in all, counting those done)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--batch", o.batch, "Batch size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_option("--lr", o.lr, "Learning rate")->check(finite_positive());
  cmd->add_option("--optimizer", o.optimizer, "adam, adamw or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  cmd->add_flag("--fused,!--no-fused", o.fused,
                "One fused multi-tensor update (default) or one update per parameter");
  cmd->add_option("--devices", o.devices, "Virtual CPU devices to spread the layers over")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--threads", o.threads, "CPU threads in all (0: the machine's)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--seed", o.seed, "Seed of the data, the initial weights and the shuffling")
      ->check(non_negative_integer());
  cmd->add_option("--trace", o.trace_path, "Write a Chrome trace of one training step here");
  auto* checkpoint = cmd->add_option("--checkpoint", o.checkpoint_dir,
                                     "Save variables and optimizer state here after every epoch");
  cmd->add_flag("--resume{auto}", f->resume,
                "Continue from the checkpoint in --checkpoint; with none there, start from "
                "scratch (--resume=require: fail instead, exit status 1)")
      ->check(CLI::IsMember({"auto", "require"}))
      ->needs(checkpoint);
  cmd->add_flag("--allow-nonfinite", o.allow_nonfinite,
                "Train on features (and resume from checkpoints) holding NaN or Inf; refused "
                "by default, naming the row or the tensor");
  cmd->add_flag("--skip-nonfinite-steps", o.skip_nonfinite_steps,
                "Skip (and count) steps whose loss or gradients are NaN or Inf instead of "
                "stopping; needs the fused update");
  cmd->add_flag("--batch-norm", o.batch_norm,
                "Batch normalisation after each convolution (cnn) or hidden layer (mlp), in "
                "place of its bias; evaluation uses the running statistics");
  cmd->add_flag("--sync-bn", o.sync_batch_norm,
                "Data-parallel training (under mpirun): the batch norms take their statistics "
                "over the global batch (sync_batch_norm); needs --batch-norm")
      ->needs("--batch-norm");
  cmd->add_option("--amp", f->amp,
                  "Automatic mixed precision: matrix products and convolutions in bf16 or fp16, "
                  "the rest and the master weights in fp32 (docs/training.md); fp16 scales the "
                  "loss")
      ->check(CLI::IsMember({"off", "bf16", "fp16"}));
  cmd->add_flag("--quiet", f->quiet, "No progress (a bar on a terminal, else a line every 5 s)");
  cmd->add_flag("--explain-fusion", f->explain_fusion,
                "Print what the graph passes rewrote and refused in the training step, and why");
  cmd->add_flag("--no-passes", f->no_passes, "Run the training graph as written (no graph passes)");
  cmd->add_option("--memory-report", f->memory_report,
                  "Write a memory report of cpu:0's pool here: one self-contained HTML page "
                  "(docs/memory.md)");
  cmd->add_flag("--profile", o.profile,
                "Trace every step and print the nodes that take the most time per step");
  cmd->add_option("--bucket-mb", f->bucket_mb,
                  "Data-parallel training (under mpirun): all-reduce the gradients in buckets "
                  "of this many MiB (the first 1 MiB at most)")
      ->check(CLI::Range(0.001, 1024.0));
  cmd->add_flag("--no-overlap", f->no_overlap,
                "Data-parallel training: all-reduce the gradients only once the backward pass "
                "is over, instead of each bucket as soon as it is ready");
  cmd->callback(guarded("train", [f] {
    auto& opts = f->options;
    opts.passes.enabled = !f->no_passes;
    opts.passes.amp.type = passes::amp_type_from_name(f->amp);
    opts.bucket_bytes = static_cast<std::size_t>(f->bucket_mb * 1024 * 1024);
    opts.overlap = !f->no_overlap;
    join_the_world(opts);
    // Under mpirun, rank 0 speaks for the job; the others print only their errors.
    const bool speaks = opts.communicator == nullptr || opts.communicator->rank() == 0;
    opts.resume = !f->resume.empty();
    opts.require_checkpoint = f->resume == "require";
    if (opts.skip_nonfinite_steps && !opts.fused) {
      usage_error("--skip-nonfinite-steps",
                  "needs the fused update (per-tensor updates cannot undo a step): drop "
                  "--no-fused");
    }
    // Nothing to resume from: with --resume=require an error before anything is made.
    std::error_code ec;
    const bool fresh = opts.resume && !std::filesystem::exists(train::checkpoint_file(opts), ec);
    if (fresh && opts.require_checkpoint) {
      throw not_found(fmt::format("nothing to resume from in '{}' (--resume=require): no {}",
                                  opts.checkpoint_dir.string(),
                                  train::checkpoint_file(opts).filename().string()));
    }
    // Where results go, before any work: a path that cannot be written is a usage error now.
    if (!opts.checkpoint_dir.empty()) {
      check_path_option("--checkpoint", [&] {
        create_output_directory(opts.checkpoint_dir, "checkpoint directory");
      });
    }
    if (!opts.trace_path.empty()) {
      check_path_option("--trace", [&] { check_output_file(opts.trace_path, "trace file"); });
    }
    std::ofstream report_file;
    if (!f->memory_report.empty()) {
      check_path_option("--memory-report", [&] { report_file = open_report(f->memory_report); });
      std::error_code tmp_ec;
      const std::filesystem::path tmp = std::filesystem::temp_directory_path(tmp_ec);
      if (tmp_ec) {
        const char* env = std::getenv("TMPDIR");
        usage_error("--memory-report",
                    fmt::format("the allocation log goes to the temporary directory, which is "
                                "not usable (TMPDIR='{}'): {}",
                                env != nullptr ? env : "", tmp_ec.message()));
      }
      opts.memory_log = tmp / fmt::format("loom-train-{}.alloc.csv", ::getpid());
    }
    if (fresh && speaks) {
      fmt::print(stderr, "loom train: nothing to resume from in '{}': starting from scratch\n",
                 opts.checkpoint_dir.string());
    }
    // The allocation log goes however the run ends.
    const remove_on_exit log_file{opts.memory_log};
    train::dataset all = f->data.empty() ? train::make_digits(f->examples, opts.seed)
                                         : train::load_csv(f->data, f->csv);
    auto [train_set, test_set] = train::split(all, f->test_fraction, opts.seed);
    if (opts.model == "cnn" && all.example_shape != shape{1, 28, 28}) {
      usage_error("--model", fmt::format("cnn takes 1x28x28 images (784 features); {} has {} "
                                         "features an example",
                                         all.name, all.num_features));
    }
    if (train_set.size() < opts.batch) {
      usage_error("--batch", fmt::format("{} is more than the {} training examples of {}",
                                         opts.batch, train_set.size(), all.name));
    }
    const bool tty = isatty(fileno(stderr)) != 0;
    if (speaks) {
      fmt::print(
          "loom train: {} examples of {} ({} train, {} test, {} classes), model {}, "
          "{} optimizer ({}), batch {}, lr {}\n",
          all.size(), all.name, train_set.size(), test_set.size(), all.num_classes, opts.model,
          opts.optimizer, opts.fused ? "fused" : "per-tensor", opts.batch, opts.lr);
      if (opts.batch_norm) {
        const bool sync = opts.sync_batch_norm && opts.communicator != nullptr &&
                          opts.communicator->size() > 1;
        fmt::print("batch norm: after each {}, {}\n",
                   opts.model == "cnn" ? "convolution" : "hidden layer",
                   sync ? "statistics over the global batch (sync_batch_norm)"
                        : "statistics over each rank's batch");
      }
      if (opts.passes.amp.enabled()) {
        fmt::print("mixed precision: {} matrix products and convolutions, fp32 master weights{}\n",
                   to_string(opts.passes.amp.type),
                   train::scales_loss(opts) ? ", dynamic loss scaling" : "");
      }
      if (opts.communicator != nullptr) {
        const int ranks = opts.communicator->size();
        fmt::print("data parallel: {} ranks ({}), {} examples a rank a step, {} thread{} a rank\n",
                   ranks, opts.communicator->backend(),
                   ranks > 0 && opts.batch % ranks == 0 ? fmt::format("{}", opts.batch / ranks)
                                                        : std::string("?"),
                   opts.threads, opts.threads == 1 ? "" : "s");
      }
      std::fflush(stdout);
    }
    progress bar("epoch", "samples", tty);
    const auto examples = static_cast<std::int64_t>(train_set.size());
    const auto report = train::train(train_set, test_set, opts, [&](const train::step_progress& p) {
      if (!f->quiet && speaks) show_progress(bar, p, opts.batch, examples);
    });
    bar.finish();
    if (!speaks) return;
    if (!f->memory_report.empty()) {
      write_training_report(opts.memory_log, report_file, f->memory_report,
                            fmt::format("loom train --model {} ({} epochs, batch {})", opts.model,
                                        opts.epochs, opts.batch));
    }
    if (report.resumed_epoch > 0) fmt::print("resumed after epoch {}\n", report.resumed_epoch);
    if (report.epochs.empty()) {
      fmt::print(stderr,
                 "loom train: nothing to train: the checkpoint is after epoch {} and --epochs "
                 "is {}\n",
                 report.resumed_epoch, opts.epochs);
    }
    // A figure that was not measured (no step counted, no test batch) shows as "-".
    const auto percent = [](double v) {
      return std::isfinite(v) ? fmt::format("{:6.2f}%", 100 * v) : std::string("     -");
    };
    for (const auto& e : report.epochs) {
      fmt::print("epoch {:>3}: loss {}  train acc {}  test acc {}  {:.0f} samples/s{}\n", e.epoch,
                 std::isfinite(e.loss) ? fmt::format("{:.4f}", e.loss) : std::string("     -"),
                 percent(e.train_accuracy), percent(e.test_accuracy), e.samples_per_second,
                 e.skipped_steps > 0 ? fmt::format("  ({} steps skipped)", e.skipped_steps)
                                     : std::string());
    }
    fmt::print("\nsummary\n");
    fmt::print("  model              {} ({} parameters)\n", report.model_summary,
               report.parameters);
    if (std::isfinite(report.test_accuracy)) {
      fmt::print("  test accuracy      {:.2f}%\n", 100 * report.test_accuracy);
    } else {
      fmt::print("  test accuracy      - ({})\n",
                 report.epochs.empty() ? "no epoch ran" : "no test batch");
    }
    fmt::print("  throughput         {:.0f} samples/s ({} steps in {:.2f} s)\n",
               report.samples_per_second, report.steps, report.train_seconds);
    fmt::print(
        "  optimizer steps    {:.3f} s ({:.1f}% of training, estimated from traced steps)\n",
        report.optimizer_seconds,
        report.train_seconds > 0 ? 100 * report.optimizer_seconds / report.train_seconds : 0.0);
    if (opts.skip_nonfinite_steps) {
      fmt::print("  skipped steps      {} (non-finite loss or gradients)\n", report.skipped_steps);
    }
    if (opts.passes.amp.enabled()) {
      const passes::amp_summary amp = passes::summarize_amp(report.passes);
      fmt::print("  mixed precision    {} nodes in {}{}\n", amp.lowered, to_string(opts.passes.amp.type),
                 amp.lowered == 0 && !amp.kept_reason.empty() ? fmt::format(" ({})", amp.kept_reason)
                                                              : std::string());
      if (report.loss_scale > 0) {
        fmt::print("  loss scale         {:g} after the last step ({} steps skipped for overflow)\n",
                   report.loss_scale, report.skipped_steps);
      }
    }
    if (report.ranks > 1) {
      const auto share = [&](double v) {
        return report.train_seconds > 0 ? 100 * v / report.train_seconds : 0.0;
      };
      fmt::print("  data parallel      {} ranks, {} gradient bucket{} of at most {}, overlap {}\n",
                 report.ranks, report.buckets, report.buckets == 1 ? "" : "s",
                 format_bytes(opts.bucket_bytes), opts.overlap ? "on" : "off");
      fmt::print("  compute            {:.3f} s ({:.1f}% of training)\n", report.compute_seconds,
                 share(report.compute_seconds));
      fmt::print(
          "  communication      {:.3f} s ({:.1f}% of training; {:.3f} s of it hidden by "
          "overlap, {:.0f}%)\n",
          report.communication_seconds, share(report.communication_seconds),
          report.overlapped_seconds,
          report.communication_seconds > 0
              ? 100 * report.overlapped_seconds / report.communication_seconds
              : 0.0);
    }
    fmt::print("  peak memory        {}\n", format_bytes(report.peak_bytes));
    fmt::print("  fragmentation      {:.3f}\n", report.fragmentation);
    if (!opts.checkpoint_dir.empty()) {
      fmt::print("  checkpoint         {}\n",
                 (opts.checkpoint_dir / "checkpoint.safetensors").string());
    }
    if (!opts.trace_path.empty()) {
      fmt::print("  trace              {}\n", report.trace_written
                                                  ? opts.trace_path.string()
                                                  : std::string("none written (no step ran)"));
    }
    if (!report.profile.empty()) print_profile(report);
    if (f->explain_fusion) {
      fmt::print("\ngraph passes (training step)\n");
      for (const auto& r : report.passes) fmt::print("  {}\n", passes::to_string(r));
    }
  }));
}

}  // namespace loom::tools
