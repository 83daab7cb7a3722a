// loom.Graph and loom.Output: building graphs from Python.
//
//   g = loom.Graph()
//   x = g.placeholder("x", loom.float32, [None, 784])
//   w = g.variable("w", init=np.zeros((784, 10), np.float32))
//   y = g.op("softmax", [x @ w], axis=-1)
//   (dw,) = g.gradients(loss, [w])
//
// Any op of the registry is g.op(type, inputs, name=, device=, **attrs); attribute values
// are converted by the op's declared attribute types, so an unknown attribute or a value of
// the wrong kind is a clear error naming the op. loom.ops (Python) wraps each op as a
// function. An Output keeps its Graph alive.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "loom/core/error.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/graph/serialization.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::python {

namespace {

node_options options_of(const py_graph& pg, const std::optional<std::string>& name,
                        const std::optional<std::string>& device) {
  node_options o;
  if (name) o.name = *name;
  if (device) {
    o.device = *device;
  } else if (!pg.device_stack.empty()) {
    o.device = pg.device_stack.back();
  }
  return o;
}

// A shape from Python: a sequence of ints, None for an unknown dimension.
shape shape_of(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj)) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: a shape is a sequence of ints (None for unknown), not a {}", what,
                             type_name(obj)));
  }
  std::vector<std::int64_t> dims;
  for (const py::handle d : obj) {
    if (d.is_none()) {
      dims.push_back(-1);
      continue;
    }
    // Dimensions below -1: graph::add_node refuses them (check_shape_attr), for every caller.
    dims.push_back(int64_of(d, fmt::format("{}: dimension {}", what, dims.size())));
  }
  return shape(dims);
}

// A dtype loom has, by name; an unknown or unsupported one is a TypeError (as NumPy's).
dtype dtype_named(const std::string& name, const std::string& what) {
  try {
    return parse_dtype(name);
  } catch (const invalid_argument& e) {
    throw_python(PyExc_TypeError, fmt::format("{}: {}", what, e.what()));
  }
}

dtype dtype_of(const py::handle& obj, const std::string& what) {
  if (py::isinstance<dtype>(obj)) return obj.cast<dtype>();
  if (py::isinstance<py::str>(obj)) return dtype_named(obj.cast<std::string>(), what);
  // A NumPy dtype or scalar type: by its name ("float32").
  if (py::hasattr(obj, "dtype") || py::hasattr(obj, "kind")) {
    const py::object np_dtype = py::module_::import("numpy").attr("dtype")(obj);
    const std::string name = py::str(np_dtype.attr("name")).cast<std::string>();
    return dtype_named(name, what);
  }
  throw_python(PyExc_TypeError,
               fmt::format("{}: expected a loom.dtype, a dtype name or a NumPy dtype, not a {}",
                           what, type_name(obj)));
}

// A host tensor that owns a copy of `obj` (constants and initial values must not alias
// memory the caller may change later).
tensor owned_tensor(const py::handle& obj, const std::string& what, std::optional<dtype> type) {
  // Python numbers and lists of a given dtype: Note [Python values of a dtype].
  if (type && is_python_values(obj)) return tensor_of_values(obj, *type, what);
  py::object array = obj.cast<py::object>();
  if (type && !py::isinstance<tensor>(obj)) {
    array = py::module_::import("numpy").attr("asarray")(obj, py::str(to_string(*type)));
  }
  const tensor view = to_tensor(array, what);
  const device_id host{device_type::cpu, 0};
  return memory::contiguous_copy(view, memory::get_device_resource(host), host);
}

attr_value attr_of(const attr_def& def, const py::handle& v, const std::string& what) {
  try {
    switch (def.type) {
      case attr_type::integer:
        if (py::isinstance<py::bool_>(v)) break;
        return v.cast<std::int64_t>();
      case attr_type::real:
        return v.cast<double>();
      case attr_type::boolean:
        return v.cast<bool>();
      case attr_type::string:
        return v.cast<std::string>();
      case attr_type::type:
        return dtype_of(v, what);
      case attr_type::ints:
        if (py::isinstance<py::int_>(v)) return std::vector<std::int64_t>{v.cast<std::int64_t>()};
        return v.cast<std::vector<std::int64_t>>();
      case attr_type::reals:
        if (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) {
          return std::vector<double>{v.cast<double>()};
        }
        return v.cast<std::vector<double>>();
      case attr_type::shape:
        return shape_of(v, what);
      case attr_type::tensor:
        return owned_tensor(v, what, std::nullopt);
    }
  } catch (const py::cast_error&) {
  }
  throw_python(PyExc_TypeError,
               fmt::format("{}: expected {}, got a {}", what, to_string(def.type), type_name(v)));
}

