#include "loom/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>

#include "loom/checkpoint/checkpoint.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/collective.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/passes/sync_batch_norm.hpp"
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
  /// The logits for evaluation: batch norms with their running statistics (logits itself
  /// for a model without batch norm).
  output eval_logits;
  /// The batch norms' running statistics (variables that are not trained).
  std::vector<std::string> running;
  std::string summary;
  std::int64_t parameters = 0;
};

// Layer i asks for device i mod devices.
std::string device_for(int layer, int devices) {
  return devices <= 1 ? std::string() : fmt::format("/device:CPU:{}", layer % devices);
}

// The forward pass twice where batch normalisation makes training and evaluation differ: the
// training path normalises with each batch's statistics (and updates the running ones), the
// evaluation path with the running statistics. Layers before the first batch norm, and every
// layer of a model without one, are built once and shared.
struct paths {
  output train;
  output eval;
  [[nodiscard]] bool shared() const { return train.ep() == eval.ep(); }
  // f applied to both paths (once while they are one).
  template <class F>
  paths then(F&& f) const {
    const output t = f(train);
    return {t, shared() ? t : f(eval)};
  }
};

// Batch normalisation over `channels` (dim 1): scale and bias are trained parameters, the
// running statistics variables of their own.
paths batch_norm_layer(graph_builder& b, const paths& h, const std::string& name,
                       std::int64_t channels, model_graph& m) {
  const auto filled = [&](double v) {
    return memory::host_tensor<float>({channels},
                                      std::vector<float>(static_cast<std::size_t>(channels),
                                                         static_cast<float>(v)));
  };
  const output scale = ops::variable(b, name + "/scale", filled(1.0));
  const output bias = ops::variable(b, name + "/bias", filled(0.0));
  const output running_mean = ops::variable(b, name + "/running_mean", filled(0.0));
  const output running_var = ops::variable(b, name + "/running_var", filled(1.0));
  m.params.push_back(scale);
  m.params.push_back(bias);
  m.running.push_back(running_mean.name());
  m.running.push_back(running_var.name());
  m.parameters += 2 * channels;
  ops::batch_norm_options bn;
  return {ops::batch_norm_train(h.train, scale, bias, running_mean, running_var, bn,
                                {.name = name})
              .y,
          ops::batch_norm(h.eval, scale, bias, running_mean, running_var, bn,
                          {.name = name + "/eval"})};
}

// After a layer `name` of `channels` outputs (dim 1) and `fan_in` inputs: a bias ("name/b",
// added as bias_add's `format` says), or with `normalized` a batch norm ("name/bn"), whose
// shift takes the bias's place (PyTorch's bias=False before a BatchNorm).
paths bias_or_batch_norm(graph_builder& b, const paths& h, const std::string& name,
                         std::int64_t channels, std::int64_t fan_in, bool normalized,
                         const char* format, initializer& init, model_graph& m) {
  if (normalized) return batch_norm_layer(b, h, name + "/bn", channels, m);
  const output bias = ops::variable(b, name + "/b", init.uniform({channels}, fan_in));
  m.params.push_back(bias);
  m.parameters += channels;
  return h.then([&](output v) { return ops::bias_add(v, bias, format); });
}

model_graph build_mlp(graph_builder& b, output x, const dataset& d, const train_options& o,
                      initializer& init) {
  model_graph m;
  paths h{x, x};
  std::int64_t in = d.num_features;
  std::vector<std::int64_t> sizes = o.hidden;
  sizes.push_back(d.num_classes);
  std::string dims = std::to_string(in);
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto scope = b.with_device(device_for(static_cast<int>(l), o.devices));
    const std::int64_t out = sizes[l];
    const bool normalized = o.batch_norm && l + 1 < sizes.size();
    const output w = ops::variable(b, fmt::format("fc{}/w", l + 1), init.uniform({in, out}, in));
    m.params.push_back(w);
    m.parameters += in * out;
    h = h.then([&](output v) { return ops::matmul(v, w); });
    h = bias_or_batch_norm(b, h, fmt::format("fc{}", l + 1), out, in, normalized, "NHWC", init, m);
    if (l + 1 < sizes.size()) h = h.then([](output v) { return ops::relu(v); });
    in = out;
    dims += fmt::format("-{}{}", out, normalized ? "bn" : "");
  }
  m.logits = h.train;
  m.eval_logits = h.eval;
  m.summary = "mlp " + dims;
  return m;
}

