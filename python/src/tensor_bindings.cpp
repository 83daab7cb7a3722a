// loom.dtype, loom.Tensor, and zero-copy exchange with NumPy and PyTorch: DLPack both ways
// (Tensor.__dlpack__ / __dlpack_device__, loom.from_dlpack), the NumPy array interface
// (Tensor.__array_interface__), and the buffer protocol for NumPy arrays DLPack cannot
// carry (read-only ones).
//
// Note [capsules]
// A DLPack capsule is named "dltensor" (legacy) or "dltensor_versioned" (DLPack 1.x). The
// producer's capsule destructor calls the managed tensor's deleter only while the capsule
// still has that name; a consumer that takes the tensor renames the capsule to
// "used_dltensor" ("used_dltensor_versioned"), after which the deleter is the consumer's
// business. So a capsule nobody consumed frees its tensor when Python drops it, one that
// was consumed does not, and a consumer that fails leaves the name alone (the tensor is
// still the capsule's). A capsule can be consumed once: the used names are a BufferError.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>

#include "bindings.hpp"
#include "loom/core/error.hpp"
#include "loom/interop/dlpack.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/npy.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::python {
namespace {

constexpr const char* legacy_name = "dltensor";
constexpr const char* versioned_name = "dltensor_versioned";
constexpr const char* used_legacy_name = "used_dltensor";
constexpr const char* used_versioned_name = "used_dltensor_versioned";

// ---- dtypes ------------------------------------------------------------------------------

// NumPy's type string of a dtype ("<f4"); bfloat16 has none.
const char* numpy_typestr(dtype t) {
  if (const char* s = memory::numpy_typestr(t)) return s;
  throw unsupported_error("bfloat16 has no NumPy dtype (share it with PyTorch through DLPack)");
}

// The dtype of a buffer-protocol format string ("f", "<d", "=e", "?"), or nothing.
std::optional<dtype> dtype_of_format(std::string_view f, Py_ssize_t itemsize) {
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.remove_prefix(1);
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f':
      return dtype::f32;
    case 'd':
      return dtype::f64;
    case 'e':
      return dtype::f16;
    case 'b':
      return dtype::i8;
    case 'B':
      return dtype::u8;
    case '?':
      return dtype::boolean;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4) return dtype::i32;
      if (itemsize == 8) return dtype::i64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// A NumPy dtype for a loom dtype (for numpy.asarray conversions).
py::object numpy_dtype(dtype t) {
  return py::module_::import("numpy").attr("dtype")(numpy_typestr(t));
}

// ---- the buffer protocol ------------------------------------------------------------------

// The release of a buffer adopted from a Py_buffer: PyBuffer_Release under the GIL (the last
// reference may go on any thread, an executor's included).
void release_py_buffer(void* context, void*, std::size_t, std::size_t, stream) noexcept {
  auto* view = static_cast<Py_buffer*>(context);
  if (Py_IsInitialized() != 0) {
    const PyGILState_STATE state = PyGILState_Ensure();
    PyBuffer_Release(view);
    PyGILState_Release(state);
  }
  delete view;
}

// A tensor viewing a Python object's buffer, or an undefined tensor when the buffer's
// format or strides have no loom equivalent (the caller copies then).
tensor from_buffer(const py::handle& obj) {
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return {};
  }
  const auto fail = [&] {
    PyBuffer_Release(view.get());
    return tensor();
  };
  const auto t = dtype_of_format(view->format != nullptr ? view->format : "B", view->itemsize);
  if (!t || static_cast<std::size_t>(view->itemsize) != size_of(*t)) return fail();
  shape dims = shape::filled(static_cast<std::size_t>(view->ndim), 0);
  shape strides = shape::filled(static_cast<std::size_t>(view->ndim), 0);
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  bool empty = false;
  for (int i = 0; i < view->ndim; ++i) {
    const Py_ssize_t s = view->strides[i];
    if (s % view->itemsize != 0) return fail();  // strides between elements
    dims[static_cast<std::size_t>(i)] = view->shape[i];
    strides[static_cast<std::size_t>(i)] = s / view->itemsize;
    if (view->shape[i] == 0) empty = true;
    const std::int64_t span = (view->shape[i] - 1) * (s / view->itemsize);
    (span < 0 ? lo : hi) += span;
  }
  auto* start = static_cast<std::byte*>(view->buf) + (empty ? 0 : lo * view->itemsize);
  const std::size_t bytes = empty ? 0 : static_cast<std::size_t>((hi - lo + 1) * view->itemsize);
  const bool read_only = view->readonly != 0;
  Py_buffer* raw = view.release();
  buffer_ptr buf =
      buffer::adopt(start, bytes, static_cast<std::size_t>(raw->itemsize),
                    device_id{device_type::cpu, 0}, stream{}, &release_py_buffer, raw, read_only);
  return tensor::strided(std::move(buf), *t, std::move(dims), std::move(strides), empty ? 0 : -lo);
}