// g.op(...): adds a node; one Output for single-output ops, a tuple otherwise.
py::object add_op(const std::shared_ptr<py_graph>& pg, const std::string& type,
                  const std::vector<py_output>& inputs, const std::optional<std::string>& name,
                  const std::optional<std::string>& device, const py::kwargs& kwargs) {
  const op_def& def = op_registry::global().get(type);
  attr_map attrs;
  for (const auto& [key, value] : kwargs) {
    const std::string k = key.cast<std::string>();
    const attr_def* a = def.find_attr(k);
    if (a == nullptr) {
      std::string known;
      for (const attr_def& d : def.attrs) known += (known.empty() ? "" : ", ") + d.name;
      throw_python(PyExc_TypeError, fmt::format("op '{}' has no attribute '{}' (it has: {})", type,
                                                k, known.empty() ? "none" : known));
    }
    attrs.emplace(k, attr_of(*a, value, fmt::format("op '{}' attribute '{}'", type, k)));
  }
  std::vector<output> ins;
  for (const py_output& in : inputs) {
    if (in.owner != pg) {
      throw_python(PyExc_ValueError, fmt::format("op '{}': input '{}' belongs to another graph",
                                                 type, in.out.name()));
    }
    ins.push_back(in.out);
  }
  const std::vector<output> outs =
      pg->b.add(type, ins, std::move(attrs), options_of(*pg, name, device));
  if (outs.size() == 1) return py::cast(py_output{pg, outs[0]});
  py::tuple t(outs.size());
  for (std::size_t i = 0; i < outs.size(); ++i) t[i] = py::cast(py_output{pg, outs[i]});
  return t;
}

// Note [Python numbers beside an Output]: PyTorch's rule for a tensor and a Python number.
// (Two Outputs must have the same dtype: loom does not promote between its own tensors.)
// The number takes the Output's dtype, except that a float beside an integer or bool Output
// (int32_output * 2.5) makes both float32, and an int beside a bool Output makes both int64;
// an int that the Output's integer dtype cannot hold is an OverflowError, never a silent
// wrap. Anything else beside an Output is a TypeError.
struct operands {
  py_output a, b;
};

py_output cast_to(const py_output& x, dtype to) {
  return py_output{x.owner, ops::cast(x.out, to)};
}

// `x` op `v` (or `v` op `x` when `number_first`), with v an Output or a Python number.
operands operands_of(const py_output& x, const py::handle& v, bool number_first) {
  if (py::isinstance<py_output>(v)) {
    const auto y = v.cast<py_output>();
    return number_first ? operands{y, x} : operands{x, y};
  }
  const bool is_bool = py::isinstance<py::bool_>(v);
  const bool is_int = !is_bool && py::isinstance<py::int_>(v);
  const bool is_float = py::isinstance<py::float_>(v);
  if (!is_bool && !is_int && !is_float) {
    throw_python(PyExc_TypeError,
                 fmt::format("unsupported operand: a loom.Output and a {}", type_name(v)));
  }
  py_output out = x;
  dtype t = x.out.dtype_of();
  if (is_float && (is_integer(t) || t == dtype::boolean)) {
    t = dtype::f32;
    out = cast_to(x, t);
  } else if (is_int && t == dtype::boolean) {
    t = dtype::i64;
    out = cast_to(x, t);
  }
  if (is_int && is_integer(t)) {
    // The int must fit: Python ints are unbounded, loom's integers are not.
    const py::object lo = py::module_::import("numpy").attr("iinfo")(py::str(to_string(t)));
    const py::int_ n = v.cast<py::int_>();
    if (n < lo.attr("min") || n > lo.attr("max")) {
      throw_python(PyExc_OverflowError,
                   fmt::format("the Python int {} does not fit {} (the dtype of '{}')",
                               py::repr(v).cast<std::string>(), to_string(t), x.out.name()));
    }
    const py_output c{x.owner, ops::scalar(x.owner->b, static_cast<double>(v.cast<std::int64_t>()), t)};
    return number_first ? operands{c, out} : operands{out, c};
  }
  const py_output c{x.owner, ops::scalar(x.owner->b, v.cast<double>(), t)};
  return number_first ? operands{c, out} : operands{out, c};
}