model_graph build_cnn(graph_builder& b, output x, std::int64_t batch, const dataset& d,
                      const train_options& o, initializer& init) {
  if (d.example_shape != shape{1, 28, 28}) {
    throw invalid_argument(
        fmt::format("the cnn model takes 1x28x28 images; dataset '{}' has examples of shape {}",
                    d.name, to_string(d.example_shape)));
  }
  model_graph m;
  const output image = ops::reshape(x, {batch, 1, 28, 28});
  paths h{image, image};
  std::int64_t channels = 1;
  int layer = 0;
  for (const std::int64_t filters : {32, 64}) {
    const auto scope = b.with_device(device_for(layer, o.devices));
    const std::int64_t fan_in = channels * 9;
    const output w = ops::variable(b, fmt::format("conv{}/w", layer + 1),
                                   init.uniform({filters, channels, 3, 3}, fan_in));
    m.params.push_back(w);
    m.parameters += filters * fan_in;
    ops::conv2d_options conv;
    conv.padding = {1, 1, 1, 1};
    h = h.then([&](output v) { return ops::conv2d(v, w, conv); });
    h = bias_or_batch_norm(b, h, fmt::format("conv{}", layer + 1), filters, fan_in, o.batch_norm,
                           "NCHW", init, m);
    ops::pool_options pool;
    pool.kernel = {2, 2};
    h = h.then([&](output v) { return ops::max_pool2d(ops::relu(v), pool); });
    channels = filters;
    ++layer;
  }
  const std::int64_t flat = channels * 7 * 7;
  const auto scope = b.with_device(device_for(layer, o.devices));
  const output w = ops::variable(b, "fc/w", init.uniform({flat, d.num_classes}, flat));
  const output bias = ops::variable(b, "fc/b", init.uniform({d.num_classes}, flat));
  m.params.push_back(w);
  m.params.push_back(bias);
  h = h.then([&](output v) { return ops::bias_add(ops::matmul(ops::reshape(v, {batch, flat}), w), bias); });
  m.logits = h.train;
  m.eval_logits = h.eval;
  m.parameters += flat * d.num_classes + d.num_classes;
  const char* bn = o.batch_norm ? "-bn" : "";
  m.summary = fmt::format("cnn conv3x3x32{}-pool-conv3x3x64{}-pool-fc{}", bn, bn, d.num_classes);
  return m;
}

// How the ranks of a data-parallel run share the work (one rank: a process alone).
struct data_parallel {
  int ranks = 1;
  int rank = 0;
  std::int64_t local_batch = 0;  // each rank's block of the global batch
  std::string group;             // the communicator's name for the collective ops
};

