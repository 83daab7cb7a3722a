// The trainer behind `loom train` and `loom bench train`: builds a classifier (an MLP or a
// small CNN) as a loom graph, its gradients (gradients()) and an optimizer step (fused
// multi-tensor or per-tensor), and runs it through a session batch by batch.
//
// One training step is one session.run: feeds x [B, F] and labels [B], fetches the loss and
// the batch accuracy, and runs the update as a target. Batches have a fixed size (the graph's
// shapes are static); the last partial batch of an epoch is skipped, as drop_last does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/passes/pass.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/loss_scaler.hpp"

namespace loom::distributed {
class communicator;
}

namespace loom::train {

struct train_options {
  /// "mlp" or "cnn" (conv 3×3 32, relu, max-pool, conv 3×3 64, relu, max-pool, fc; images
  /// of 1×28×28 only; with batch_norm a batch norm after each convolution).
  std::string model = "mlp";
  /// The MLP's hidden layer sizes.
  std::vector<std::int64_t> hidden = {512, 512};
  /// Batch normalisation (batch_norm_train) after each convolution of the CNN, or each
  /// hidden layer of the MLP, in place of its bias (docs/training.md, "Batch
  /// normalisation"); evaluation uses the running statistics.
  bool batch_norm = false;
  /// With batch_norm and a communicator of several ranks: the batch norms take their
  /// statistics over the global batch (sync_batch_norm, as PyTorch's SyncBatchNorm), every
  /// rank's running statistics alike. Without it each rank normalises by its own block of
  /// the batch, and evaluation and checkpoints use rank 0's running statistics (broadcast
  /// before each evaluation, as DDP broadcasts buffers).
  bool sync_batch_norm = false;
  int epochs = 3;
  /// The batch of one step. With data parallelism, the global batch: each of the N ranks
  /// trains on batch / N examples of it (N must divide it).
  std::int64_t batch = 128;
  double lr = 1e-3;
  /// "adam", "adamw" or "sgd" (momentum 0.9).
  std::string optimizer = "adam";
  /// One fused multi-tensor update for all parameters, or one update node per parameter.
  bool fused = true;
  /// Virtual CPU devices; layer i runs on device i mod devices.
  int devices = 1;
  /// CPU threads in all, shared among the devices (0: the machine's cores).
  int threads = 0;
  std::uint64_t seed = 1;
  /// When set, a Chrome trace of one training step (the fifth) is written here.
  std::filesystem::path trace_path;
  /// When set, cpu:0's allocations are logged here (device_options::cpu_memory_log).
  std::filesystem::path memory_log;
  /// When set, the variables and optimizer state are saved here after every epoch
  /// (checkpoint.safetensors, written atomically). The directory is made (and checked to
  /// be writable) before any training work.
  std::filesystem::path checkpoint_dir;
  /// Continue from checkpoint_dir's checkpoint (its epoch count and state); with none there,
  /// start from scratch (train_report::resumed_epoch stays 0).
  bool resume = false;
  /// With resume: no checkpoint to resume from is an error (loom::not_found).
  bool require_checkpoint = false;
  /// Train on features, and resume from values, that hold NaN or Inf (refused by default,
  /// naming the row or the tensor).
  bool allow_nonfinite = false;
  /// A step whose loss is NaN or Inf, or whose gradients are (the fused update's found_inf),
  /// stops training with an error naming the epoch, the step and the loss. true: such steps
  /// are skipped instead (the fused update leaves every variable as it was; Adam's step
  /// counter still advances) and counted (train_report::skipped_steps). Needs `fused`.
  bool skip_nonfinite_steps = false;
  /// Stop each epoch after this many steps (0: the whole epoch); benchmarks use it.
  std::int64_t max_steps_per_epoch = 0;
  /// Skip the test-set evaluation (benchmarks).
  bool evaluate = true;
  /// Trace every 10th step to estimate the optimizer's share of the time (a few µs per
  /// traced step); benchmarks turn it off.
  bool sample_optimizer_time = true;
  /// Trace every step and report each node's mean time per step (train_report::profile).
  bool profile = false;
  /// The graph passes the training step's plan runs (all by default). passes.amp turns on
  /// automatic mixed precision (bfloat16 or float16 products and convolutions, float32
  /// master weights: docs/training.md, "Mixed precision").
  passes::pass_options passes;
  /// Dynamic loss scaling (loss_scaler): nullopt scales the loss exactly when passes.amp is
  /// float16. Needs the fused update, whose found_inf skips an overflowing step; such steps
  /// are counted (train_report::skipped_steps), not errors, until
  /// loss_scale.max_consecutive_skips in a row.
  std::optional<bool> scale_loss;
  loss_scale_options loss_scale;