// A contiguous copy of t in the host's pool.
tensor host_copy(const tensor& t) {
  const device_id host{device_type::cpu, 0};
  return memory::contiguous_copy(t, memory::get_device_resource(host), host);
}

// ---- DLPack ------------------------------------------------------------------------------

void capsule_destructor(PyObject* capsule) {
  // Called with an exception possibly set: keep it.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, legacy_name) != 0) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, legacy_name));
    if (m->deleter != nullptr) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, versioned_name) != 0) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, versioned_name));
    if (m->deleter != nullptr) m->deleter(m);
  }
  PyErr_Restore(type, value, traceback);
}

// Tensor.__dlpack__ (Note [capsules]).
py::object to_capsule(const tensor& t, const py::object& stream, const py::object& max_version,
                      const py::object& dl_device, const py::object& copy) {
  if (!stream.is_none()) {
    throw_python(PyExc_BufferError,
                 fmt::format("loom tensors live on the CPU, which has no streams: stream must "
                             "be None, got {}",
                             py::str(py::repr(stream)).cast<std::string>()));
  }
  if (!dl_device.is_none()) {
    const auto dev = dl_device.cast<std::pair<int, int>>();
    if (dev.first != kDLCPU || dev.second != 0) {
      throw_python(PyExc_BufferError,
                   fmt::format("cannot export a CPU tensor to DLPack device ({}, {}); loom "
                               "exports to (1, 0), the CPU",
                               dev.first, dev.second));
    }
  }
  const bool make_copy = !copy.is_none() && copy.cast<bool>();
  const tensor src = make_copy ? host_copy(t) : t;
  bool versioned = false;
  if (!max_version.is_none()) {
    const auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= 1;
  }
  PyObject* capsule = nullptr;
  if (versioned) {
    DLManagedTensorVersioned* m =
        interop::to_dlpack_versioned(src, make_copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
    capsule = PyCapsule_New(m, versioned_name, &capsule_destructor);
    if (capsule == nullptr) m->deleter(m);
  } else {
    DLManagedTensor* m = interop::to_dlpack(src);
    capsule = PyCapsule_New(m, legacy_name, &capsule_destructor);
    if (capsule == nullptr) m->deleter(m);
  }
  if (capsule == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(capsule);
}

// Consumes a capsule (Note [capsules]).
tensor from_capsule(const py::handle& capsule) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr) throw py::error_already_set();
  const std::string_view n(name);
  if (n == used_legacy_name || n == used_versioned_name) {
    throw_python(PyExc_BufferError,
                 fmt::format("the DLPack capsule was already consumed (its name is '{}')", n));
  }
  if (n == legacy_name) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), legacy_name));
    tensor t = interop::from_dlpack(m);  // throws before taking m
    PyCapsule_SetName(capsule.ptr(), used_legacy_name);
    return t;
  }
  if (n == versioned_name) {
    auto* m =
        static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), versioned_name));
    tensor t = interop::from_dlpack(m);
    PyCapsule_SetName(capsule.ptr(), used_versioned_name);
    return t;
  }
  throw_python(PyExc_ValueError,
               fmt::format("a capsule named '{}' is not a DLPack tensor (expected '{}' or '{}')", n,
                           legacy_name, versioned_name));
}

