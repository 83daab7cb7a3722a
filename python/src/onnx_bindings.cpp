// loom._loom._onnx: ONNX import for python/loom/onnx (loom.onnx.load).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.hpp"
#include "loom/onnx/import.hpp"

namespace loom::python {
namespace {

py::dict value_dict(const onnx::model_value& v) {
  return py::dict(py::arg("name") = v.onnx_name, py::arg("node") = v.node,
                  py::arg("tensor") = v.tensor, py::arg("dtype") = v.type,
                  py::arg("shape") = std::vector<std::int64_t>(v.dims.begin(), v.dims.end()),
                  py::arg("dim_names") = v.dim_names);
}

py::dict import_model(const py::object& source, bool initializers_as_variables,
                      const std::map<std::string, std::vector<std::int64_t>>& input_shapes,
                      const py::dict& input_values,
                      bool check, bool fuse_patterns, const std::string& external_data_dir,
                      const std::string& device) {
  onnx::import_options o;
  o.initializers_as_variables = initializers_as_variables;
  o.check_model = check;
  o.fuse_patterns = fuse_patterns;
  o.device = device;
  o.external_data_dir = external_data_dir;
  for (const auto& [name, dims] : input_shapes) o.input_shapes[name] = shape(dims);
  for (const auto& [name, v] : input_values) {
    const auto key = py::str(name).cast<std::string>();
    // numpy.require keeps a 0-d array 0-d (ascontiguousarray makes it 1-d).
    const py::object array = py::module_::import("numpy").attr("require")(v, py::none(), "C");
    o.input_values[key] = to_tensor(array, "input_values['" + key + "']");
  }
  onnx::imported_model m;
  if (py::isinstance<py::bytes>(source) || py::isinstance<py::bytearray>(source) ||
      py::isinstance<py::memoryview>(source)) {
    const std::string bytes = py::isinstance<py::bytes>(source)
                                  ? source.cast<std::string>()
                                  : py::bytes(py::module_::import("builtins").attr("bytes")(source))
                                        .cast<std::string>();
    const without_gil unlocked;
    m = onnx::import_bytes(bytes, o);
  } else {
    const auto path = source.cast<std::filesystem::path>();
    const without_gil unlocked;
    m = onnx::import_file(path, o);
  }
  auto g = std::make_shared<py_graph>();
  g->g = std::move(m.graph);
  py::list inputs;
  py::list outputs;
  for (const auto& v : m.inputs) inputs.append(value_dict(v));
  for (const auto& v : m.outputs) outputs.append(value_dict(v));
  return py::dict(py::arg("graph") = g, py::arg("inputs") = inputs, py::arg("outputs") = outputs,
                  py::arg("opset") = m.opset, py::arg("file_opset") = m.file_opset,
                  py::arg("producer") = m.producer, py::arg("variables") = m.variables,
                  py::arg("rewrites") = m.rewrites);
}

}  // namespace

void bind_onnx(py::module_& m) {
  // Raised with (message, input name) as its args: loom.onnx.InputValueRequired.
  static auto& value_required_exc =
      *new py::exception<onnx::value_required>(m, "InputValueRequired", PyExc_TypeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const onnx::value_required& e) {
      PyErr_SetObject(value_required_exc.ptr(), py::make_tuple(e.what(), e.input()).ptr());
    }
  });
  m.def("import_model", &import_model, py::arg("source"), py::kw_only(),
        py::arg("initializers_as_variables") = false,
        py::arg("input_shapes") = std::map<std::string, std::vector<std::int64_t>>{},
        py::arg("input_values") = py::dict(),
        py::arg("check") = true, py::arg("fuse_patterns") = true,
        py::arg("external_data_dir") = std::string(), py::arg("device") = std::string(),
        "Imports an ONNX model (a path or the bytes of a ModelProto): a dict with the Graph, "
        "its inputs and outputs (ONNX names and the loom tensors holding them) and the opset");
  m.def("supported_ops", &onnx::supported_ops,
        "The ONNX op types (default domain) loom imports, sorted");
  m.attr("min_opset") = onnx::min_opset;
  m.attr("max_opset") = onnx::max_opset;
}

}  // namespace loom::python