py_output binary(const char* op, operands xy) {
  if (xy.a.owner != xy.b.owner) throw_python(PyExc_ValueError, "operands belong to different graphs");
  return py_output{xy.a.owner, xy.a.owner->b.add1(op, {xy.a.out, xy.b.out})};
}

// `/` is true division, as in Python, NumPy and PyTorch: integer and bool operands are
// divided as float32 (PyTorch's default dtype). loom's div op on integers truncates.
py_output true_divide(operands xy) {
  for (py_output* x : {&xy.a, &xy.b}) {
    const dtype t = x->out.dtype_of();
    if (is_integer(t) || t == dtype::boolean) *x = cast_to(*x, dtype::f32);
  }
  return binary("div", xy);
}

py::object shape_tuple(const tensor_type& t) {
  if (!t.shape) return py::none();
  py::tuple s(t.shape->rank());
  for (std::size_t i = 0; i < t.shape->rank(); ++i) {
    s[i] = (*t.shape)[i] < 0 ? py::object(py::none()) : py::object(py::int_((*t.shape)[i]));
  }
  return s;
}

py::dict op_def_dict(const op_def& d) {
  py::list inputs;
  for (const arg_def& a : d.inputs) {
    inputs.append(
        py::dict(py::arg("name") = a.name, py::arg("list") = !a.list_length_attr.empty()));
  }
  py::list attrs;
  for (const attr_def& a : d.attrs) {
    attrs.append(py::dict(py::arg("name") = a.name, py::arg("type") = to_string(a.type),
                          py::arg("required") = !a.default_value.has_value() && a.default_from.empty()));
  }
  return py::dict(py::arg("name") = d.name, py::arg("inputs") = inputs,
                  py::arg("outputs") = d.outputs.size(), py::arg("attrs") = attrs,
                  py::arg("summary") = d.summary);
}

ops::sgd_options sgd_options_of(double momentum, double dampening, double weight_decay,
                                bool nesterov, const py::object& moment, bool master_weights) {
  ops::sgd_options o;
  o.momentum = momentum;
  o.dampening = dampening;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  o.moment_dtype = dtype_of(moment, "moment_dtype");
  o.master_weights = master_weights;
  return o;
}

ops::adam_options adam_options_of(double beta1, double beta2, double eps,
                                  std::optional<double> weight_decay, const py::object& moment,
                                  bool master_weights) {
  ops::adam_options o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.moment_dtype = dtype_of(moment, "moment_dtype");
  o.master_weights = master_weights;
  return o;
}

std::vector<output> outs_of(const std::shared_ptr<py_graph>& pg, const std::vector<py_output>& v,
                            const char* what) {
  std::vector<output> out;
  for (const py_output& o : v) {
    if (o.owner != pg)
      throw_python(PyExc_ValueError, fmt::format("{}: an output of another graph", what));
    out.push_back(o.out);
  }
  return out;
}

py::tuple fused_result(const std::shared_ptr<py_graph>& pg, const std::string& update,
                       const ops::fused_update& u) {
  return py::make_tuple(update, py_output{pg, u.grad_norm}, py_output{pg, u.found_inf});
}

// Note [optimizer step counters]: Adam's bias correction needs the number of the step. Given
// step=None, an Adam update keeps its own: an int64 variable "<base>" (made unique) that
// starts at 1 and that the name returned as the update advances after each step taken (a
// fused step skipped for an inf/NaN gradient does not count, as with PyTorch's GradScaler).
// Running that name as a target runs the update too. A step passed in is left to its owner.
output new_step_counter(const std::shared_ptr<py_graph>& pg, const std::string& base) {
  std::string name = base;
  for (int k = 1; pg->g.find(name) != nullptr; ++k) name = fmt::format("{}_{}", base, k);
  return ops::variable(pg->b, name, owned_tensor(py::int_(1), "step", dtype::i64));
}

// The node that advances `step` once `update` has run: by one, or, for a fused update, by
// one unless it found an inf/NaN gradient (which also orders it after the update).
std::string advance_step(const std::shared_ptr<py_graph>& pg, const output& step,
                         const std::string& update, const std::optional<output>& found_inf) {
  const output by = found_inf ? ops::cast(ops::logical_not(*found_inf), dtype::i64)
                              : ops::scalar(pg->b, 1.0, dtype::i64);
  const output advanced = ops::assign_add(step, by, {.name = update + "/advance_step"});
  const node& advance = advanced.producer();
  if (!found_inf) pg->g.add_control_input(advance.id, pg->g.get(update).id);
  return advance.name;
}

