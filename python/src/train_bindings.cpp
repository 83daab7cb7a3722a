// loom.train (the trainer behind `loom train`, include/loom/train/trainer.hpp) and
// loom.distributed (the communicator, include/loom/distributed/communicator.hpp): the
// Python form of `mpirun -np N loom train` is `mpirun -np N python3 script.py` with
// loom.train(..., communicator=loom.distributed.world()).
#include <fmt/format.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>

#include "bindings.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

namespace loom::python {
namespace {

using distributed::communicator;

// A dataset of NumPy arrays: features [N, F] (float32, or anything NumPy casts to it) and
// labels [N] (integers).
train::dataset dataset_of(const py::handle& features, const py::handle& labels,
                          std::int32_t classes, const std::string& name) {
  const auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(features);
  if (!x) throw_python(PyExc_TypeError, fmt::format("{} features: {} is not an array of numbers", name, type_name(features)));
  const auto y = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(labels);
  if (!y) throw_python(PyExc_TypeError, fmt::format("{} labels: {} is not an array of integers", name, type_name(labels)));
  if (x.ndim() != 2) {
    throw_python(PyExc_ValueError, fmt::format("{} features: an array of shape [examples, features] "
                                               "is needed, not one of {} dimensions",
                                               name, x.ndim()));
  }
  if (y.ndim() != 1 || y.shape(0) != x.shape(0)) {
    throw_python(PyExc_ValueError,
                 fmt::format("{} labels: one per example ({}) is needed, not an array of shape {}", name,
                             x.shape(0), py::repr(py::getattr(labels, "shape", py::none())).cast<std::string>()));
  }
  train::dataset d;
  d.name = name;
  d.num_features = x.shape(1);
  d.features.assign(x.data(), x.data() + x.size());
  std::int64_t largest = -1;
  for (py::ssize_t i = 0; i < y.shape(0); ++i) {
    const std::int64_t v = y.at(i);
    if (v < 0 || v > std::numeric_limits<std::int32_t>::max()) {
      throw_python(PyExc_ValueError, fmt::format("{} labels: example {} has the label {}; labels are "
                                                 "class numbers >= 0",
                                                 name, i, v));
    }
    largest = std::max(largest, v);
    d.labels.push_back(static_cast<std::int32_t>(v));
  }
  d.num_classes = classes > 0 ? classes : static_cast<std::int32_t>(largest + 1);
  d.example_shape = d.num_features == 784 ? shape{1, 28, 28} : shape{d.num_features};
  return d;
}

py::dict to_dict(const train::train_report& r) {
  py::list epochs;
  for (const auto& e : r.epochs) {
    py::dict d;
    d["epoch"] = e.epoch;
    d["loss"] = e.loss;
    d["train_accuracy"] = e.train_accuracy;
    d["test_accuracy"] = e.test_accuracy;
    d["skipped_steps"] = e.skipped_steps;
    d["seconds"] = e.seconds;
    d["samples_per_second"] = e.samples_per_second;
    epochs.append(d);
  }
  py::dict out;
  out["epochs"] = epochs;
  out["model"] = r.model_summary;
  out["parameters"] = r.parameters;
  out["steps"] = r.steps;
  out["skipped_steps"] = r.skipped_steps;
  out["loss_scale"] = r.loss_scale;
  out["test_accuracy"] = r.test_accuracy;
  out["samples_per_second"] = r.samples_per_second;
  out["train_seconds"] = r.train_seconds;
  out["optimizer_seconds"] = r.optimizer_seconds;
  out["peak_bytes"] = r.peak_bytes;
  out["resumed_epoch"] = r.resumed_epoch;
  out["ranks"] = r.ranks;
  out["buckets"] = r.buckets;
  out["compute_seconds"] = r.compute_seconds;
  out["communication_seconds"] = r.communication_seconds;
  out["overlapped_seconds"] = r.overlapped_seconds;
  return out;
}

py::dict train_py(const std::string& model, std::vector<std::int64_t> hidden, int epochs,
                  std::int64_t batch, double lr, const std::string& optimizer, bool fused,
                  int threads, std::uint64_t seed, const py::object& features, const py::object& labels,
                  const py::object& test_features, const py::object& test_labels, std::int64_t examples,
                  double test_fraction, const std::optional<std::string>& checkpoint, bool resume,
                  std::int64_t max_steps_per_epoch, bool evaluate,
                  std::shared_ptr<communicator> comm, double bucket_mb, bool overlap,
                  const std::function<void(py::dict)>& progress, const std::string& amp,
                  bool batch_norm, bool sync_bn) {
  train::train_options o;
  o.model = model;
  o.hidden = std::move(hidden);
  o.epochs = epochs;
  o.batch = batch;
  o.lr = lr;
  o.optimizer = optimizer;
  o.fused = fused;
  o.threads = threads;
  o.seed = seed;
  if (checkpoint) o.checkpoint_dir = *checkpoint;
  o.resume = resume;
  o.max_steps_per_epoch = max_steps_per_epoch;
  o.evaluate = evaluate;
  o.communicator = std::move(comm);
  o.passes.amp.type = passes::amp_type_from_name(amp);
  o.batch_norm = batch_norm;
  o.sync_batch_norm = sync_bn;
  if (!(bucket_mb > 0 && bucket_mb <= 1024)) {
    throw_python(PyExc_ValueError, fmt::format("bucket_mb {} must be in (0, 1024]", bucket_mb));
  }
  o.bucket_bytes = static_cast<std::size_t>(bucket_mb * 1024 * 1024);
  o.overlap = overlap;
  train::dataset train_set;
  train::dataset test_set;
  if (!features.is_none() || !labels.is_none()) {
    if (features.is_none() || labels.is_none()) {
      throw_python(PyExc_ValueError, "features and labels go together");
    }
    train_set = dataset_of(features, labels, 0, "training");
    if (!test_features.is_none() || !test_labels.is_none()) {
      if (test_features.is_none() || test_labels.is_none()) {
        throw_python(PyExc_ValueError, "test_features and test_labels go together");
      }
      test_set = dataset_of(test_features, test_labels, train_set.num_classes, "test");
    }
  } else {
    if (examples < 2) throw_python(PyExc_ValueError, fmt::format("examples {} must be >= 2", examples));
    if (!(test_fraction >= 0 && test_fraction < 1)) {
      throw_python(PyExc_ValueError, fmt::format("test_fraction {} must be in [0, 1)", test_fraction));
    }
    std::tie(train_set, test_set) = train::split(train::make_digits(examples, seed), test_fraction, seed);
  }
  std::function<void(const train::step_progress&)> each_step;
  if (progress) {
    each_step = [&progress](const train::step_progress& p) {
      const py::gil_scoped_acquire gil;
      py::dict d;
      d["epoch"] = p.epoch;
      d["epochs"] = p.epochs;
      d["step"] = p.step;
      d["steps"] = p.steps;
      d["loss"] = p.loss;
      d["accuracy"] = p.accuracy;
      d["samples_per_second"] = p.samples_per_second;
      progress(d);
    };
  }
  train::train_report r;
  {
    const without_gil unlocked;  // Note [interpreter exit]
    r = train::train(train_set, test_set, o, each_step);
  }
  return to_dict(r);
}

}  // namespace

void bind_train(py::module_& m, py::module_& dist) {
  static auto& distributed_exc =
      *new py::exception<distributed_error>(dist, "DistributedError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const distributed_error& e) {
      PyErr_SetString(distributed_exc.ptr(), e.what());
    }
  });
  py::class_<communicator, std::shared_ptr<communicator>>(dist, "Communicator",
                                                          "A group of processes (ranks) that train or "
                                                          "exchange together (MPI)")
      .def_property_readonly("rank", &communicator::rank)
      .def_property_readonly("size", &communicator::size)
      .def_property_readonly("backend", &communicator::backend)
      .def_property(
          "timeout", [](const communicator& c) { return static_cast<double>(c.timeout().count()) / 1e3; },
          [](communicator& c, double seconds) {
            if (!(seconds > 0 && seconds < 1e9)) {
              throw_python(PyExc_ValueError, fmt::format("a timeout of {} s; it must be > 0", seconds));
            }
            c.set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1e3)));
          },
          "Seconds an operation may take before it fails with DistributedError")
      .def_property("checked", &communicator::checked, &communicator::set_checked,
                    "Whether each collective first checks that every rank came to it with the same "
                    "arguments (default True; False: the engine's call alone, with no timeout)")
      .def(
          "barrier",
          [](communicator& c) {
            const without_gil unlocked;
            c.barrier()->wait();
          },
          "Returns when every rank has called it")
      .def("__repr__", [](const communicator& c) {
        return fmt::format("<loom.distributed.Communicator rank {} of {} ({})>", c.rank(), c.size(), c.backend());
      });
  dist.def("world", &distributed::world,
           "Every process of the job (MPI_COMM_WORLD; one rank when mpirun did not start this one)");
  dist.def("launched_with_peers", &distributed::launched_with_peers,
           "Whether mpirun (or another launcher) started this process as one of several");

  m.def("train", &train_py, py::kw_only(), py::arg("model") = "mlp",
        py::arg("hidden") = std::vector<std::int64_t>{512, 512}, py::arg("epochs") = 3,
        py::arg("batch") = 128, py::arg("lr") = 1e-3, py::arg("optimizer") = "adam", py::arg("fused") = true,
        py::arg("threads") = 0, py::arg("seed") = 1, py::arg("features") = py::none(),
        py::arg("labels") = py::none(), py::arg("test_features") = py::none(),
        py::arg("test_labels") = py::none(), py::arg("examples") = 24000,
        py::arg("test_fraction") = 1.0 / 6.0, py::arg("checkpoint") = py::none(), py::arg("resume") = false,
        py::arg("max_steps_per_epoch") = 0, py::arg("evaluate") = true, py::arg("communicator") = nullptr,
        py::arg("bucket_mb") = 25.0, py::arg("overlap") = true, py::arg("progress") = nullptr,
        py::arg("amp") = "off", py::arg("batch_norm") = false, py::arg("sync_bn") = false,
        R"(Trains a classifier as `loom train` does and returns its report (a dict).

Data: features [N, F] and labels [N] (NumPy arrays; test_features and test_labels
optional), or else the embedded digits dataset (`examples`, split by `test_fraction`).
With communicator=loom.distributed.world() under `mpirun -np N`, the N processes train one
model data-parallel: `batch` is the global batch (N must divide it), gradients are averaged
in buckets of `bucket_mb` MiB, each started as soon as it is ready when `overlap`; rank 0
writes the checkpoint. `progress(step)` is called after every step with a dict. amp="bf16" or
"fp16" trains with automatic mixed precision (fp16 with dynamic loss scaling), as
`loom train --amp` does. batch_norm=True puts a batch norm after each convolution (hidden
layer); sync_bn=True (data-parallel) takes its statistics over the global batch
(sync_batch_norm), as `loom train --batch-norm --sync-bn` does.)");
}

}  // namespace loom::python
