#include "loom/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "loom/checkpoint/checkpoint.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/run_metadata.hpp"
#include "loom/runtime/session.hpp"
#include "random_bits.hpp"

namespace loom::train {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// PyTorch's default initialisation of Linear and Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// for weights and biases.
class initializer {
 public:
  explicit initializer(std::uint64_t seed) : rng_(seed) {}
  tensor uniform(const shape& s, std::int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    std::vector<float> v(static_cast<std::size_t>(s.num_elements()));
    for (auto& x : v) {
      x = static_cast<float>((2 * unit_uniform(rng_) - 1) * bound);
    }
    return memory::host_tensor<float>(s, v);
  }

 private:
  std::mt19937_64 rng_;
};

// The model's graph: parameters, logits and the names the trainer feeds and fetches.
struct model_graph {
  std::vector<output> params;
  output logits;
  std::string summary;
  std::int64_t parameters = 0;
};

// Layer i asks for device i mod devices.
std::string device_for(int layer, int devices) {
  return devices <= 1 ? std::string() : fmt::format("/device:CPU:{}", layer % devices);
}

model_graph build_mlp(graph_builder& b, output x, const dataset& d, const train_options& o,
                      initializer& init) {
  model_graph m;
  output h = x;
  std::int64_t in = d.num_features;
  std::vector<std::int64_t> sizes = o.hidden;
  sizes.push_back(d.num_classes);
  std::string dims = std::to_string(in);
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto scope = b.with_device(device_for(static_cast<int>(l), o.devices));
    const std::int64_t out = sizes[l];
    const output w = ops::variable(b, fmt::format("fc{}/w", l + 1), init.uniform({in, out}, in));
    const output bias = ops::variable(b, fmt::format("fc{}/b", l + 1), init.uniform({out}, in));
    m.params.push_back(w);
    m.params.push_back(bias);
    h = ops::bias_add(ops::matmul(h, w), bias);
    if (l + 1 < sizes.size()) h = ops::relu(h);
    m.parameters += in * out + out;
    in = out;
    dims += fmt::format("-{}", out);
  }
  m.logits = h;
  m.summary = "mlp " + dims;
  return m;
}

model_graph build_cnn(graph_builder& b, output x, const dataset& d, const train_options& o,
                      initializer& init) {
  if (d.example_shape != shape{1, 28, 28}) {
    throw invalid_argument(
        fmt::format("the cnn model takes 1x28x28 images; dataset '{}' has examples of shape {}",
                    d.name, to_string(d.example_shape)));
  }
  model_graph m;
  const std::int64_t batch = o.batch;
  output h = ops::reshape(x, {batch, 1, 28, 28});
  std::int64_t channels = 1;
  int layer = 0;
  for (const std::int64_t filters : {32, 64}) {
    const auto scope = b.with_device(device_for(layer, o.devices));
    const std::int64_t fan_in = channels * 9;
    const output w = ops::variable(b, fmt::format("conv{}/w", layer + 1),
                                   init.uniform({filters, channels, 3, 3}, fan_in));
    const output bias =
        ops::variable(b, fmt::format("conv{}/b", layer + 1), init.uniform({filters}, fan_in));
    m.params.push_back(w);
    m.params.push_back(bias);
    ops::conv2d_options conv;
    conv.padding = {1, 1, 1, 1};
    h = ops::relu(ops::bias_add(ops::conv2d(h, w, conv), bias, "NCHW"));
    ops::pool_options pool;
    pool.kernel = {2, 2};
    h = ops::max_pool2d(h, pool);
    m.parameters += filters * fan_in + filters;
    channels = filters;
    ++layer;
  }
  const std::int64_t flat = channels * 7 * 7;
  const auto scope = b.with_device(device_for(layer, o.devices));
  h = ops::reshape(h, {batch, flat});
  const output w = ops::variable(b, "fc/w", init.uniform({flat, d.num_classes}, flat));
  const output bias = ops::variable(b, "fc/b", init.uniform({d.num_classes}, flat));
  m.params.push_back(w);
  m.params.push_back(bias);
  m.logits = ops::bias_add(ops::matmul(h, w), bias);
  m.parameters += flat * d.num_classes + d.num_classes;
  m.summary = fmt::format("cnn conv3x3x32-pool-conv3x3x64-pool-fc{}", d.num_classes);
  return m;
}

