// The pieces of the loom Python extension (loom._loom), one function per part.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/builder.hpp"
#include "loom/passes/amp.hpp"

namespace loom::python {

namespace py = pybind11;

void bind_tensor(py::module_& m);   // dtype, Tensor, DLPack, array interface
void bind_graph(py::module_& m);    // Graph, Output, op registry, gradients, optimizers
void bind_session(py::module_& m);  // Session
void bind_memory(py::module_& m);   // loom.memory: statistics, loans, NumPy's allocator
void bind_arrow(py::module_& m);    // Table, Arrow PyCapsules, AoS <-> SoA
void bind_cuda(py::module_& m);     // loom._loom._cuda: CUDA interop for python/loom/cuda.py
void bind_onnx(py::module_& m);     // loom._loom._onnx: ONNX import for python/loom/onnx
/// loom.train, and loom.distributed (`dist`): the world, Communicator, DistributedError.
void bind_train(py::module_& m, py::module_& dist);
void bind_amp(py::module_& amp);  // loom.amp: enable / disable on a Graph, LossScaler

/// Raises the Python exception `type` with `message` (throws py::error_already_set).
[[noreturn]] void throw_python(PyObject* type, const std::string& message);

/// The name of obj's Python type ("ndarray"), for error messages.
std::string type_name(const py::handle& obj);

/// obj as an int64 (anything with __index__; a bool too): TypeError naming `what` and obj's
/// type for anything else, OverflowError naming `what` when the int does not fit. Never
/// pybind11's "Unable to cast".
std::int64_t int64_of(const py::handle& obj, const std::string& what);

/// obj as a size (a count of bytes): TypeError naming `what` for anything but an int (a bool
/// included), ValueError for a negative one, OverflowError past 64 bits.
std::size_t size_of_arg(const py::handle& obj, const std::string& what);

/// A Python int in an error message: "the Python int 300", or "a Python int of N bits" for
/// one too long to print (Python refuses to print ints of more than 4300 digits).
std::string describe_int(const py::handle& obj);

/// Note [interpreter exit] (exit_bindings.cpp): loom work without the GIL. Releases the GIL
/// (held on entry) and counts the scope as in flight until it has the GIL back, so that the
/// atexit hook can wait for it; `cancel` (a run's flag, or null) is set when the interpreter
/// exits. Throws loom::cancelled_error (loom.CancelledError), with the GIL and before doing
/// anything, once the interpreter is exiting, on every thread but the exiting one.
class without_gil {
 public:
  explicit without_gil(std::atomic<bool>* cancel = nullptr);
  ~without_gil();  // takes the GIL back, then leaves the count
  without_gil(const without_gil&) = delete;
  without_gil& operator=(const without_gil&) = delete;

 private:
  std::atomic<bool>* cancel_;
  PyThreadState* state_ = nullptr;
};

/// Session.run calls executing now (their without_gil scopes), on every thread.
std::size_t runs_in_flight();

/// Runs fn(arg) with the GIL, from any thread: at once when this thread holds it, through
/// PyGILState_Ensure while the interpreter is neither gone nor finalizing; otherwise not at
/// all (returns false), leaving what fn would release to the process's end. For the release
/// callbacks of buffers over Python objects (Note [interpreter exit]).
bool call_with_gil(void (*fn)(void*), void* arg) noexcept;

void bind_exit(py::module_& m);  // the atexit hook; loom._loom._runs_in_flight

/// A graph and its builder, shared by every Output made from it (loom.Graph).
struct py_graph {
  graph g;
  graph_builder b{g};
  std::vector<std::string> device_stack;  // `with g.device(...)` scopes
  /// loom.amp.enable(graph, ...): the mixed precision of sessions made from it afterwards.
  passes::amp_options amp;
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

/// True for what tensor_of_values takes: a Python bool, int or float, a NumPy integer,
/// floating or bool scalar, or a list or tuple.
bool is_python_values(const py::handle& obj);

/// A new host tensor of dtype `t` holding Python numbers, or nested lists and tuples of
/// them (Note [Python values of a dtype]). `what` names the value in errors ("feed 'x'").
tensor tensor_of_values(const py::handle& obj, dtype t, const std::string& what);

}  // namespace loom::python
