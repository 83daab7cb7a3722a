// loom.amp: automatic mixed precision on a Graph (the sessions made from it afterwards run
// the amp pass, loom/passes/amp.hpp), and the dynamic loss scaler of float16 training.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "loom/train/loss_scaler.hpp"

namespace loom::python {
namespace {

// The policy of `policy`: None for the default, else a dict with any of "lower",
// "keep_float32" (lists of op names), "nodes" ({name: bool}) and "allow_emulated" (bool)
// over the default's.
passes::amp_policy policy_of(const py::object& policy) {
  passes::amp_policy p = passes::default_amp_policy();
  if (policy.is_none()) return p;
  if (!py::isinstance<py::dict>(policy)) {
    throw_python(PyExc_TypeError,
                 fmt::format("loom.amp.enable: policy must be a dict or None, not {}",
                             py::str(py::type::of(policy)).cast<std::string>()));
  }
  for (const auto& [key, value] : policy.cast<py::dict>()) {
    const auto k = py::str(key).cast<std::string>();
    if (k == "lower") {
      p.lower = value.cast<std::vector<std::string>>();
    } else if (k == "keep_float32") {
      p.keep_float32 = value.cast<std::vector<std::string>>();
    } else if (k == "follow") {
      p.follow = value.cast<std::vector<std::string>>();
    } else if (k == "nodes") {
      p.nodes = value.cast<std::map<std::string, bool>>();
    } else if (k == "allow_emulated") {
      p.allow_emulated = value.cast<bool>();
    } else {
      throw_python(
          PyExc_ValueError,
          fmt::format("loom.amp.enable: unknown policy key '{}' (lower, keep_float32, follow, "
                      "nodes, allow_emulated)",
                      k));
    }
  }
  return p;
}

py::dict policy_dict(const passes::amp_policy& p) {
  py::dict d;
  d["lower"] = p.lower;
  d["keep_float32"] = p.keep_float32;
  d["follow"] = p.follow;
  d["nodes"] = p.nodes;
  d["allow_emulated"] = p.allow_emulated;
  return d;
}

}  // namespace

void bind_amp(py::module_& amp) {
  amp.def(
      "enable",
      [](const std::shared_ptr<py_graph>& g, const std::string& dtype, const py::object& policy) {
        passes::amp_options o;
        o.type = passes::amp_type_from_name(dtype);
        o.policy = policy_of(policy);
        passes::validate(o);
        g->amp = std::move(o);
        return g;
      },
      py::arg("graph"), py::arg("dtype") = "bf16", py::arg("policy") = py::none(),
      R"(Sessions made from `graph` from now on compute its matrix products and convolutions
(forward and backward) in dtype ("bf16" or "fp16"; "off" turns it off), with casts at the
boundaries, everything else and the variables (master weights) in float32. policy: a dict
over the default (loom.amp.default_policy()) with "lower" and "keep_float32" op lists,
"nodes" ({node name: True to lower, False to keep float32}; the names of the plan's nodes,
which a fusion may have merged: explain_passes lists them and any name it did not find)
and "allow_emulated". Returns the graph. Session.explain_passes says what ran in which
precision and why.)");
  amp.def(
      "disable",
      [](const std::shared_ptr<py_graph>& g) {
        g->amp = {};
        return g;
      },
      py::arg("graph"), "Sessions made from `graph` from now on compute as it is written");
  amp.def(
      "options",
      [](const std::shared_ptr<py_graph>& g) {
        py::dict d;
        d["dtype"] = to_string(g->amp.type);
        d["policy"] = policy_dict(g->amp.policy);
        return d;
      },
      py::arg("graph"), "The graph's mixed precision: {'dtype': ..., 'policy': {...}}");
  amp.def(
      "default_policy", [] { return policy_dict(passes::default_amp_policy()); },
      "The default policy: the ops lowered and the ops kept in float32");

  py::class_<train::loss_scaler>(amp, "LossScaler",
                                 "Dynamic loss scaling for float16 training (PyTorch's GradScaler)")
      .def(py::init([](double initial, double growth, std::int64_t growth_interval, double backoff,
                       std::int64_t max_consecutive_skips) {
             return train::loss_scaler(
                 {initial, growth, growth_interval, backoff, max_consecutive_skips});
           }),
           py::kw_only(), py::arg("initial") = 65536.0, py::arg("growth") = 2.0,
           py::arg("growth_interval") = 2000, py::arg("backoff") = 0.5,
           py::arg("max_consecutive_skips") = 30,
           "Multiply the loss by .scale, pass .scale as the fused optimizer's grad_scale (which "
           "divides by it), "
           "and call .update(found_inf) with its found_inf after each step")
      .def_property("scale", &train::loss_scaler::scale, &train::loss_scaler::set_scale,
                    "The scale the next step multiplies its loss by")
      .def("update", &train::loss_scaler::update, py::arg("found_inf"),
           "After a step: an overflow backs the scale off, growth_interval steps without one "
           "grow it; raises RuntimeError after max_consecutive_skips overflows in a row")
      .def_property_readonly("skipped_steps", &train::loss_scaler::skipped_steps)
      .def_property_readonly("consecutive_skips", &train::loss_scaler::consecutive_skips)
      .def("__repr__", [](const train::loss_scaler& s) {
        return fmt::format("<loom.amp.LossScaler scale {:g}, {} steps skipped>", s.scale(),
                           s.skipped_steps());
      });
}

}  // namespace loom::python
