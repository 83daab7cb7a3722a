// loom._loom: the extension behind the `loom` Python package. Errors become the Python
// exceptions NumPy users expect: invalid arguments ValueError, unsupported dtypes and
// devices TypeError, unknown names KeyError, out of memory MemoryError, a failed node
// loom.NodeError (a RuntimeError), a cancelled run loom.CancelledError.
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "loom/core/error.hpp"

namespace loom::python {

void throw_python(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

std::string type_name(const py::handle& obj) {
  return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

std::int64_t int64_of(const py::handle& obj, const std::string& what) {
  if (PyLong_Check(obj.ptr()) == 0 && PyIndex_Check(obj.ptr()) == 0) {
    throw_python(PyExc_TypeError, fmt::format("{} must be an int, not a {}", what, type_name(obj)));
  }
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow != 0) {
    throw_python(PyExc_OverflowError,
                 fmt::format("{}: {} does not fit a 64-bit integer", what, describe_int(index)));
  }
  return v;
}

std::size_t size_of_arg(const py::handle& obj, const std::string& what) {
  if (PyLong_Check(obj.ptr()) == 0 || PyBool_Check(obj.ptr()) != 0) {
    throw_python(PyExc_TypeError, fmt::format("{} must be an int (a number of bytes), not a {}",
                                              what, type_name(obj)));
  }
  if (PyObject_RichCompareBool(obj.ptr(), py::int_(0).ptr(), Py_LT) == 1) {
    throw_python(PyExc_ValueError, fmt::format("{} is {}; a number of bytes is not negative", what,
                                               py::repr(obj).cast<std::string>()));
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(obj.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw_python(PyExc_OverflowError,
                 fmt::format("{} is {}, past 64 bits", what, py::repr(obj).cast<std::string>()));
  }
  return static_cast<std::size_t>(v);
}

std::string describe_int(const py::handle& obj) {
  // bit_length(), not the C API's private _PyLong_NumBits (its signature moved in 3.13).
  const auto bits = obj.attr("bit_length")().cast<std::int64_t>();
  if (bits > 256) {
    const bool negative = PyObject_RichCompareBool(obj.ptr(), py::int_(0).ptr(), Py_LT) == 1;
    return fmt::format("a {}Python int of {} bits", negative ? "negative " : "", bits);
  }
  return "the Python int " + py::repr(obj).cast<std::string>();
}

namespace {

void init_module(py::module_& m) {
  m.doc() = "loom: a device-aware tensor runtime (C++ extension)";
  // Never destroyed: a static Python object would be released after the interpreter is gone.
  static auto& node_exc = *new py::exception<node_error>(m, "NodeError", PyExc_RuntimeError);
  static auto& cancelled_exc =
      *new py::exception<cancelled_error>(m, "CancelledError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const unsupported_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const not_found& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const node_error& e) {
      PyErr_SetString(node_exc.ptr(), e.what());
    } catch (const cancelled_error& e) {
      PyErr_SetString(cancelled_exc.ptr(), e.what());
    } catch (const invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const parse_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const out_of_memory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  bind_exit(m);
  bind_tensor(m);
  bind_graph(m);
  bind_session(m);
  bind_arrow(m);
  auto memory = m.def_submodule("memory", "Memory statistics, loans, NumPy's allocator");
  bind_memory(memory);
  auto cuda = m.def_submodule("_cuda", "CUDA interop for loom.cuda (python/loom/cuda.py)");
  bind_cuda(cuda);
  auto onnx = m.def_submodule("_onnx", "ONNX import for loom.onnx (python/loom/onnx)");
  bind_onnx(onnx);
  auto dist = m.def_submodule("distributed", "Processes that train together: the world, communicators");
  bind_train(m, dist);
  auto amp = m.def_submodule("amp", "Automatic mixed precision: enable on a Graph, LossScaler");
  bind_amp(amp);
}

}  // namespace
}  // namespace loom::python

PYBIND11_MODULE(_loom, m) {
  loom::python::init_module(m);
}