// loom.from_dlpack(x): a capsule, or an object with __dlpack__ and __dlpack_device__.
tensor from_dlpack_object(const py::handle& x) {
  if (PyCapsule_CheckExact(x.ptr()) != 0) return from_capsule(x);
  if (!py::hasattr(x, "__dlpack__")) {
    throw_python(
        PyExc_TypeError,
        fmt::format("{} has no __dlpack__ method and is not a DLPack capsule", type_name(x)));
  }
  if (py::hasattr(x, "__dlpack_device__")) {
    const auto dev = x.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (dev.first != kDLCPU) {
      throw_python(PyExc_BufferError,
                   fmt::format("the tensor is on DLPack device ({}, {}); loom imports CPU "
                               "memory only (device type 1)",
                               dev.first, dev.second));
    }
  }
  // Ask for a versioned capsule; producers that predate DLPack 1.0 (NumPy 1.x, PyTorch 1.x)
  // take no max_version and give the legacy one.
  py::object capsule;
  try {
    capsule = x.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = x.attr("__dlpack__")();
  }
  return from_capsule(capsule);
}

// Tensor.__array_interface__ (version 3).
py::dict array_interface(const tensor& t) {
  static char empty_data = 0;  // NumPy wants a pointer even for no elements
  py::dict d;
  py::tuple dims(t.rank());
  py::tuple strides(t.rank());
  for (std::size_t i = 0; i < t.rank(); ++i) {
    dims[i] = t.dim(i);
    strides[i] = t.strides()[i] * static_cast<std::int64_t>(size_of(t.type()));
  }
  d["shape"] = dims;
  d["typestr"] = numpy_typestr(t.type());
  const void* data = t.defined() && t.num_elements() > 0 ? t.raw_data() : &empty_data;
  d["data"] =
      py::make_tuple(reinterpret_cast<std::uintptr_t>(data), t.defined() && t.buf()->read_only());
  d["strides"] = t.is_contiguous() ? py::object(py::none()) : py::object(strides);
  d["version"] = 3;
  return d;
}

}  // namespace

tensor to_tensor(const py::handle& obj, const std::string& what) {
  if (py::isinstance<tensor>(obj)) return obj.cast<tensor>();
  const py::module_ np = py::module_::import("numpy");
  if (py::isinstance(obj, np.attr("ndarray"))) {
    tensor t = from_buffer(obj);
    if (t.defined()) return t;
    // A dtype or layout the buffer protocol cannot give loom: a native, contiguous copy
    // when NumPy can make one of a loom dtype.
    py::object copy = np.attr("ascontiguousarray")(obj);
    if (copy.attr("dtype").attr("byteorder").cast<std::string>() == ">") {
      copy = copy.attr("astype")(copy.attr("dtype").attr("newbyteorder")("<"));
    }
    t = from_buffer(copy);
    if (t.defined()) return t;
    throw_python(PyExc_TypeError,
                 fmt::format("{}: NumPy dtype {} has no loom dtype (loom has float16/32/64, "
                             "bfloat16, int8/32/64, uint8 and bool)",
                             what, py::str(obj.attr("dtype")).cast<std::string>()));
  }
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack_object(obj);
  py::object array;
  try {
    array = np.attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    throw_python(PyExc_TypeError, fmt::format("{}: cannot make a tensor of a {}: {}", what,
                                              type_name(obj), e.what()));
  }
  if (array.attr("dtype").attr("kind").cast<std::string>() == "O") {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: cannot make a tensor of a {}", what, type_name(obj)));
  }
  return to_tensor(array, what);
}

py::object from_tensor(tensor t) {
  return py::cast(std::move(t));
}