// Note [gradient buckets]
// Each rank's gradients are averaged over the ranks by all_reduce, in buckets as PyTorch
// DDP does: one collective per parameter would pay MPI's latency once per tensor (the
// biases are a few hundred bytes), one for all of them could start only when the backward
// pass is over. Buckets take the parameters in reverse order, the order in which the
// backward pass produces their gradients (the last layer's first); a bucket closes once it
// holds bucket_bytes (the first at 1 MiB, so the exchange starts early, as DDP's first
// bucket does). A bucket of several gradients is flattened and concatenated into one
// tensor, all-reduced, and split back; a bucket of one is all-reduced as it is. The
// collectives chain in bucket order (Note [collective order] in src/graph/graph.cpp), and
// each runs as soon as its gradients and the bucket
// before are done: on threads of its own (Note [blocking nodes] in
// src/runtime/executor.cpp), beside the backward pass of the layers below. Without
// `overlap`, the first bucket also waits for every gradient. Every rank then applies the
// same update to the same parameters with the same averaged gradients, so the ranks stay
// identical, bit for bit, without ever exchanging parameters again.
std::vector<output> average_gradients(graph_builder& b, const std::vector<output>& params,
                                      const std::vector<output>& grads, const train_options& o,
                                      const std::string& group, std::size_t& bucket_count) {
  std::vector<std::vector<std::size_t>> buckets;
  std::size_t cap = std::min<std::size_t>(o.bucket_bytes, std::size_t{1} << 20);
  std::size_t fill = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    const shape& s = *grads[k].type().shape;
    const auto bytes = static_cast<std::size_t>(s.num_elements()) * size_of(grads[k].dtype_of());
    if (buckets.empty() || (fill > 0 && fill + bytes > cap)) {
      if (!buckets.empty()) cap = o.bucket_bytes;
      buckets.emplace_back();
      fill = 0;
    }
    buckets.back().push_back(k);
    fill += bytes;
  }
  std::vector<output> averaged(grads.size());
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const auto& members = buckets[i];
    const std::string name = fmt::format("train/bucket{}", i);
    output reduced;
    if (members.size() == 1) {
      reduced = ops::all_reduce(grads[members[0]], "avg", group, {.name = name});
      averaged[members[0]] = reduced;
    } else {
      std::vector<output> flat;
      std::vector<std::int64_t> sizes;
      for (const std::size_t k : members) {
        const std::int64_t n = grads[k].type().shape->num_elements();
        flat.push_back(ops::reshape(grads[k], {n}));
        sizes.push_back(n);
      }
      reduced = ops::all_reduce(ops::concat(flat, 0, {.name = name + "/concat"}), "avg", group,
                                {.name = name});
      const std::vector<output> parts = ops::split_sizes(reduced, sizes, 0);
      for (std::size_t j = 0; j < members.size(); ++j) {
        const shape& s = *grads[members[j]].type().shape;
        averaged[members[j]] =
            ops::reshape(parts[j], std::vector<std::int64_t>(s.dims().begin(), s.dims().end()));
      }
    }
    if (i == 0 && !o.overlap) {
      for (const output& g : grads) b.g().add_control_input(reduced.ep().node, g.ep().node);
    }
  }
  bucket_count = buckets.size();
  return averaged;
}

// Names of what one step feeds, fetches and runs.
struct step_graph {
  std::string loss;
  std::string accuracy;
  std::string eval_accuracy;  // with the batch norms' running statistics
  std::vector<passes::pass_record> conversion;  // sync_batch_norm's
  std::string found_inf;  // the fused update's (empty for per-tensor updates)
  std::string loss_scale;  // the fed loss scale (empty without loss scaling)
  std::vector<std::string> update_targets;
  model_graph model;  // its outputs name the builder's graph: valid while it is being built
  std::vector<std::pair<std::string, shape>> params;  // the parameters' names and shapes
  std::size_t buckets = 0;                            // gradient buckets (data parallelism)
};

