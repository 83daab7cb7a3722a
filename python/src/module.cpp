// loom._loom: the extension behind the `loom` Python package. Errors become the Python
// exceptions NumPy users expect: invalid arguments ValueError, unsupported dtypes and
// devices TypeError, unknown names KeyError, out of memory MemoryError, a failed node
// loom.NodeError (a RuntimeError), a cancelled run loom.CancelledError.
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
  bind_tensor(m);
  bind_graph(m);
  bind_session(m);
  bind_arrow(m);
  auto memory = m.def_submodule("memory", "Memory statistics, loans, NumPy's allocator");
  bind_memory(memory);
  auto cuda = m.def_submodule("_cuda", "CUDA interop for loom.cuda (python/loom/cuda.py)");
  bind_cuda(cuda);
}

}  // namespace
}  // namespace loom::python

PYBIND11_MODULE(_loom, m) {
  loom::python::init_module(m);
}