  /// Data parallelism (docs/distributed.md, "Data-parallel training"): the ranks of this
  /// communicator, each a process with the same options and data, train one model. Rank
  /// 0's initial parameters are broadcast to all; each step, rank r trains on its block of
  /// the global batch, the gradients are averaged over the ranks (all_reduce in buckets,
  /// each started as soon as its gradients are ready), and every rank applies the same
  /// update. Only rank 0 writes checkpoints; every rank reads the one it resumes from (the
  /// directory must be visible to all, and any number of ranks may resume it). nullptr, or
  /// a communicator of one rank: one process.
  std::shared_ptr<distributed::communicator> communicator;
  /// Gradients are all-reduced in buckets of about this many bytes (PyTorch DDP's 25 MiB);
  /// the first bucket (the last layers' gradients, ready first) holds at most 1 MiB, so
  /// communication starts early, as DDP's does.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Start each bucket's all_reduce as soon as its gradients are ready, overlapping the
  /// rest of the backward pass; false: only once every gradient is computed.
  bool overlap = true;
};

/// One step's figures, for progress display.
struct step_progress {
  int epoch = 0;  // 1-based
  int epochs = 0;
  std::int64_t step = 0;  // 1-based within the epoch
  std::int64_t steps = 0;
  double loss = 0;
  double accuracy = 0;            // running mean over the epoch so far
  double samples_per_second = 0;  // over the epoch so far
};

struct epoch_report {
  int epoch = 0;
  double loss = 0;                 // mean over the epoch's steps that were not skipped
  double train_accuracy = 0;       // mean over the epoch's steps that were not skipped
  std::int64_t skipped_steps = 0;  // steps skipped for a non-finite loss or gradient
  double test_accuracy = 0;        // after the epoch (NaN when not evaluated)
  double seconds = 0;
  double samples_per_second = 0;
};

/// One node's share of a training step (train_options::profile).
struct node_time {
  std::string node;
  std::string op;
  std::string device;
  double seconds_per_step = 0;  // mean over the traced steps
};

struct train_report {
  std::vector<epoch_report> epochs;
  std::string model_summary;
  std::int64_t parameters = 0;
  /// Steps run, skipped ones included.
  std::int64_t steps = 0;
  /// Steps skipped for a non-finite loss or gradient (train_options::skip_nonfinite_steps),
  /// or for gradients that overflowed the loss scale.
  std::int64_t skipped_steps = 0;
  /// With loss scaling: the scale after the last step (0 without).
  double loss_scale = 0;
  /// The last epoch's test accuracy (NaN when no epoch ran or none was evaluated).
  double test_accuracy = 0;
  /// Training samples per second over all epochs (steps only, not evaluation).
  double samples_per_second = 0;
  double train_seconds = 0;
  /// Time in the optimizer's update nodes, estimated from traced steps (every 10th step).
  double optimizer_seconds = 0;
  /// The largest bytes in use at once on the devices, summed, and the worst fragmentation
  /// seen at the end.
  std::size_t peak_bytes = 0;
  double fragmentation = 0;
  /// The epoch the run resumed after (0 when it started fresh).
  int resumed_epoch = 0;
  /// Whether train_options::trace_path was written (a run of no steps writes none).
  bool trace_written = false;
  /// With train_options::profile: every node's mean time per step, slowest first. Nodes on
  /// different threads overlap, so the times can sum to more than a step.
  std::vector<node_time> profile;
  /// What the graph passes rewrote and refused in the training step's plan.
  std::vector<passes::pass_record> passes;

  /// Data parallelism: the number of ranks (1 for one process), the gradient buckets, and
  /// where a step's time went, estimated from traced steps (every 10th, or every step with
  /// train_options::profile) and scaled to all steps: time with a gradient collective in
  /// flight (communication, waiting for the other ranks included), time with other work
  /// running (compute), and the part of the communication that compute ran beside (hidden
  /// by overlap). Exposed communication is communication_seconds - overlapped_seconds.
  int ranks = 1;
  std::size_t buckets = 0;
  double compute_seconds = 0;
  double communication_seconds = 0;
  double overlapped_seconds = 0;
};

/// Whether train() scales the loss for these options (train_options::scale_loss).
[[nodiscard]] bool scales_loss(const train_options& options) noexcept;

/// Where train() keeps its checkpoint: checkpoint_dir / "checkpoint.safetensors".
[[nodiscard]] std::filesystem::path checkpoint_file(const train_options& options);

/// Trains on `train_set`, evaluates on `test_set` after every epoch. Before any work, throws
/// loom::invalid_argument for options that do not fit (an unknown model or optimizer, a
/// learning rate that is not finite and > 0, a CNN on non-image data, a batch larger than
/// the dataset, skip_nonfinite_steps without the fused update, ...) and for datasets that
/// do not (check_dataset: a label outside the classes, a NaN or Inf feature unless
/// allow_nonfinite), and as create_output_directory / check_output_file for a checkpoint
/// directory or trace file that cannot be written. Resuming throws loom::not_found when
/// require_checkpoint and there is no checkpoint; as restore_checkpoint for one that does not
/// fit the model (naming the tensor, both shapes and the file), holds a tensor the model
/// does not know, or holds NaN or Inf (unless allow_nonfinite); loom::parse_error for
/// metadata whose epoch or step is not a non-negative integer. With a communicator of
/// several ranks, throws loom::invalid_argument naming the rank for a batch that the rank
/// count does not divide and when the ranks' options, data or checkpoints disagree, and
/// loom::distributed_error (naming the rank) when a rank fails or stops answering within
/// the communicator's timeout. While training, throws
/// loom::error naming the epoch, the step and the loss when a step's loss or gradients are
/// not finite (unless skip_nonfinite_steps).
train_report train(const dataset& train_set, const dataset& test_set, const train_options& options,
                   const std::function<void(const step_progress&)>& progress = {});

}  // namespace loom::train