step_graph build_training_graph(graph& g, const dataset& d, const train_options& o,
                                const data_parallel& dp) {
  graph_builder b(g);
  initializer init(o.seed);
  const output x = ops::placeholder(b, "x", dtype::f32, {dp.local_batch, d.num_features});
  const output labels = ops::placeholder(b, "labels", dtype::i32, {dp.local_batch});
  step_graph s;
  if (o.model == "mlp") {
    s.model = build_mlp(b, x, d, o, init);
  } else if (o.model == "cnn") {
    s.model = build_cnn(b, x, dp.local_batch, d, o, init);
  } else {
    throw invalid_argument(fmt::format("unknown model '{}' (mlp or cnn)", o.model));
  }
  output labels_in = labels;
  if (o.batch_norm && o.sync_batch_norm && dp.ranks > 1) {
    // Before the gradients, which then sum over every rank (Note [sync batch norm conversion]).
    auto conv = passes::convert_sync_batch_norm(g, dp.group);
    const auto remap = [&](output v) {
      return output(&b, endpoint{conv.new_id[static_cast<std::size_t>(v.ep().node)], v.ep().index});
    };
    for (output& p : s.model.params) p = remap(p);
    s.model.logits = remap(s.model.logits);
    s.model.eval_logits = remap(s.model.eval_logits);
    labels_in = remap(labels);
    s.conversion = std::move(conv.records);
  }
  const auto xent = ops::softmax_cross_entropy(s.model.logits, labels_in);
  const output loss = ops::reduce_mean(xent.loss, {}, false, {.name = "loss"});
  const auto accuracy_of = [&](output logits, const std::string& name) {
    const output correct =
        ops::cast(ops::equal(ops::argmax(logits, -1, dtype::i32), labels_in), dtype::f32);
    return ops::reduce_mean(correct, {}, false, {.name = name});
  };
  s.loss = loss.name();
  s.accuracy = accuracy_of(s.model.logits, "accuracy").name();
  s.eval_accuracy = s.model.eval_logits.ep() == s.model.logits.ep()
                        ? s.accuracy
                        : accuracy_of(s.model.eval_logits, "eval/accuracy").name();

  for (const output& p : s.model.params) s.params.emplace_back(p.name(), *p.type().shape);
  // Loss scaling (loss_scaler): the gradients of loss * scale, divided by the scale in the
  // fused update (its grad_scale input), which skips the step when one is not finite.
  output scaled_loss = loss;
  output grad_scale = ops::scalar(b, 1.0, dtype::f32);
  if (scales_loss(o)) {
    const output scale = ops::placeholder(b, "amp/loss_scale", dtype::f32, {});
    scaled_loss = ops::mul(loss, scale, {.name = "amp/scaled_loss"});
    grad_scale = scale;  // the update divides the gradients by it
    s.loss_scale = scale.name();
  }
  std::vector<output> grads = gradients(scaled_loss, s.model.params);
  if (dp.ranks > 1) grads = average_gradients(b, s.model.params, grads, o, dp.group, s.buckets);
  const output step_var = ops::variable(
      b, "train/step", memory::host_tensor<std::int64_t>({}, std::vector<std::int64_t>{0}));
  // The step counter advances every step; with loss scaling, only when the update was not
  // skipped (PyTorch's GradScaler skips optimizer.step(): Adam's bias correction counts the
  // updates made, not the overflows).
  const output step =
      s.loss_scale.empty()
          ? ops::assign_add(step_var, ops::scalar(b, 1.0, dtype::i64), {.name = "train/next_step"})
          : ops::add(step_var, ops::scalar(b, 1.0, dtype::i64), {.name = "train/next_step"});
  const output lr = ops::scalar(b, o.lr, dtype::f32);
  ops::adam_options adam;
  ops::sgd_options sgd;
  sgd.momentum = 0.9;
  if (o.optimizer != "adam" && o.optimizer != "adamw" && o.optimizer != "sgd") {
    throw invalid_argument(fmt::format("unknown optimizer '{}' (adam, adamw or sgd)", o.optimizer));
  }
  std::optional<output> found_inf;
  if (o.fused) {
    ops::fused_update u;
    if (o.optimizer == "adam") {
      u = ops::fused_adam(s.model.params, grads, lr, step, grad_scale, adam, {},
                          {.name = "train/fused_adam"});
    } else if (o.optimizer == "adamw") {
      u = ops::fused_adamw(s.model.params, grads, lr, step, grad_scale, adam, {},
                           {.name = "train/fused_adamw"});
    } else {
      u = ops::fused_sgd(s.model.params, grads, lr, grad_scale, sgd, {}, {.name = "train/fused_sgd"});
    }
    s.update_targets.push_back(u.name);
    s.found_inf = u.found_inf.name();
    found_inf = u.found_inf;
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
  if (s.loss_scale.empty()) {
    s.update_targets.push_back(step.name());  // SGD does not read it: run it as a target
  } else {
    // loss scaling needs the fused update (check_options), so found_inf is there
    const output taken = ops::cast(ops::logical_not(*found_inf), dtype::i64);
    s.update_targets.push_back(ops::assign_add(step_var, taken, {.name = "train/advance_step"}).name());
  }
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
  if (o.sync_batch_norm && !o.batch_norm) {
    throw invalid_argument("sync_batch_norm synchronizes the model's batch norms: it needs batch_norm");
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    throw invalid_argument("resuming needs a checkpoint directory");
  }
  if (o.skip_nonfinite_steps && !o.fused) {
    throw invalid_argument(
        "skipping steps with a non-finite loss needs the fused update (per-tensor updates "
        "cannot undo a step)");
  }
  passes::validate(o.passes.amp);
  if (scales_loss(o)) {
    if (!o.fused) {
      throw invalid_argument(
          "loss scaling needs the fused update (per-tensor updates cannot skip a step whose "
          "gradients overflowed)");
    }
    (void)loss_scaler(o.loss_scale);  // its options' checks
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

// Where a traced step's time went: the union of the blocking nodes' intervals (the
// collectives: communication), of the other nodes' (compute), and their intersection
// (communication hidden by compute).
struct time_split {
  double compute = 0;
  double communication = 0;
  double overlapped = 0;
};

time_split split_step_time(const run_metadata& meta) {
  using span = std::pair<std::int64_t, std::int64_t>;
  std::vector<span> comm;
  std::vector<span> work;
  for (const auto& n : meta.nodes) {
    (n.blocking ? comm : work).emplace_back(n.start_ns, n.start_ns + n.duration_ns);
  }
  // Sorted, disjoint intervals covering the same time.
  const auto merged = [](std::vector<span> v) {
    std::ranges::sort(v);
    std::vector<span> out;
    for (const span& x : v) {
      if (!out.empty() && x.first <= out.back().second) {
        out.back().second = std::max(out.back().second, x.second);
      } else {
        out.push_back(x);
      }
    }
    return out;
  };
  const auto length = [](const std::vector<span>& v) {
    std::int64_t t = 0;
    for (const span& x : v) t += x.second - x.first;
    return static_cast<double>(t) * 1e-9;
  };
  comm = merged(std::move(comm));
  work = merged(std::move(work));
  std::int64_t both = 0;
  for (std::size_t i = 0, j = 0; i < comm.size() && j < work.size();) {
    both += std::max<std::int64_t>(
        0, std::min(comm[i].second, work[j].second) - std::max(comm[i].first, work[j].first));
    (comm[i].second < work[j].second ? i : j) += 1;
  }
  return {length(work), length(comm), static_cast<double>(both) * 1e-9};
}

// The mean over the ranks of each of `values` (the ranks' blocks of a batch are of one size,
// so the mean of their means is the global batch's): the loss and accuracy that every rank
// reports and decides on. Outside the graph, after the step: a collective in the graph
// would join the chain of the gradients' ones (Note [collective order]), and the loss,
// which the executor computes last, would hold back every bucket behind it.
void average_over_ranks(const data_parallel& dp, const train_options& o,
                        std::span<double> values) {
  if (dp.ranks <= 1) return;
  tensor t = memory::host_tensor(dtype::f64, {static_cast<std::int64_t>(values.size())});
  std::ranges::copy(values, t.data<double>());
  o.communicator->all_reduce(t, t, reduce_op::avg)->wait();
  std::ranges::copy(t.span<double>(), values.begin());
}

// Throws loom::invalid_argument, on every rank, when the ranks do not all have the same
// `what` (it names the run's options, model and data).
void check_ranks_agree(distributed::communicator& c, const std::string& what,
                       const std::string& subject) {
  const std::vector<std::string> all = distributed::all_gather_strings(c, what);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) {
      throw invalid_argument(
          fmt::format("data-parallel training: rank {} has other {} than rank 0 (every rank must "
                      "run the same; this is rank {}: {})",
                      r, subject, c.rank(), what));
    }
  }
}

// Rank 0's values of the variables `names` on every rank, overwritten in place (a run that
// reads them makes them first).
void broadcast_variables(session& s, distributed::communicator& c,
                         const std::vector<std::string>& names) {
  (void)s.run({}, names);
  for (const std::string& name : names) {
    auto& v = s.variables().get(name);
    const std::lock_guard lock(v.mutex);
    c.broadcast(v.value, 0)->wait();
  }
}

// Data parallelism's part of the run: the ranks, the batch each trains on, and the group
// the collective ops use (the communicator, registered for them).
data_parallel plan_data_parallel(const train_options& o) {
  data_parallel dp;
  dp.local_batch = o.batch;
  if (o.communicator == nullptr || o.communicator->size() <= 1) return dp;
  dp.ranks = o.communicator->size();
  dp.rank = o.communicator->rank();
  if (o.batch % dp.ranks != 0) {
    throw invalid_argument(fmt::format(
        "data-parallel training (rank {}): batch {} does not split over {} ranks: the global "
        "batch must be a multiple of the rank count",
        dp.rank, o.batch, dp.ranks));
  }
  if (o.bucket_bytes == 0) throw invalid_argument("bucket_bytes must be > 0");
  dp.local_batch = o.batch / dp.ranks;
  dp.group = fmt::format("train@{}", static_cast<const void*>(o.communicator.get()));
  return dp;
}

}  // namespace