// Names of what one step feeds, fetches and runs.
struct step_graph {
  std::string loss;
  std::string accuracy;
  std::string found_inf;  // the fused update's (empty for per-tensor updates)
  std::vector<std::string> update_targets;
  model_graph model;  // its outputs name the builder's graph: valid while it is being built
  std::vector<std::pair<std::string, shape>> params;  // the parameters' names and shapes
};

step_graph build_training_graph(graph& g, const dataset& d, const train_options& o) {
  graph_builder b(g);
  initializer init(o.seed);
  const output x = ops::placeholder(b, "x", dtype::f32, {o.batch, d.num_features});
  const output labels = ops::placeholder(b, "labels", dtype::i32, {o.batch});
  step_graph s;
  if (o.model == "mlp") {
    s.model = build_mlp(b, x, d, o, init);
  } else if (o.model == "cnn") {
    s.model = build_cnn(b, x, d, o, init);
  } else {
    throw invalid_argument(fmt::format("unknown model '{}' (mlp or cnn)", o.model));
  }
  const auto xent = ops::softmax_cross_entropy(s.model.logits, labels);
  const output loss = ops::reduce_mean(xent.loss, {}, false, {.name = "loss"});
  const output correct =
      ops::cast(ops::equal(ops::argmax(s.model.logits, -1, dtype::i32), labels), dtype::f32);
  const output accuracy = ops::reduce_mean(correct, {}, false, {.name = "accuracy"});
  s.loss = loss.name();
  s.accuracy = accuracy.name();

  for (const output& p : s.model.params) s.params.emplace_back(p.name(), *p.type().shape);
  const std::vector<output> grads = gradients(loss, s.model.params);
  const output step_var = ops::variable(
      b, "train/step", memory::host_tensor<std::int64_t>({}, std::vector<std::int64_t>{0}));
  const output step =
      ops::assign_add(step_var, ops::scalar(b, 1.0, dtype::i64), {.name = "train/next_step"});
  const output lr = ops::scalar(b, o.lr, dtype::f32);
  const output one = ops::scalar(b, 1.0, dtype::f32);
  ops::adam_options adam;
  ops::sgd_options sgd;
  sgd.momentum = 0.9;
  if (o.optimizer != "adam" && o.optimizer != "adamw" && o.optimizer != "sgd") {
    throw invalid_argument(fmt::format("unknown optimizer '{}' (adam, adamw or sgd)", o.optimizer));
  }
  if (o.fused) {
    ops::fused_update u;
    if (o.optimizer == "adam") {
      u = ops::fused_adam(s.model.params, grads, lr, step, one, adam, {},
                          {.name = "train/fused_adam"});
    } else if (o.optimizer == "adamw") {
      u = ops::fused_adamw(s.model.params, grads, lr, step, one, adam, {},
                           {.name = "train/fused_adamw"});
    } else {
      u = ops::fused_sgd(s.model.params, grads, lr, one, sgd, {}, {.name = "train/fused_sgd"});
    }
    s.update_targets.push_back(u.name);
    s.found_inf = u.found_inf.name();
  } else {
    for (std::size_t k = 0; k < s.model.params.size(); ++k) {
      const auto scope = b.with_device(s.model.params[k].producer().requested_device);
      const std::string name = fmt::format("train/{}_{}", o.optimizer, k);
      std::string n;
      if (o.optimizer == "adam") {
        n = ops::apply_adam(s.model.params[k], grads[k], lr, step, adam, {.name = name});
      } else if (o.optimizer == "adamw") {
        n = ops::apply_adamw(s.model.params[k], grads[k], lr, step, adam, {.name = name});
      } else {
        n = ops::apply_sgd(s.model.params[k], grads[k], lr, sgd, {.name = name});
      }
      s.update_targets.push_back(n);
    }
  }
  // The step counter advances every step (SGD does not read it).
  s.update_targets.push_back(step.name());
  return s;
}