// step: an Output, or None for a counter of the update's own.
output step_or_counter(const std::shared_ptr<py_graph>& pg, const py::object& step,
                       const char* base) {
  if (step.is_none()) return new_step_counter(pg, base);
  if (!py::isinstance<py_output>(step)) {
    throw_python(PyExc_TypeError,
                 fmt::format("step must be an int64 loom.Output or None, not a {}", type_name(step)));
  }
  return step.cast<py_output>().out;
}

// grad_scale: an Output, or None for 1.
output scale_or_one(const std::shared_ptr<py_graph>& pg, const py::object& scale) {
  if (scale.is_none()) return ops::scalar(pg->b, 1.0, dtype::f32);
  if (!py::isinstance<py_output>(scale)) {
    throw_python(PyExc_TypeError, fmt::format("grad_scale must be a float32 loom.Output or None, "
                                              "not a {}", type_name(scale)));
  }
  return scale.cast<py_output>().out;
}

}  // namespace

void bind_graph(py::module_& m) {
  using pg_ptr = std::shared_ptr<py_graph>;
  py::class_<py_output>(m, "Output", "One output of a node of a loom.Graph")
      .def_property_readonly(
          "name", [](const py_output& o) { return o.out.name(); },
          "What Session.run takes as a fetch: 'node' or 'node:k'")
      .def_property_readonly("node", [](const py_output& o) { return o.out.producer().name; })
      .def_property_readonly("op", [](const py_output& o) { return o.out.producer().op(); })
      .def_property_readonly("dtype", [](const py_output& o) { return o.out.dtype_of(); })
      .def_property_readonly(
          "shape", [](const py_output& o) { return shape_tuple(o.out.type()); },
          "A tuple (None for an unknown dimension), or None for an unknown rank")
      .def_property_readonly("graph", [](const py_output& o) { return o.owner; })
      .def("__repr__",
           [](const py_output& o) {
             return fmt::format("loom.Output('{}', {})", o.out.name(), to_string(o.out.type()));
           })
      .def("__add__",
           [](const py_output& a, const py::object& b) {
             return binary("add", operands_of(a, b, false));
           })
      .def("__radd__",
           [](const py_output& a, const py::object& b) {
             return binary("add", operands_of(a, b, true));
           })
      .def("__sub__",
           [](const py_output& a, const py::object& b) {
             return binary("sub", operands_of(a, b, false));
           })
      .def("__rsub__",
           [](const py_output& a, const py::object& b) {
             return binary("sub", operands_of(a, b, true));
           })
      .def("__mul__",
           [](const py_output& a, const py::object& b) {
             return binary("mul", operands_of(a, b, false));
           })
      .def("__rmul__",
           [](const py_output& a, const py::object& b) {
             return binary("mul", operands_of(a, b, true));
           })
      .def("__truediv__",
           [](const py_output& a, const py::object& b) {
             return true_divide(operands_of(a, b, false));
           })
      .def("__rtruediv__",
           [](const py_output& a, const py::object& b) {
             return true_divide(operands_of(a, b, true));
           })
      .def("__matmul__",
           [](const py_output& a, const py_output& b) { return binary("matmul", {a, b}); })
      .def("__neg__", [](const py_output& a) {
        return py_output{a.owner, a.owner->b.add1("neg", {a.out})};
      });

  py::class_<py_graph, pg_ptr>(m, "Graph", "A dataflow graph of ops, built node by node")
      .def(py::init([] { return std::make_shared<py_graph>(); }))
      .def_static(
          "from_json",
          [](const std::string& text) {
            auto pg = std::make_shared<py_graph>();
            pg->g = graph_from_json(text);
            return pg;
          },
          py::arg("text"), "A graph from its JSON form (docs/runtime.md)")
      .def(
          "to_json", [](const py_graph& pg, int indent) { return graph_to_json(pg.g, indent); },
          py::arg("indent") = 2)
      .def_property_readonly("num_nodes", [](const py_graph& pg) { return pg.g.num_nodes(); })
      .def("node_names",
           [](const py_graph& pg) {
             std::vector<std::string> names;
             for (const node& n : pg.g.nodes()) names.push_back(n.name);
             return names;
           })
      .def(
          "output",
          [](const pg_ptr& pg, const std::string& name) {
            // graph::parse_endpoint, as a run reads names: ValueError for a name that is
            // not 'node' or 'node:k' (k a non-negative int), KeyError for a node the graph
            // lacks or an output it does not have.
            try {
              return py_output{pg, output(&pg->b, pg->g.parse_endpoint(name))};
            } catch (const not_found& e) {
              const std::string quoted = "'" + name + "'";
              if (std::string_view(e.what()).find(quoted) != std::string_view::npos) throw;
              throw not_found(fmt::format("output {}: {}", quoted, e.what()));
            }
          },
          py::arg("name"), "The Output called 'node' or 'node:k'")
      .def(
          "placeholder",
          [](const pg_ptr& pg, const std::string& name, const py::object& type,
             const py::object& s) {
            return py_output{pg, ops::placeholder(pg->b, name, dtype_of(type, "placeholder dtype"),
                                                  shape_of(s, "placeholder shape"))};
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"),
          "A value fed to each Session.run (None for a dimension any size)")
      .def(
          "constant",
          [](const pg_ptr& pg, const py::object& value, const py::object& type,
             const std::optional<std::string>& name) {
            const std::optional<dtype> t =
                type.is_none() ? std::nullopt
                               : std::optional<dtype>(dtype_of(type, "constant dtype"));
            return py_output{pg, ops::constant(pg->b, owned_tensor(value, "constant", t),
                                               options_of(*pg, name, std::nullopt))};
          },
          py::arg("value"), py::arg("dtype") = py::none(), py::arg("name") = py::none(),
          "A constant holding a copy of value")
      .def(
          "variable",
          [](const pg_ptr& pg, const std::string& name, const py::object& init,
             const py::object& type, const py::object& s) {
            if (!init.is_none()) {
              const std::optional<dtype> t =
                  type.is_none() ? std::nullopt
                                 : std::optional<dtype>(dtype_of(type, "variable dtype"));
              return py_output{pg,
                               ops::variable(pg->b, name, owned_tensor(init, "variable init", t))};
            }
            if (type.is_none() || s.is_none()) {
              throw_python(PyExc_TypeError,
                           fmt::format("variable '{}': give init, or dtype and shape", name));
            }
            return py_output{pg, ops::variable(pg->b, name, dtype_of(type, "variable dtype"),
                                               shape_of(s, "variable shape"))};
          },
          py::arg("name"), py::arg("init") = py::none(), py::arg("dtype") = py::none(),
          py::arg("shape") = py::none(),
          "A variable living in the session across runs, initialized from a copy of init")
      .def("op", &add_op, py::arg("type"), py::arg("inputs") = std::vector<py_output>{},
           py::kw_only(), py::arg("name") = py::none(), py::arg("device") = py::none(),
           "Adds a node of op `type`; attributes as keywords")
      .def("_push_device", [](py_graph& pg, const std::string& d) { pg.device_stack.push_back(d); })
      .def("_pop_device",
           [](py_graph& pg) {
             if (!pg.device_stack.empty()) pg.device_stack.pop_back();
           })
      .def(
          "gradients",
          [](const pg_ptr& pg, const py_output& loss, const std::vector<py_output>& xs) {
            std::vector<py_output> out;
            for (const output& g : gradients(loss.out, outs_of(pg, xs, "gradients"))) {
              out.push_back(py_output{pg, g});
            }
            return out;
          },
          py::arg("loss"), py::arg("xs"), "d loss / d x for each x, as Outputs of this graph")
      .def(
          "apply_sgd",
          [](const pg_ptr&, const py_output& param, const py_output& grad, const py_output& lr,
             double momentum, double dampening, double weight_decay, bool nesterov,
             const py::object& moment, bool master) {
            return ops::apply_sgd(param.out, grad.out, lr.out,
                                  sgd_options_of(momentum, dampening, weight_decay, nesterov,
                                                 moment, master));
          },
          py::arg("param"), py::arg("grad"), py::arg("lr"), py::kw_only(),
          py::arg("momentum") = 0.0, py::arg("dampening") = 0.0, py::arg("weight_decay") = 0.0,
          py::arg("nesterov") = false, py::arg("moment_dtype") = dtype::f32,
          py::arg("master_weights") = true,
          "One SGD update of one variable; returns the node's name (run it as a target)")
      .def(
          "apply_adam",
          [](const pg_ptr& pg, const py_output& param, const py_output& grad,
             const py_output& lr, const py::object& step_arg, double beta1, double beta2,
             double eps, std::optional<double> weight_decay, bool decoupled,
             const py::object& moment, bool master) {
            const auto o = adam_options_of(beta1, beta2, eps, weight_decay, moment, master);
            const output step = step_or_counter(pg, step_arg, "adam_step");
            const std::string update =
                decoupled ? ops::apply_adamw(param.out, grad.out, lr.out, step, o)
                          : ops::apply_adam(param.out, grad.out, lr.out, step, o);
            return step_arg.is_none() ? advance_step(pg, step, update, std::nullopt) : update;
          },
          py::arg("param"), py::arg("grad"), py::arg("lr"), py::arg("step") = py::none(),
          py::kw_only(),
          py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
          py::arg("weight_decay") = py::none(), py::arg("decoupled") = false,
          py::arg("moment_dtype") = dtype::f32, py::arg("master_weights") = true,
          "One Adam (decoupled=True: AdamW) update of one variable; returns the name to run as "
          "a target. step=None: the update counts its own steps (Note [optimizer step "
          "counters])")
      .def(
          "fused_adam",
          [](const pg_ptr& pg, const std::vector<py_output>& params,
             const std::vector<py_output>& grads, const py_output& lr, const py::object& step_arg,
             const py::object& scale_arg, double beta1, double beta2, double eps,
             std::optional<double> weight_decay, bool decoupled, const py::object& moment,
             bool master, double max_grad_norm, bool check_finite) {
            const auto o = adam_options_of(beta1, beta2, eps, weight_decay, moment, master);
            ops::fused_options f;
            f.max_grad_norm = max_grad_norm;
            f.check_finite = check_finite;
            const auto ps = outs_of(pg, params, "fused_adam params");
            const auto gs = outs_of(pg, grads, "fused_adam grads");
            const output step = step_or_counter(pg, step_arg, "adam_step");
            const output scale = scale_or_one(pg, scale_arg);
            const ops::fused_update u = decoupled ? ops::fused_adamw(ps, gs, lr.out, step, scale, o, f)
                                                  : ops::fused_adam(ps, gs, lr.out, step, scale, o, f);
            const std::string update =
                step_arg.is_none() ? advance_step(pg, step, u.name, u.found_inf) : u.name;
            return fused_result(pg, update, u);
          },
          py::arg("params"), py::arg("grads"), py::arg("lr"), py::arg("step") = py::none(),
          py::arg("grad_scale") = py::none(), py::kw_only(), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
          py::arg("eps") = 1e-8, py::arg("weight_decay") = py::none(), py::arg("decoupled") = false,
          py::arg("moment_dtype") = dtype::f32, py::arg("master_weights") = true,
          py::arg("max_grad_norm") = 0.0, py::arg("check_finite") = true,
          "One fused multi-tensor Adam (AdamW) update of every param: returns (the name to "
          "run as a target, grad_norm, found_inf). step=None: the update counts its own steps "
          "(Note [optimizer step counters]); grad_scale=None: 1")
      .def(
          "fused_sgd",
          [](const pg_ptr& pg, const std::vector<py_output>& params,
             const std::vector<py_output>& grads, const py_output& lr, const py::object& scale_arg,
             double momentum, double dampening, double weight_decay, bool nesterov,
             const py::object& moment, bool master, double max_grad_norm, bool check_finite) {
            const auto o =
                sgd_options_of(momentum, dampening, weight_decay, nesterov, moment, master);
            ops::fused_options f;
            f.max_grad_norm = max_grad_norm;
            f.check_finite = check_finite;
            const ops::fused_update u =
                ops::fused_sgd(outs_of(pg, params, "fused_sgd params"),
                               outs_of(pg, grads, "fused_sgd grads"), lr.out,
                               scale_or_one(pg, scale_arg), o, f);
            return fused_result(pg, u.name, u);
          },
          py::arg("params"), py::arg("grads"), py::arg("lr"), py::arg("grad_scale") = py::none(),
          py::kw_only(), py::arg("momentum") = 0.0, py::arg("dampening") = 0.0,
          py::arg("weight_decay") = 0.0, py::arg("nesterov") = false,
          py::arg("moment_dtype") = dtype::f32, py::arg("master_weights") = true,
          py::arg("max_grad_norm") = 0.0, py::arg("check_finite") = true,
          "One fused multi-tensor SGD update: returns (node name, grad_norm, found_inf)");

  m.def(
      "op_names", [] { return op_registry::global().names(); }, "Every registered op");
  m.def(
      "op_def",
      [](const std::string& name) { return op_def_dict(op_registry::global().get(name)); },
      py::arg("name"), "An op's inputs, outputs and attributes");
}

}  // namespace loom::python