void bind_tensor(py::module_& m) {
  py::enum_<dtype>(m, "dtype", "An element type")
      .value("float32", dtype::f32)
      .value("float64", dtype::f64)
      .value("float16", dtype::f16)
      .value("bfloat16", dtype::bf16)
      .value("int32", dtype::i32)
      .value("int64", dtype::i64)
      .value("int8", dtype::i8)
      .value("uint8", dtype::u8)
      .value("bool", dtype::boolean)
      .def_property_readonly("itemsize", [](dtype t) { return size_of(t); });

  py::class_<tensor>(m, "Tensor",
                     "A view of device memory: dtype, shape, strides (in elements), device")
      .def(py::init([](const py::object& data, std::optional<dtype> type) {
             // A copy, as numpy.array and torch.tensor make: the new tensor owns its memory.
             const py::module_ np = py::module_::import("numpy");
             py::object array =
                 type ? np.attr("asarray")(data, numpy_dtype(*type)) : np.attr("asarray")(data);
             const tensor view = to_tensor(array, "Tensor(data)");
             return host_copy(view);
           }),
           py::arg("data"), py::arg("dtype") = py::none(),
           "A tensor holding a copy of `data` (anything numpy.asarray takes)")
      .def_property_readonly("shape",
                             [](const tensor& t) {
                               py::tuple s(t.rank());
                               for (std::size_t i = 0; i < t.rank(); ++i) s[i] = t.dim(i);
                               return s;
                             })
      .def_property_readonly(
          "strides",
          [](const tensor& t) {
            py::tuple s(t.rank());
            for (std::size_t i = 0; i < t.rank(); ++i) s[i] = t.strides()[i];
            return s;
          },
          "Strides in elements")
      .def_property_readonly("dtype", &tensor::type)
      .def_property_readonly("ndim", &tensor::rank)
      .def_property_readonly("size", &tensor::num_elements)
      .def_property_readonly("nbytes", &tensor::nbytes)
      .def_property_readonly("device", [](const tensor& t) { return to_string(t.device()); })
      .def_property_readonly("is_contiguous", &tensor::is_contiguous)
      .def_property_readonly("readonly",
                             [](const tensor& t) { return t.defined() && t.buf()->read_only(); })
      .def_property_readonly(
          "data_ptr",
          [](const tensor& t) {
            return reinterpret_cast<std::uintptr_t>(t.defined() ? t.raw_data() : nullptr);
          })
      .def("__len__",
           [](const tensor& t) {
             if (t.rank() == 0) throw_python(PyExc_TypeError, "len() of a 0-d tensor");
             return t.dim(0);
           })
      .def("__repr__", [](const tensor& t) { return fmt::format("loom.Tensor({})", t.describe()); })
      .def_property_readonly("__array_interface__", &array_interface)
      .def(
          "numpy",
          [](const py::object& self) { return py::module_::import("numpy").attr("asarray")(self); },
          "A NumPy array sharing this tensor's memory (it keeps the tensor alive)")
      .def("__dlpack__", &to_capsule, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule of this tensor: 'dltensor_versioned' when max_version >= (1, 0), "
           "else 'dltensor'. Zero copy unless copy=True.")
      .def("__dlpack_device__",
           [](const tensor&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });

  m.def("from_dlpack", &from_dlpack_object, py::arg("x"),
        "A loom tensor sharing x's memory: x is a DLPack capsule or has __dlpack__ (NumPy, "
        "PyTorch); the producer's deleter runs when loom lets go");
  m.def(
      "from_numpy",
      [](const py::object& array) {
        if (!py::isinstance(array, py::module_::import("numpy").attr("ndarray"))) {
          throw_python(PyExc_TypeError,
                       fmt::format("from_numpy takes a numpy.ndarray, not a {}", type_name(array)));
        }
        tensor t = from_buffer(array);
        if (!t.defined()) {
          throw_python(PyExc_TypeError,
                       fmt::format("from_numpy: NumPy dtype {} (strides {}) cannot be shared with "
                                   "loom without a copy",
                                   py::str(array.attr("dtype")).cast<std::string>(),
                                   py::str(array.attr("strides")).cast<std::string>()));
        }
        return t;
      },
      py::arg("array"),
      "A loom tensor sharing a NumPy array's memory (read-only arrays give read-only tensors)");
  m.def(
      "as_tensor", [](const py::object& obj) { return to_tensor(obj, "as_tensor"); },
      py::arg("obj"),
      "A loom tensor of obj without a copy where one is possible (loom.Tensor, NumPy, DLPack), "
      "else of numpy.asarray(obj)");
}

}  // namespace loom::python
