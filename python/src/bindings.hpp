// The pieces of the loom Python extension (loom._loom), one function per part.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/builder.hpp"

namespace loom::python {

namespace py = pybind11;

void bind_tensor(py::module_& m);   // dtype, Tensor, DLPack, array interface
void bind_graph(py::module_& m);    // Graph, Output, op registry, gradients, optimizers
void bind_session(py::module_& m);  // Session
void bind_memory(py::module_& m);   // loom.memory: statistics, loans, NumPy's allocator
void bind_arrow(py::module_& m);    // Table, Arrow PyCapsules, AoS <-> SoA
void bind_cuda(py::module_& m);     // loom._loom._cuda: CUDA interop for python/loom/cuda.py

/// Raises the Python exception `type` with `message` (throws py::error_already_set).
[[noreturn]] void throw_python(PyObject* type, const std::string& message);

/// The name of obj's Python type ("ndarray"), for error messages.
std::string type_name(const py::handle& obj);

/// A graph and its builder, shared by every Output made from it (loom.Graph).
struct py_graph {
  graph g;
  graph_builder b{g};
  std::vector<std::string> device_stack;  // `with g.device(...)` scopes
};

/// One output of a node, keeping its graph alive (loom.Output).
struct py_output {
  std::shared_ptr<py_graph> owner;
  output out;
};

/// A loom tensor from a Python object: a loom.Tensor as is; anything with __dlpack__
/// (NumPy, PyTorch) without a copy; other NumPy arrays (read-only, or with strides DLPack
/// cannot carry) through the buffer protocol, without a copy where the strides allow; and
/// anything numpy.asarray takes (scalars, lists) as a new array. `what` names the value in
/// errors ("feed 'x'").
tensor to_tensor(const py::handle& obj, const std::string& what);

/// The Python object for a loom tensor (a loom.Tensor).
py::object from_tensor(tensor t);

}  // namespace loom::python