// Copies examples order[first .. first + batch) into the x and labels feeds.
void fill_batch(const dataset& d, const std::vector<std::int64_t>& order, std::int64_t first,
                std::int64_t batch, tensor& x, tensor& labels) {
  float* xf = x.data<float>();
  std::int32_t* lf = labels.data<std::int32_t>();
  for (std::int64_t k = 0; k < batch; ++k) {
    const std::int64_t i = order[static_cast<std::size_t>(first + k)];
    std::copy_n(d.features.data() + i * d.num_features, d.num_features, xf + k * d.num_features);
    lf[k] = d.labels[static_cast<std::size_t>(i)];
  }
}

// The optimizer state that the update kernels create for each parameter (Note [optimizer
// state] in src/kernel/common/optimizer_state.hpp): what a checkpoint of this model may hold
// besides its variables.
std::map<std::string, checkpoint::tensor_spec> optimizer_state(const step_graph& sg,
                                                               const train_options& o) {
  std::map<std::string, checkpoint::tensor_spec> out;
  for (const auto& [name, dims] : sg.params) {
    const checkpoint::tensor_spec spec{dtype::f32, dims};
    if (o.optimizer == "sgd") {
      out.emplace(name + "/momentum", spec);  // momentum 0.9
    } else {
      out.emplace(name + "/adam_m", spec);
      out.emplace(name + "/adam_v", spec);
    }
  }
  return out;
}

// The resume metadata of a checkpoint written by train(): its epoch and step.
struct resume_point {
  int epoch = 0;
  std::int64_t step = 0;
};

// Checks a checkpoint's metadata before its tensors are read: an epoch (and a step, when it
// has one) that parse as non-negative integers, and the model and optimizer of this run.
resume_point read_resume_point(const std::map<std::string, std::string>& meta,
                               const std::filesystem::path& path, const step_graph& sg,
                               const train_options& o) {
  resume_point r;
  const auto epoch = meta.find("epoch");
  if (epoch == meta.end()) {
    throw parse_error(fmt::format("checkpoint '{}' has no \"epoch\" in its metadata: it was not "
                                  "written by loom train",
                                  path.string()),
                      0);
  }
  const auto e = parse_number<std::uint32_t>(
      epoch->second, fmt::format("the epoch in checkpoint '{}'", path.string()));
  if (e > static_cast<std::uint32_t>(std::numeric_limits<int>::max())) {
    throw parse_error(fmt::format("the epoch in checkpoint '{}': {} is out of range", path.string(),
                                  epoch->second),
                      0);
  }
  r.epoch = static_cast<int>(e);
  if (const auto step = meta.find("step"); step != meta.end()) {
    const auto v = parse_number<std::uint64_t>(
        step->second, fmt::format("the step in checkpoint '{}'", path.string()));
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw parse_error(fmt::format("the step in checkpoint '{}': {} is out of range",
                                    path.string(), step->second),
                        0);
    }
    r.step = static_cast<std::int64_t>(v);
  }
  if (const auto it = meta.find("optimizer"); it != meta.end() && it->second != o.optimizer) {
    throw invalid_argument(fmt::format(
        "checkpoint '{}' was written by a run with the {} optimizer; this run uses {} (its "
        "state would not fit)",
        path.string(), it->second, o.optimizer));
  }
  if (const auto it = meta.find("model"); it != meta.end() && it->second != sg.model.summary) {
    throw invalid_argument(fmt::format("checkpoint '{}' holds the model {}; this run builds {}",
                                       path.string(), it->second, sg.model.summary));
  }
  return r;
}

