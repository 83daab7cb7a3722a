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
#include "loom/core/error.hpp"
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
  std::vector<std::string> update_targets;
  model_graph model;
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

}  // namespace

train_report train(const dataset& train_set, const dataset& test_set, const train_options& o,
                   const std::function<void(const step_progress&)>& progress) {
  if (o.batch < 1) throw invalid_argument(fmt::format("batch {} must be >= 1", o.batch));
  if (o.epochs < 0) throw invalid_argument(fmt::format("epochs {} must be >= 0", o.epochs));
  if (train_set.size() < o.batch) {
    throw invalid_argument(fmt::format("the training set has {} examples, fewer than a batch of {}",
                                       train_set.size(), o.batch));
  }
  if (o.devices < 1) throw invalid_argument(fmt::format("devices {} must be >= 1", o.devices));
  if (o.resume && o.checkpoint_dir.empty()) {
    throw invalid_argument("resuming needs a checkpoint directory");
  }
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
  report.passes = s.explain_passes({"x", "labels"}, {sg.loss, sg.accuracy}, sg.update_targets);

  const std::filesystem::path ckpt = o.checkpoint_dir / "checkpoint.safetensors";
  int first_epoch = 1;
  if (o.resume && std::filesystem::exists(ckpt)) {
    const auto meta = checkpoint::restore_checkpoint(s, ckpt);
    auto it = meta.find("epoch");
    if (it != meta.end()) report.resumed_epoch = std::stoi(it->second);
    first_epoch = report.resumed_epoch + 1;
  }

  tensor x = memory::host_tensor(dtype::f32, {o.batch, train_set.num_features});
  tensor labels = memory::host_tensor(dtype::i32, {o.batch});
  const std::int64_t full_steps = train_set.size() / o.batch;
  const std::int64_t steps =
      o.max_steps_per_epoch > 0 ? std::min(full_steps, o.max_steps_per_epoch) : full_steps;
  const std::vector<std::string> fetches{sg.loss, sg.accuracy};
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
                              (report.steps == 4 && !o.trace_path.empty());
      run_metadata meta;
      run_options ro;
      ro.trace = trace_this;
      const auto out = s.run({{"x", x}, {"labels", labels}}, fetches, sg.update_targets,
                             trace_this ? &meta : nullptr, ro);
      // On a GPU the fetched scalars stay there: read them through host copies.
      const double loss = s.host_value(out[0]).data<float>()[0];
      const double acc = s.host_value(out[1]).data<float>()[0];
      if (!std::isfinite(loss)) {
        throw error(fmt::format("the loss became {} at epoch {} step {}: lower the learning rate",
                                loss, epoch, step + 1));
      }
      loss_sum += loss;
      acc_sum += acc;
      ++report.steps;
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
        if (report.steps == 5 && !o.trace_path.empty())
          meta.write_chrome_trace(o.trace_path.string());
      }
      if (progress) {
        step_progress p;
        p.epoch = epoch;
        p.epochs = o.epochs;
        p.step = step + 1;
        p.steps = steps;
        p.loss = loss;
        p.accuracy = acc_sum / static_cast<double>(step + 1);
        p.samples_per_second = static_cast<double>((step + 1) * o.batch) / seconds_since(t0);
        progress(p);
      }
    }
    er.seconds = seconds_since(t0);
    er.loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0;
    er.train_accuracy = steps > 0 ? acc_sum / static_cast<double>(steps) : 0.0;
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
      std::filesystem::create_directories(o.checkpoint_dir);
      checkpoint::save_checkpoint(s, ckpt,
                                  {{"format", "loom train"},
                                   {"epoch", std::to_string(epoch)},
                                   {"model", sg.model.summary},
                                   {"optimizer", o.optimizer}});
    }
  }
  if (!report.epochs.empty()) report.test_accuracy = report.epochs.back().test_accuracy;
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