bool scales_loss(const train_options& options) noexcept {
  return options.scale_loss.value_or(options.passes.amp.type == dtype::f16);
}

std::filesystem::path checkpoint_file(const train_options& options) {
  return options.checkpoint_dir / "checkpoint.safetensors";
}

train_report train(const dataset& train_set, const dataset& test_set, const train_options& o,
                   const std::function<void(const step_progress&)>& progress) {
  check_options(train_set, test_set, o);
  // Where results go, before any work: a directory or file that cannot be written fails now.
  if (!o.checkpoint_dir.empty()) create_output_directory(o.checkpoint_dir, "checkpoint directory");
  if (!o.trace_path.empty()) check_output_file(o.trace_path, "trace file");
  const data_parallel dp = plan_data_parallel(o);
  // The communicator named for the collective ops while training runs.
  const distributed::scoped_group group(dp.group, o.communicator);
  graph g;
  step_graph sg = build_training_graph(g, train_set, o, dp);
  train_report report;
  report.model_summary = sg.model.summary;
  report.parameters = sg.model.parameters;
  report.ranks = dp.ranks;
  report.buckets = sg.buckets;
  if (dp.ranks > 1) {
    // The data's bytes, hashed: every rank must read the same examples.
    const auto bytes = [](const auto& v) {
      return std::string_view(reinterpret_cast<const char*>(v.data()),
                              v.size() * sizeof(v[0]));
    };
    check_ranks_agree(
        *o.communicator,
        fmt::format("model {}, optimizer {} ({}), lr {}, batch {}, epochs {} (steps {}, "
                    "evaluate {}, resume {}), seed {}, bucket_bytes {}, overlap {}, skip "
                    "non-finite {}, sync batch norm {}, {} training examples (hash {:x}/{:x}), "
                    "{} test",
                    sg.model.summary, o.optimizer, o.fused ? "fused" : "per-tensor", o.lr,
                    o.batch, o.epochs, o.max_steps_per_epoch, o.evaluate, o.resume, o.seed,
                    o.bucket_bytes, o.overlap, o.skip_nonfinite_steps, o.sync_batch_norm,
                    train_set.size(),
                    std::hash<std::string_view>{}(bytes(train_set.features)),
                    std::hash<std::string_view>{}(bytes(train_set.labels)), test_set.size()),
        "options or data");
  }

  session_options so;
  so.devices.virtual_cpu_devices = o.devices;
  so.devices.cpu_threads = o.threads;
  so.devices.cpu_memory_log = o.memory_log;
  so.passes = o.passes;
  session s(std::move(g), so);
  std::vector<std::string> fetches{sg.loss, sg.accuracy};
  if (!sg.found_inf.empty()) fetches.push_back(sg.found_inf);
  std::vector<std::string> feed_names{"x", "labels"};
  if (!sg.loss_scale.empty()) feed_names.push_back(sg.loss_scale);
  report.passes = sg.conversion;
  for (auto& r : s.explain_passes(feed_names, fetches, sg.update_targets)) {
    report.passes.push_back(std::move(r));
  }

  // Loss scaling: the scale is fed to every step (loss_scaler).
  std::optional<loss_scaler> scaler;
  tensor scale_feed;
  if (scales_loss(o)) {
    scaler.emplace(o.loss_scale);
    scale_feed = memory::host_tensor(dtype::f32, {});
  }
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
      std::optional<std::string> saved_scale;
      ro.check_metadata = [&](const std::map<std::string, std::string>& meta) {
        from = read_resume_point(meta, ckpt, sg, o);
        if (const auto it = meta.find("loss_scale"); it != meta.end()) saved_scale = it->second;
      };
      (void)checkpoint::restore_checkpoint(s, ckpt, ro);
      // A checkpoint of a run without loss scaling (or an fp32 run resuming one with it)
      // starts from, or drops, the scale: only the variables are the model.
      if (scaler && saved_scale && *saved_scale != "none") {
        scaler->set_scale(parse_number<double>(
            *saved_scale, fmt::format("the loss scale in checkpoint '{}'", ckpt.string())));
      }
      report.resumed_epoch = from.epoch;
      global_step = from.step;
      first_epoch = report.resumed_epoch + 1;
    }
  }
  if (dp.ranks > 1) {
    if (o.resume) {
      check_ranks_agree(*o.communicator,
                        fmt::format("a checkpoint after epoch {}, step {}", report.resumed_epoch,
                                    global_step),
                        "checkpoint to resume from (the directory must be visible to every rank)");
    }
    // Rank 0's parameters on every rank.
    std::vector<std::string> names;
    for (const auto& [name, dims] : sg.params) names.push_back(name);
    broadcast_variables(s, *o.communicator, names);
  }
  // Plain batch norms under data parallelism: each rank's running statistics follow its own
  // block of the batches; evaluation and checkpoints take rank 0's (as DDP's buffers).
  const bool share_running =
      dp.ranks > 1 && !sg.model.running.empty() && !(o.batch_norm && o.sync_batch_norm);

  tensor x = memory::host_tensor(dtype::f32, {dp.local_batch, train_set.num_features});
  tensor labels = memory::host_tensor(dtype::i32, {dp.local_batch});
  // This rank's block of each global batch.
  const std::int64_t block = std::int64_t{dp.rank} * dp.local_batch;
  const std::int64_t full_steps = train_set.size() / o.batch;
  const std::int64_t steps =
      o.max_steps_per_epoch > 0 ? std::min(full_steps, o.max_steps_per_epoch) : full_steps;
  // The step whose trace is written: the fifth, or the last when the run has fewer.
  const std::int64_t planned_steps =
      steps * std::max<std::int64_t>(0, std::int64_t{o.epochs} - first_epoch + 1);
  const std::int64_t trace_step =
      o.trace_path.empty() || dp.rank != 0 ? 0 : std::min<std::int64_t>(5, planned_steps);
  time_split traced_split;
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
      fill_batch(train_set, order, step * o.batch + block, dp.local_batch, x, labels);
      const bool trace_this = o.profile || (o.sample_optimizer_time && step % 10 == 0) ||
                              report.steps + 1 == trace_step;
      run_metadata meta;
      run_options ro;
      ro.trace = trace_this;
      std::vector<feed> feeds{{"x", x}, {"labels", labels}};
      if (scaler) {
        scale_feed.data<float>()[0] = static_cast<float>(scaler->scale());
        feeds.emplace_back(sg.loss_scale, scale_feed);
      }
      const auto out = s.run(feeds, fetches, sg.update_targets, trace_this ? &meta : nullptr, ro);
      // On a GPU the fetched scalars stay there: read them through host copies.
      std::array<double, 2> stats{s.host_value(out[0]).data<float>()[0],
                                  s.host_value(out[1]).data<float>()[0]};
      average_over_ranks(dp, o, stats);
      const auto [loss, acc] = stats;
      const bool found_inf = out.size() > 2 && s.host_value(out[2]).data<bool>()[0];
      ++report.steps;
      ++global_step;
      const bool skipped = !std::isfinite(loss) || found_inf;
      // With loss scaling, gradients that overflowed the scale are expected now and then:
      // the update skipped the step and the scale backs off.
      const bool overflow = scaler && found_inf && std::isfinite(loss);
      if (skipped && !overflow && !o.skip_nonfinite_steps) {
        throw error(nonfinite_step(epoch, step + 1, steps, loss, found_inf, o));
      }
      if (scaler) {
        try {
          scaler->update(found_inf);
        } catch (const error& e) {
          throw error(fmt::format("epoch {}, step {} of {}: {}", epoch, step + 1, steps, e.what()));
        }
      }
      if (skipped) {
        ++er.skipped_steps;
        ++report.skipped_steps;
      } else {
        loss_sum += loss;
        acc_sum += acc;
      }
      if (trace_this) {
        const time_split t = split_step_time(meta);
        traced_split.compute += t.compute;
        traced_split.communication += t.communication;
        traced_split.overlapped += t.overlapped;
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
    if (share_running) broadcast_variables(s, *o.communicator, sg.model.running);
    if (o.evaluate && test_set.size() >= o.batch) {
      std::vector<std::int64_t> test_order(static_cast<std::size_t>(test_set.size()));
      std::iota(test_order.begin(), test_order.end(), 0);
      double correct = 0;
      const std::int64_t test_steps = test_set.size() / o.batch;
      for (std::int64_t t = 0; t < test_steps; ++t) {
        fill_batch(test_set, test_order, t * o.batch + block, dp.local_batch, x, labels);
        correct += s.host_value(s.run({{"x", x}, {"labels", labels}}, {sg.eval_accuracy})[0])
                       .data<float>()[0];
      }
      std::array<double, 1> accuracy{correct / static_cast<double>(test_steps)};
      average_over_ranks(dp, o, accuracy);
      er.test_accuracy = accuracy[0];
    }
    report.epochs.push_back(er);
    if (!o.checkpoint_dir.empty() && dp.rank == 0) {
      checkpoint::save_checkpoint(s, ckpt,
                                  {{"format", "loom train"},
                                   {"epoch", std::to_string(epoch)},
                                   {"step", std::to_string(global_step)},
                                   {"model", sg.model.summary},
                                   {"optimizer", o.optimizer},
                                   {"loss_scale", scaler ? fmt::format("{:.17g}", scaler->scale())
                                                         : std::string("none")}});
    }
  }
  if (scaler) report.loss_scale = scaler->scale();
  report.test_accuracy = report.epochs.empty() ? std::numeric_limits<double>::quiet_NaN()
                                               : report.epochs.back().test_accuracy;
  const std::int64_t trained = report.steps * o.batch;
  report.samples_per_second =
      report.train_seconds > 0 ? static_cast<double>(trained) / report.train_seconds : 0.0;
  if (traced_steps > 0) {
    const double scale = static_cast<double>(report.steps) / static_cast<double>(traced_steps);
    report.optimizer_seconds = traced_optimizer_ns * 1e-9 * scale;
    report.compute_seconds = traced_split.compute * scale;
    report.communication_seconds = traced_split.communication * scale;
    report.overlapped_seconds = traced_split.overlapped * scale;
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