// A step that did not go well: the message of the error that stops training.
std::string nonfinite_step(int epoch, std::int64_t step, std::int64_t steps, double loss,
                           bool found_inf, const train_options& o) {
  std::string what =
      std::isfinite(loss)
          ? fmt::format("the gradients hold NaN or Inf (the loss is {:.6g})", loss)
          : fmt::format("the loss is {}", std::isnan(loss) ? "nan" : (loss > 0 ? "inf" : "-inf"));
  return fmt::format(
      "epoch {}, step {} of {} (examples {} to {} of the epoch's shuffled order): {}; {}; "
      "training stopped (lower the learning rate, check the data, or skip such steps: "
      "train_options::skip_nonfinite_steps, loom train --skip-nonfinite-steps)",
      epoch, step, steps, (step - 1) * o.batch, step * o.batch - 1, what,
      found_inf ? "the fused update skipped the step"
                : (o.fused ? "the update ran" : "the per-tensor updates ran"));
}

void check_options(const dataset& train_set, const dataset& test_set, const train_options& o) {
  if (o.batch < 1) throw invalid_argument(fmt::format("batch {} must be >= 1", o.batch));
  if (o.epochs < 0) throw invalid_argument(fmt::format("epochs {} must be >= 0", o.epochs));
  if (!(std::isfinite(o.lr) && o.lr > 0)) {
    throw invalid_argument(fmt::format("the learning rate {} must be a finite number > 0", o.lr));
  }
  if (o.threads < 0) throw invalid_argument(fmt::format("threads {} must be >= 0", o.threads));
  if (o.max_steps_per_epoch < 0) {
    throw invalid_argument(
        fmt::format("max_steps_per_epoch {} must be >= 0", o.max_steps_per_epoch));
  }
  for (const std::int64_t h : o.hidden) {
    if (h < 1) throw invalid_argument(fmt::format("a hidden layer of {} units; at least 1", h));
  }
  if (train_set.size() < o.batch) {
    throw invalid_argument(fmt::format("the training set has {} examples, fewer than a batch of {}",
                                       train_set.size(), o.batch));
  }
  if (o.devices < 1) throw invalid_argument(fmt::format("devices {} must be >= 1", o.devices));
  if (o.resume && o.checkpoint_dir.empty()) {
    throw invalid_argument("resuming needs a checkpoint directory");
  }
  if (o.skip_nonfinite_steps && !o.fused) {
    throw invalid_argument(
        "skipping steps with a non-finite loss needs the fused update (per-tensor updates "
        "cannot undo a step)");
  }
  check_dataset(train_set, o.allow_nonfinite);
  if (test_set.size() > 0) {
    if (test_set.num_features != train_set.num_features) {
      throw invalid_argument(
          fmt::format("the test set has {} features an example, the training set {}",
                      test_set.num_features, train_set.num_features));
    }
    if (test_set.num_classes > train_set.num_classes) {
      throw invalid_argument(fmt::format("the test set has {} classes, the training set {}",
                                         test_set.num_classes, train_set.num_classes));
    }
    check_dataset(test_set, o.allow_nonfinite);
  }
}

}  // namespace

std::filesystem::path checkpoint_file(const train_options& options) {
  return options.checkpoint_dir / "checkpoint.safetensors";
}

train_report train(const dataset& train_set, const dataset& test_set, const train_options& o,
                   const std::function<void(const step_progress&)>& progress) {
  check_options(train_set, test_set, o);
  // Where results go, before any work: a directory or file that cannot be written fails now.
  if (!o.checkpoint_dir.empty()) create_output_directory(o.checkpoint_dir, "checkpoint directory");
  if (!o.trace_path.empty()) check_output_file(o.trace_path, "trace file");
  graph g;
  step_graph sg = build_training_graph(g, train_set, o);
  train_report report;
  report.model_summary = sg.model.summary;
  report.parameters = sg.model.parameters;

  session_options so;
  so.devices.virtual_cpu_devices = o.devices;
  so.devices.cpu_threads = o.threads;
  so.devices.cpu_memory_log = o.memory_log;
  so.passes = o.passes;
  session s(std::move(g), so);
  std::vector<std::string> fetches{sg.loss, sg.accuracy};
  if (!sg.found_inf.empty()) fetches.push_back(sg.found_inf);
  report.passes = s.explain_passes({"x", "labels"}, fetches, sg.update_targets);

  const std::filesystem::path ckpt = checkpoint_file(o);
  int first_epoch = 1;
  std::int64_t global_step = 0;  // steps of every run so far, written to the checkpoint
  if (o.resume) {
    // Temporary files of a save that was killed: never part of a checkpoint.
    (void)checkpoint::remove_stale_temporaries(ckpt);
    std::error_code ec;
    const bool present = std::filesystem::exists(ckpt, ec);
    if (!present && o.require_checkpoint) {
      throw not_found(fmt::format("nothing to resume from in '{}': no {}{}",
                                  o.checkpoint_dir.string(), ckpt.filename().string(),
                                  ec ? fmt::format(" ({})", ec.message()) : std::string()));
    }
    if (present) {
      checkpoint::restore_options ro;
      ro.allow_unknown = false;
      ro.expected_state = optimizer_state(sg, o);
      ro.refuse_nonfinite = !o.allow_nonfinite;
      resume_point from;
      ro.check_metadata = [&](const std::map<std::string, std::string>& meta) {
        from = read_resume_point(meta, ckpt, sg, o);
      };
      (void)checkpoint::restore_checkpoint(s, ckpt, ro);
      report.resumed_epoch = from.epoch;
      global_step = from.step;
      first_epoch = report.resumed_epoch + 1;
    }
  }

  tensor x = memory::host_tensor(dtype::f32, {o.batch, train_set.num_features});
  tensor labels = memory::host_tensor(dtype::i32, {o.batch});
  const std::int64_t full_steps = train_set.size() / o.batch;
  const std::int64_t steps =
      o.max_steps_per_epoch > 0 ? std::min(full_steps, o.max_steps_per_epoch) : full_steps;
  // The step whose trace is written: the fifth, or the last when the run has fewer.
  const std::int64_t planned_steps =
      steps * std::max<std::int64_t>(0, std::int64_t{o.epochs} - first_epoch + 1);
  const std::int64_t trace_step =
      o.trace_path.empty() ? 0 : std::min<std::int64_t>(5, planned_steps);
  double traced_optimizer_ns = 0;
  std::int64_t traced_steps = 0;
  std::map<std::string, node_time> profile;  // sums until the end

  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    // Each epoch's order depends on (seed, epoch) only, so a resumed run sees the batches
    // an uninterrupted one would.
    std::mt19937_64 shuffle_rng(o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    const std::vector<std::int64_t> order =
        shuffled_indices(static_cast<std::size_t>(train_set.size()), shuffle_rng);
    epoch_report er;
    er.epoch = epoch;
    const auto t0 = clock_type::now();
    double loss_sum = 0;
    double acc_sum = 0;
    for (std::int64_t step = 0; step < steps; ++step) {
      fill_batch(train_set, order, step * o.batch, o.batch, x, labels);
      const bool trace_this = o.profile || (o.sample_optimizer_time && step % 10 == 0) ||
                              report.steps + 1 == trace_step;
      run_metadata meta;
      run_options ro;
      ro.trace = trace_this;
      const auto out = s.run({{"x", x}, {"labels", labels}}, fetches, sg.update_targets,
                             trace_this ? &meta : nullptr, ro);
      // On a GPU the fetched scalars stay there: read them through host copies.
      const double loss = s.host_value(out[0]).data<float>()[0];
      const double acc = s.host_value(out[1]).data<float>()[0];
      const bool found_inf = out.size() > 2 && s.host_value(out[2]).data<bool>()[0];
      ++report.steps;
      ++global_step;
      const bool skipped = !std::isfinite(loss) || found_inf;
      if (skipped) {
        if (!o.skip_nonfinite_steps) {
          throw error(nonfinite_step(epoch, step + 1, steps, loss, found_inf, o));
        }
        ++er.skipped_steps;
        ++report.skipped_steps;
      } else {
        loss_sum += loss;
        acc_sum += acc;
      }
      if (trace_this) {
        for (const auto& n : meta.nodes) {
          // By op, not name: optimizer_fusion may have merged the per-tensor updates.
          if (n.op.starts_with("apply_") || n.op.starts_with("fused_sgd") ||
              n.op.starts_with("fused_adam")) {
            traced_optimizer_ns += static_cast<double>(n.duration_ns);
          }
        }
        if (o.profile) {
          for (const auto& n : meta.nodes) {
            auto [it, fresh] = profile.try_emplace(n.node);
            if (fresh) {
              it->second.node = n.node;
              it->second.op = n.op;
              it->second.device = n.device;
            }
            it->second.seconds_per_step += static_cast<double>(n.duration_ns) * 1e-9;
          }
        }
        ++traced_steps;
        if (report.steps == trace_step) {
          meta.write_chrome_trace(o.trace_path.string());
          report.trace_written = true;
        }
      }
      if (progress) {
        const auto counted = static_cast<double>(step + 1 - er.skipped_steps);
        step_progress p;
        p.epoch = epoch;
        p.epochs = o.epochs;
        p.step = step + 1;
        p.steps = steps;
        p.loss = loss;
        p.accuracy = counted > 0 ? acc_sum / counted : 0.0;
        p.samples_per_second = static_cast<double>((step + 1) * o.batch) / seconds_since(t0);
        progress(p);
      }
    }
    er.seconds = seconds_since(t0);
    const std::int64_t counted = steps - er.skipped_steps;
    const double no_steps = counted == steps ? 0.0 : std::numeric_limits<double>::quiet_NaN();
    er.loss = counted > 0 ? loss_sum / static_cast<double>(counted) : no_steps;
    er.train_accuracy = counted > 0 ? acc_sum / static_cast<double>(counted) : no_steps;
    er.samples_per_second = static_cast<double>(steps * o.batch) / er.seconds;
    report.train_seconds += er.seconds;
    er.test_accuracy = std::numeric_limits<double>::quiet_NaN();
    if (o.evaluate && test_set.size() >= o.batch) {
      std::vector<std::int64_t> test_order(static_cast<std::size_t>(test_set.size()));
      std::iota(test_order.begin(), test_order.end(), 0);
      double correct = 0;
      const std::int64_t test_steps = test_set.size() / o.batch;
      for (std::int64_t t = 0; t < test_steps; ++t) {
        fill_batch(test_set, test_order, t * o.batch, o.batch, x, labels);
        correct +=
            s.host_value(s.run({{"x", x}, {"labels", labels}}, {sg.accuracy})[0]).data<float>()[0];
      }
      er.test_accuracy = correct / static_cast<double>(test_steps);
    }
    report.epochs.push_back(er);
    if (!o.checkpoint_dir.empty()) {
      checkpoint::save_checkpoint(s, ckpt,
                                  {{"format", "loom train"},
                                   {"epoch", std::to_string(epoch)},
                                   {"step", std::to_string(global_step)},
                                   {"model", sg.model.summary},
                                   {"optimizer", o.optimizer}});
    }
  }
  report.test_accuracy = report.epochs.empty() ? std::numeric_limits<double>::quiet_NaN()
                                               : report.epochs.back().test_accuracy;
  const std::int64_t trained = report.steps * o.batch;
  report.samples_per_second =
      report.train_seconds > 0 ? static_cast<double>(trained) / report.train_seconds : 0.0;
  if (traced_steps > 0) {
    report.optimizer_seconds = traced_optimizer_ns * 1e-9 / static_cast<double>(traced_steps) *
                               static_cast<double>(report.steps);
  }
  for (auto& [name, n] : profile) {
    n.seconds_per_step /= static_cast<double>(traced_steps);
    report.profile.push_back(std::move(n));
  }
  std::ranges::sort(report.profile, std::ranges::greater{}, &node_time::seconds_per_step);
  for (const auto& dev : s.devices()) {
    if (const auto st = dev->allocator().stats()) {
      report.peak_bytes += st->peak_bytes_in_use;
      report.fragmentation = std::max(report.fragmentation, st->fragmentation());
    }
  }
  return report;
}

}  // namespace loom::train
