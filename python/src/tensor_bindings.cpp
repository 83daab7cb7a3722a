// loom.dtype, loom.Tensor, and zero-copy exchange with NumPy, PyTorch, CuPy and Numba: DLPack
// both ways with the stream handshake for GPU memory (Tensor.__dlpack__ / __dlpack_device__,
// loom.from_dlpack), the NumPy array interface (Tensor.__array_interface__), the CUDA array
// interface both ways (Tensor.__cuda_array_interface__, loom.from_cuda_array_interface), and
// the buffer protocol for NumPy arrays DLPack cannot carry (read-only ones).
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

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "loom/core/device_id.hpp"
#include "loom/core/error.hpp"
#include "loom/cuda/interop.hpp"
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
  (void)call_with_gil([](void* v) { PyBuffer_Release(static_cast<Py_buffer*>(v)); }, view);
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
  // loom reads elements in place: misaligned data (a view at an odd byte offset) is copied.
  if (!empty &&
      reinterpret_cast<std::uintptr_t>(start) % static_cast<std::uintptr_t>(view->itemsize) != 0) {
    return fail();
  }
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

// The DLPack device of a tensor: (type code, index).
std::pair<int, int> dlpack_device_of(const tensor& t) {
  const device_id d = t.defined() ? t.device() : device_id{device_type::cpu, 0};
  return {static_cast<int>(d.type), d.index};
}

// A (a, b) tuple of ints that fit an int (a DLPack device, a version), or a TypeError
// naming `what` and the expected `form`.
std::pair<int, int> int_pair_of(const py::handle& obj, const char* what, const char* form) {
  if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 2) {
    throw_python(PyExc_TypeError, fmt::format("{} must be a {} tuple, not {}", what, form,
                                              py::repr(obj).cast<std::string>()));
  }
  const auto t = obj.cast<py::tuple>();
  int out[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t v = int64_of(t[i], what);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      throw_python(PyExc_OverflowError, fmt::format("{}: {} is out of range", what, v));
    }
    out[i] = static_cast<int>(v);
  }
  return {out[0], out[1]};
}

// Tensor.__dlpack__ (Notes [capsules] and [cuda imports]).
py::object to_capsule(const tensor& t, const py::object& stream, const py::object& max_version,
                      const py::object& dl_device, const py::object& copy) {
  const std::pair<int, int> own = dlpack_device_of(t);
  const bool on_host = is_host_accessible(static_cast<device_type>(own.first));
  std::optional<std::int64_t> stream_number;
  if (!stream.is_none()) {
    if (!py::isinstance<py::int_>(stream)) {
      throw_python(PyExc_TypeError, fmt::format("__dlpack__: stream must be None or an int, "
                                                "not a {}",
                                                type_name(stream)));
    }
    stream_number = int64_of(stream, "__dlpack__: stream");
  }
  if (!dl_device.is_none()) {
    const auto dev = int_pair_of(dl_device, "__dlpack__: dl_device", "(device_type, device_id)");
    if (dev != own) {
      throw_python(
          PyExc_BufferError,
          fmt::format("cannot export a tensor on {} to DLPack device ({}, {}); loom "
                      "exports it to ({}, {}) only",
                      to_string(t.device()), dev.first, dev.second, own.first, own.second));
    }
  }
  if (!copy.is_none() && !py::isinstance<py::bool_>(copy)) {
    throw_python(
        PyExc_TypeError,
        fmt::format("__dlpack__: copy must be None, True or False, not a {}", type_name(copy)));
  }
  const bool make_copy = !copy.is_none() && copy.cast<bool>();
  if (make_copy && !on_host) {
    throw_python(PyExc_BufferError,
                 fmt::format("__dlpack__(copy=True): loom copies host memory only; the tensor "
                             "is on {}",
                             to_string(t.device())));
  }
  try {
    // The handshake: the consumer's stream waits for loom's work (may wait on the host).
    const without_gil release;
    interop::prepare_export(t, stream_number);
  } catch (const unsupported_error&) {
    throw;  // a build without CUDA: TypeError
  } catch (const invalid_argument& e) {
    throw_python(PyExc_BufferError, fmt::format("__dlpack__: {}", e.what()));
  }
  const tensor src = make_copy ? host_copy(t) : t;
  bool versioned = false;
  if (!max_version.is_none()) {
    const auto v = int_pair_of(max_version, "__dlpack__: max_version", "(major, minor)");
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

// Consumes a capsule (Note [capsules]); GPU memory in it is ordered on `s`. `origin` names
// where the capsule came from in errors ("the capsule", "the capsule ndarray.__dlpack__()
// returned"). Anything but an unconsumed DLPack tensor that loom can take is a
// BufferError (NumPy's from_dlpack says the same), and leaves the capsule as it was.
tensor from_capsule(const py::handle& capsule, stream s, const std::string& origin) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
  const std::string_view n(name != nullptr ? name : "");
  if (n == used_legacy_name || n == used_versioned_name) {
    throw_python(PyExc_BufferError,
                 fmt::format("from_dlpack: {} was already consumed (its name is '{}'); a DLPack "
                             "capsule can be consumed once",
                             origin, n));
  }
  if (n != legacy_name && n != versioned_name) {
    throw_python(PyExc_BufferError,
                 fmt::format("from_dlpack: {} is {}, not a DLPack tensor (expected '{}' or '{}')",
                             origin, name != nullptr ? fmt::format("named '{}'", n) : "unnamed",
                             legacy_name, versioned_name));
  }
  void* pointer = PyCapsule_GetPointer(capsule.ptr(), name);
  if (pointer == nullptr) throw py::error_already_set();
  tensor t;
  try {
    // interop::from_dlpack checks the managed tensor (one rule for every importer) and
    // throws before taking it.
    t = n == legacy_name ? interop::from_dlpack(static_cast<DLManagedTensor*>(pointer), s)
                         : interop::from_dlpack(static_cast<DLManagedTensorVersioned*>(pointer), s);
  } catch (const invalid_argument& e) {  // unsupported_error too
    throw_python(PyExc_BufferError, fmt::format("{} (in {})", e.what(), origin));
  }
  PyCapsule_SetName(capsule.ptr(), n == legacy_name ? used_legacy_name : used_versioned_name);
  return t;
}

// A stream argument of loom's importers: None, or an int other than 0 and below -1.
std::optional<std::int64_t> stream_argument(const py::object& stream, const char* what) {
  if (stream.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(stream)) {
    throw_python(PyExc_TypeError, fmt::format("{}: stream must be None or an int, not a {}", what,
                                              type_name(stream)));
  }
  const auto n = int64_of(stream, fmt::format("{}: stream", what));
  if (n <= 0) {
    throw_python(PyExc_ValueError,
                 fmt::format("{}: stream {} is no CUDA stream (1: the legacy default stream, 2: "
                             "the per-thread default stream, else a cudaStream_t)",
                             what, n));
  }
  return n;
}

// loom.from_dlpack(x, stream=None): a capsule, or an object with __dlpack__ and
// __dlpack_device__. For memory on a GPU, loom is the consumer of the stream handshake
// (Note [interop streams]): the producer orders its work before `stream` when one is given
// (the import's buffer records it), else before loom's interop stream, which the host then
// waits for, so the memory is ready for any stream when the import returns.
// Raises a BufferError for an exception a producer's DLPack method raised (`call`:
// "ndarray.__dlpack__()"), chained to it. BaseExceptions that are no Exception
// (KeyboardInterrupt, SystemExit) and MemoryError go through as they are.
[[noreturn]] void producer_failed(py::error_already_set& e, const std::string& call) {
  if (!e.matches(PyExc_Exception) || e.matches(PyExc_MemoryError)) throw;
  const std::string message = fmt::format("from_dlpack: {} raised {}: {}", call,
                                          py::str(e.type().attr("__name__")).cast<std::string>(),
                                          py::str(e.value()).cast<std::string>());
  py::raise_from(e, PyExc_BufferError, message.c_str());
  throw py::error_already_set();
}

// The DLPack device of a producer, by __dlpack_device__ (the CPU when it has none, as
// producers before the method had only host memory): a (device_type, device_id) tuple of ints
// naming a device loom imports from.
std::pair<int, int> producer_device(const py::handle& x) {
  if (!py::hasattr(x, "__dlpack_device__")) return {kDLCPU, 0};
  const std::string call = type_name(x) + ".__dlpack_device__()";
  py::object r;
  try {
    r = x.attr("__dlpack_device__")();
  } catch (py::error_already_set& e) {
    producer_failed(e, call);
  }
  if (!py::isinstance<py::tuple>(r)) {
    throw_python(PyExc_TypeError,
                 fmt::format("from_dlpack: {} returned a {}, not a (device_type, device_id) tuple",
                             call, type_name(r)));
  }
  const auto tuple = r.cast<py::tuple>();
  if (tuple.size() != 2) {
    throw_python(PyExc_TypeError,
                 fmt::format("from_dlpack: {} returned a tuple of {} items, not (device_type, "
                             "device_id)",
                             call, tuple.size()));
  }
  const std::string returned = fmt::format("{} returned {}", call, py::repr(r).cast<std::string>());
  std::int64_t values[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    const char* field = i == 0 ? "device_type" : "device_id";
    if (PyLong_Check(tuple[i].ptr()) == 0) {
      throw_python(PyExc_TypeError, fmt::format("from_dlpack: {}: its {} is a {}, not an int",
                                                returned, field, type_name(tuple[i])));
    }
    int overflow = 0;
    values[i] = PyLong_AsLongLongAndOverflow(tuple[i].ptr(), &overflow);
    if (overflow != 0 || values[i] < std::numeric_limits<std::int32_t>::min() ||
        values[i] > std::numeric_limits<std::int32_t>::max()) {
      throw_python(PyExc_BufferError,
                   fmt::format("from_dlpack: {}: its {} is out of range", returned, field));
    }
  }
  const auto code = static_cast<std::int32_t>(values[0]);
  const auto id = static_cast<std::int32_t>(values[1]);
  if (!is_valid_device_type(code)) {
    throw_python(PyExc_BufferError,
                 fmt::format("from_dlpack: {}: {} is no DLPack device type", returned, code));
  }
  if (code != kDLCPU && code != kDLCUDA && code != kDLCUDAHost && code != kDLCUDAManaged) {
    throw_python(PyExc_BufferError,
                 fmt::format("from_dlpack: {}: the tensor is on {}; loom imports CPU (1), CUDA "
                             "(2), CUDA host (3) and CUDA managed (13) memory",
                             returned, to_string(static_cast<device_type>(code))));
  }
  if (id < 0) {
    throw_python(PyExc_BufferError, fmt::format("from_dlpack: {}: a negative device id", returned));
  }
  return {code, id};
}

// Calls x.__dlpack__: asks for a versioned capsule and falls back to the legacy call for
// producers that predate DLPack 1.0 (NumPy 1.x, PyTorch 1.x take no max_version). `stream`
// is passed when not None (memory on a GPU).
py::object call_dlpack(const py::handle& x, const py::object& stream) {
  const std::string call = type_name(x) + ".__dlpack__()";
  const py::object method = x.attr("__dlpack__");
  py::object capsule;
  try {
    capsule = stream.is_none() ? method(py::arg("max_version") = py::make_tuple(1, 0))
                               : method(py::arg("stream") = stream,
                                        py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) producer_failed(e, call);
    const std::string first = py::str(e.value()).cast<std::string>();
    try {
      capsule = stream.is_none() ? method() : method(py::arg("stream") = stream);
    } catch (py::error_already_set& again) {
      if (!again.matches(PyExc_TypeError)) producer_failed(again, call);
      const std::string message = fmt::format(
          "from_dlpack: {} raised TypeError with max_version=(1, 0) ({}) and without it ({}); "
          "the protocol's __dlpack__ takes {}",
          call, first, py::str(again.value()).cast<std::string>(),
          stream.is_none() ? "max_version=, or no argument (a legacy producer)"
                           : "stream= and max_version=, or stream= alone (a legacy producer)");
      py::raise_from(again, PyExc_TypeError, message.c_str());
      throw py::error_already_set();
    }
  }
  if (PyCapsule_CheckExact(capsule.ptr()) == 0) {
    throw_python(PyExc_TypeError, fmt::format("from_dlpack: {} returned a {}, not a DLPack capsule",
                                              call, type_name(capsule)));
  }
  return capsule;
}

tensor from_dlpack_object(const py::handle& x, const py::object& stream) {
  const std::optional<std::int64_t> wanted = stream_argument(stream, "from_dlpack");
  if (PyCapsule_CheckExact(x.ptr()) != 0) {
    return from_capsule(x, wanted ? interop::stream_from_protocol(*wanted) : loom::stream{},
                        "the capsule");
  }
  if (!py::hasattr(x, "__dlpack__")) {
    throw_python(
        PyExc_TypeError,
        fmt::format("{} has no __dlpack__ method and is not a DLPack capsule", type_name(x)));
  }
  const std::pair<int, int> dev = producer_device(x);
  const bool streams = dev.first == kDLCUDA || dev.first == kDLCUDAManaged;
  std::optional<std::int64_t> consumer;  // the stream the producer orders its work before
  if (streams) {
    consumer = wanted ? *wanted
                      : interop::protocol_stream_number(interop::cuda_interop_stream(dev.second));
  }
  const py::object capsule =
      call_dlpack(x, consumer ? py::object(py::int_(*consumer)) : py::object(py::none()));
  const std::string origin = fmt::format("the capsule {}.__dlpack__() returned", type_name(x));
  if (streams && !wanted) {
    tensor t = from_capsule(capsule, {}, origin);  // ready for any stream once the host has waited
    const without_gil release;
    interop::cuda_stream_synchronize(dev.second, interop::stream_from_protocol(*consumer));
    return t;
  }
  return from_capsule(capsule, consumer ? interop::stream_from_protocol(*consumer) : loom::stream{},
                      origin);
}

tensor from_dlpack_object(const py::handle& x) {
  return from_dlpack_object(x, py::none());
}

// ---- the CUDA array interface -------------------------------------------------------------

// Tensor.__cuda_array_interface__ (version 3), for tensors in GPU memory; AttributeError
// otherwise, so that hasattr() tells consumers to look elsewhere. "stream" is the stream
// loom's work on the memory is ordered on (Note [interop streams]); a buffer that names none
// is made ready for every stream first (the host waits for the device), and "stream" is None.
py::dict cuda_array_interface(const tensor& t) {
  const device_id d = t.defined() ? t.device() : device_id{device_type::cpu, 0};
  if (d.type != device_type::cuda && d.type != device_type::cuda_managed) {
    throw py::attribute_error(
        fmt::format("__cuda_array_interface__: the tensor is in {} memory, not on a GPU (use "
                    "__array_interface__ or DLPack)",
                    to_string(d)));
  }
  const char* typestr = memory::numpy_typestr(t.type());
  if (typestr == nullptr) {
    throw py::attribute_error(
        "__cuda_array_interface__: bfloat16 has no typestr (share it through DLPack)");
  }
  py::dict out;
  py::tuple dims(t.rank());
  py::tuple strides(t.rank());
  for (std::size_t i = 0; i < t.rank(); ++i) {
    dims[i] = t.dim(i);
    strides[i] = t.strides()[i] * static_cast<std::int64_t>(size_of(t.type()));
  }
  out["shape"] = dims;
  out["typestr"] = typestr;
  // An empty tensor's pointer is 0, as the specification asks.
  const auto address =
      t.num_elements() > 0 ? reinterpret_cast<std::uintptr_t>(t.raw_data()) : std::uintptr_t{0};
  out["data"] = py::make_tuple(address, t.buf()->read_only());
  out["strides"] = t.is_contiguous() ? py::object(py::none()) : py::object(strides);
  out["version"] = 3;
  const loom::stream s = t.buf()->stream_of();
  if (s.is_default()) {
    {
      const without_gil release;
      interop::cuda_stream_synchronize(d.index, s);
    }
    out["stream"] = py::none();
  } else {
    out["stream"] = interop::protocol_stream_number(s);
  }
  return out;
}

// The dtype of a CUDA array interface typestr ("<f4", "|u1", "|b1").
dtype dtype_of_typestr(const std::string& typestr) {
  const auto fail = [&](const char* why) -> dtype {
    throw_python(PyExc_TypeError,
                 fmt::format("from_cuda_array_interface: typestr '{}' {} (loom has float16/32/64, "
                             "int8/32/64, uint8 and bool)",
                             typestr, why));
  };
  if (typestr.size() < 3) return fail("is not a typestr");
  if (typestr[0] == '>') return fail("is big-endian");
  if (typestr[0] != '<' && typestr[0] != '|' && typestr[0] != '=') return fail("is not a typestr");
  const std::string_view kind(typestr.data() + 1, typestr.size() - 1);
  if (kind == "f2") return dtype::f16;
  if (kind == "f4") return dtype::f32;
  if (kind == "f8") return dtype::f64;
  if (kind == "i1") return dtype::i8;
  if (kind == "i4") return dtype::i32;
  if (kind == "i8") return dtype::i64;
  if (kind == "u1") return dtype::u8;
  if (kind == "b1") return dtype::boolean;
  return fail("has no loom dtype");
}

// The release of a buffer over another object's GPU memory: drops the reference that keeps
// the object (and so its memory) alive, under the GIL, on whichever thread lets go last.
void release_py_object(void* context, void*, std::size_t, std::size_t, loom::stream) noexcept {
  (void)call_with_gil([](void* obj) { Py_DECREF(static_cast<PyObject*>(obj)); }, context);
}

// Note [array interface checks]
// What an object's __array_interface__ (version 3) or __cuda_array_interface__ (versions 0 to
// 3) says, checked before anything reads memory: a dict, with "shape" (a tuple of ints >= 0),
// "typestr" (a str), "version", "data" ((pointer, read_only); for __array_interface__ it may
// be None or absent, meaning the object's own buffer), "strides" (None or one int per
// dimension), "mask" None, and for CUDA version 3 "stream" (None or an int). Wrong kinds of
// values are a TypeError, wrong values (a missing key, a negative dimension, a null pointer
// for elements, a version loom does not read) a ValueError, as NumPy's own reading says; the
// message names the attribute, the key and what it held. NumPy builds the host array after
// these checks (it reads the same dict), loom the CUDA view.
struct interface_fields {
  std::int64_t version = 0;
  std::string typestr;
  std::vector<std::int64_t> dims;
  std::vector<std::int64_t> byte_strides;  // empty: C-contiguous
  std::int64_t count = 1;
  bool has_pointer = false;  // else the object's buffer (host only)
  std::uintptr_t address = 0;
  bool read_only = false;
  std::optional<std::int64_t> stream;  // CUDA version 3
};

interface_fields read_interface(const py::handle& obj, bool cuda, const std::string& what) {
  const char* attr = cuda ? "__cuda_array_interface__" : "__array_interface__";
  const std::string where = fmt::format("{}: {}.{}", what, type_name(obj), attr);
  const py::object iface = obj.attr(attr);
  if (!py::isinstance<py::dict>(iface)) {
    throw_python(PyExc_TypeError, fmt::format("{} is a {}, not a dict", where, type_name(iface)));
  }
  const auto d = iface.cast<py::dict>();
  const auto bad_value = [&](const std::string& why) -> void {
    throw_python(PyExc_ValueError, fmt::format("{}: {}", where, why));
  };
  const auto bad_type = [&](const char* key, const char* expected, const py::handle& v) -> void {
    throw_python(PyExc_TypeError, fmt::format("{}: '{}' is {}, not {}", where, key,
                                              py::repr(v).cast<std::string>(), expected));
  };
  const auto integer = [&](const char* key, const py::handle& v) -> std::int64_t {
    if (PyLong_Check(v.ptr()) == 0 || PyBool_Check(v.ptr()) != 0) bad_type(key, "an int", v);
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) {
      bad_value(fmt::format("'{}' holds {}, past the 64-bit range", key, describe_int(v)));
    }
    return n;
  };
  const auto ints = [&](const char* key, const py::handle& v) -> std::vector<std::int64_t> {
    if (!py::isinstance<py::tuple>(v) && !py::isinstance<py::list>(v)) {
      bad_type(key, "a tuple of ints", v);
    }
    std::vector<std::int64_t> out;
    for (const py::handle e : v) {
      if (PyLong_Check(e.ptr()) == 0 || PyBool_Check(e.ptr()) != 0) {
        bad_type(key, "a tuple of ints", v);
      }
      out.push_back(integer(key, e));
    }
    return out;
  };
  for (const char* key : {"shape", "typestr", "version"}) {
    if (!d.contains(key)) bad_value(fmt::format("the interface has no '{}'", key));
  }
  if (cuda && !d.contains("data")) bad_value("the interface has no 'data'");
  interface_fields f;
  f.version = integer("version", d["version"]);
  if (cuda ? (f.version < 0 || f.version > 3) : f.version != 3) {
    bad_value(fmt::format("version {} (loom reads {})", f.version,
                          cuda ? "versions 0 to 3" : "version 3"));
  }
  if (!py::isinstance<py::str>(d["typestr"])) bad_type("typestr", "a str", d["typestr"]);
  f.typestr = d["typestr"].cast<std::string>();
  f.dims = ints("shape", d["shape"]);
  if (f.dims.size() > static_cast<std::size_t>(interop::max_import_rank)) {
    bad_value(fmt::format("{} dimensions (loom takes at most {})", f.dims.size(),
                          interop::max_import_rank));
  }
  for (std::size_t i = 0; i < f.dims.size(); ++i) {
    if (f.dims[i] < 0) bad_value(fmt::format("dimension {} is {} (in 'shape')", i, f.dims[i]));
    if (__builtin_mul_overflow(f.count, f.dims[i], &f.count)) {
      bad_value("the element count of 'shape' overflows");
    }
  }
  if (d.contains("strides") && !d["strides"].is_none()) {
    f.byte_strides = ints("strides", d["strides"]);
    if (f.byte_strides.size() != f.dims.size()) {
      bad_value(fmt::format("{} strides for {} dimensions", f.byte_strides.size(), f.dims.size()));
    }
  }
  if (d.contains("mask") && !d["mask"].is_none()) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: masked arrays are not supported (mask is not None)", where));
  }
  const py::object data = d.contains("data") ? py::object(d["data"]) : py::object(py::none());
  if (py::isinstance<py::tuple>(data)) {
    if (py::len(data) != 2) bad_type("data", "a (pointer, read_only) tuple", data);
    const py::handle pointer = data.cast<py::tuple>()[0];
    const py::handle flag = data.cast<py::tuple>()[1];
    if (PyLong_Check(pointer.ptr()) == 0 || PyBool_Check(pointer.ptr()) != 0) {
      bad_type("data", "a (pointer, read_only) tuple with an int pointer", data);
    }
    const unsigned long long a = PyLong_AsUnsignedLongLong(pointer.ptr());
    if (a == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      bad_value(fmt::format("'data' holds {} as its pointer, which is no address",
                            describe_int(pointer)));
    }
    if (PyBool_Check(flag.ptr()) == 0 && PyLong_Check(flag.ptr()) == 0) {
      bad_type("data", "a (pointer, read_only) tuple with a bool read_only", data);
    }
    f.has_pointer = true;
    f.address = static_cast<std::uintptr_t>(a);
    f.read_only = PyObject_IsTrue(flag.ptr()) == 1;
    if (f.address == 0 && f.count != 0) {
      bad_value(fmt::format("a null pointer in 'data' for {} elements", f.count));
    }
  } else if (cuda) {
    bad_type("data", "a (pointer, read_only) tuple", data);
  } else if (data.is_none() ? PyObject_CheckBuffer(obj.ptr()) == 0
                            : PyObject_CheckBuffer(data.ptr()) == 0) {
    // The specification's other forms: None reads the object's own buffer, an object its
    // buffer.
    if (data.is_none()) {
      bad_value(
          fmt::format("'data' is None (the object's own buffer) but a {} has no buffer, "
                      "so {} element{} have no memory",
                      type_name(obj), f.count, f.count == 1 ? "" : "s"));
    }
    bad_type("data", "a (pointer, read_only) tuple, None or an object with a buffer", data);
  }
  if (cuda && f.version >= 3 && d.contains("stream") && !d["stream"].is_none()) {
    f.stream = integer("stream", d["stream"]);
  }
  return f;
}

// An object's __array_interface__, checked (Note [array interface checks]) before NumPy reads
// it.
void check_array_interface(const py::handle& obj, const std::string& what) {
  (void)read_interface(obj, false, what);
}

// loom.from_cuda_array_interface(obj, stream=None): a tensor viewing obj's GPU memory (no
// copy), keeping obj alive. Everything is checked before any CUDA call (Note [array
// interface checks]). A producer "stream" is waited for as from_dlpack waits (Note [interop
// streams]).
tensor from_cuda_array_interface(const py::handle& obj, const py::object& stream) {
  const std::optional<std::int64_t> wanted = stream_argument(stream, "from_cuda_array_interface");
  if (!py::hasattr(obj, "__cuda_array_interface__")) {
    throw_python(PyExc_TypeError, fmt::format("from_cuda_array_interface: a {} has no "
                                              "__cuda_array_interface__",
                                              type_name(obj)));
  }
  const interface_fields f = read_interface(obj, true, "from_cuda_array_interface");
  const auto bad = [](const std::string& why) -> void {
    throw_python(PyExc_ValueError, "from_cuda_array_interface: " + why);
  };
  const dtype t = dtype_of_typestr(f.typestr);
  const auto esize = static_cast<std::int64_t>(size_of(t));
  const std::size_t rank = f.dims.size();
  shape dims(f.dims);
  shape strides = shape::filled(rank, 0);
  const std::int64_t count = f.count;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::int64_t next = 1;
  for (std::size_t i = rank; i-- > 0;) {
    std::int64_t s = next;
    if (!f.byte_strides.empty()) {
      if (f.byte_strides[i] % esize != 0) {
        bad(fmt::format("stride {} of dimension {} is not a multiple of the item size {}",
                        f.byte_strides[i], i, esize));
      }
      s = f.byte_strides[i] / esize;
    }
    strides[i] = s;
    next *= std::max<std::int64_t>(dims[i], 1);
    if (dims[i] == 0) continue;
    std::int64_t span = 0;
    std::int64_t& end = s < 0 ? lo : hi;
    if (__builtin_mul_overflow(dims[i] - 1, s, &span) || __builtin_add_overflow(end, span, &end)) {
      bad(fmt::format("stride {} of dimension {} reaches past the 64-bit range", s, i));
    }
  }
  std::int64_t elements = 0;
  std::int64_t extent = 0;
  if (count != 0 && (__builtin_sub_overflow(hi, lo, &elements) ||
                     __builtin_add_overflow(elements, 1, &elements) ||
                     __builtin_mul_overflow(elements, esize, &extent))) {
    bad("the strides span more bytes than fit in 64 bits");
  }
  const std::uintptr_t address = f.address;
  const bool read_only = f.read_only;
  if (count != 0) {
    std::uintptr_t first = 0;
    std::uintptr_t last = 0;
    if (__builtin_sub_overflow(
            address, static_cast<std::uintptr_t>(-lo) * static_cast<std::uintptr_t>(esize),
            &first) ||
        __builtin_add_overflow(first, static_cast<std::uintptr_t>(extent), &last)) {
      bad(fmt::format("the pointer 0x{:x} with these strides wraps around the address space",
                      address));
    }
    if (first % static_cast<std::uintptr_t>(esize) != 0) {
      bad(fmt::format("the pointer 0x{:x} is not aligned to the {}-byte elements", address, esize));
    }
  }
  std::optional<std::int64_t> producer;
  if (f.stream) {
    const std::int64_t n = *f.stream;
    if (n == 0) bad("stream 0 is disallowed by version 3 (ambiguous)");
    if (n < 0) bad(fmt::format("stream {} is no CUDA stream", n));
    producer = n;
  }
  // CUDA from here on: where the memory is, and the producer's stream.
  device_id dev{device_type::cuda, 0};
  {
    const without_gil release;
    dev = address != 0 ? interop::cuda_pointer_device(reinterpret_cast<const void*>(address))
                       : device_id{device_type::cuda, interop::cuda_current_device()};
  }
  if (dev.type == device_type::cpu) {
    bad(fmt::format("the pointer 0x{:x} is host memory CUDA does not know, not GPU memory",
                    address));
  }
  loom::stream ordered{};
  if (producer && dev.type != device_type::cuda_host) {
    const without_gil release;
    const loom::stream theirs = interop::stream_from_protocol(*producer);
    if (wanted) {
      ordered = interop::stream_from_protocol(*wanted);
      interop::cuda_stream_wait(dev.index, ordered, theirs);
    } else {
      interop::cuda_stream_synchronize(dev.index, theirs);
    }
  }
  auto* start = reinterpret_cast<std::byte*>(address) + (count == 0 ? 0 : lo * esize);
  const std::size_t bytes = count == 0 ? 0 : static_cast<std::size_t>((hi - lo + 1) * esize);
  const auto start_address = reinterpret_cast<std::uintptr_t>(start);
  const std::size_t alignment =
      start_address == 0
          ? 256
          : std::min<std::size_t>(std::size_t{1} << std::countr_zero(start_address), 256);
  Py_INCREF(obj.ptr());
  buffer_ptr buf = buffer::adopt(start, bytes, alignment, dev, ordered, &release_py_object,
                                 obj.ptr(), read_only);
  return tensor::strided(std::move(buf), t, std::move(dims), std::move(strides),
                         count == 0 ? 0 : -lo);
}

// Tensor.__array_interface__ (version 3).
py::dict array_interface(const tensor& t) {
  static char empty_data = 0;  // NumPy wants a pointer even for no elements
  if (t.defined() && !is_host_accessible(t.device().type)) {
    // NumPy would read a device address from the host.
    throw py::type_error(fmt::format(
        "__array_interface__: the tensor is on {}, which the host cannot read; copy it with "
        "Session.host_value(t), or share it with DLPack or __cuda_array_interface__",
        to_string(t.device())));
  }
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

// ---- Python values of a dtype --------------------------------------------------------------

// Note [Python values of a dtype]
// A feed, a constant or loom.Tensor(data, dtype) given Python numbers, or nested lists and
// tuples of them, makes a tensor of the placeholder's (or the given) dtype by NumPy 2's rules
// for numpy.array(v, dtype=...), read without NumPy so that NumPy 1 and 2 give the same:
// - a Python int (or NumPy integer) must fit an integer dtype: 300 into uint8, -1 into an
//   unsigned dtype, 2**40 into int32 or 2**64 into int64 is an OverflowError naming the
//   value, the dtype and its range (NumPy 1 wrapped them silently);
// - a float into an integer dtype is truncated toward zero as NumPy does (1.7 -> 1), when
//   that fits; a float out of range (inf included) is an OverflowError, NaN a ValueError
//   (Python's int() says the same; NumPy would give an arbitrary integer and a warning);
// - into bool every number is its truth value (2 -> True, 0.0 -> False), as bool(v) and NumPy;
// - into float16, bfloat16 and float32 a value is rounded to nearest (even); a value too large
//   becomes +-inf, as NumPy does; an int too large for a float64 (about 1.8e308) is an
//   OverflowError, as float(v) says;
// - lists nest to any depth up to 64; ragged ones ([[1, 2], [3]]) are a ValueError naming the
//   first item that differs; an item that is not a number (a str, None, a complex, any other
//   object) is a TypeError naming it and its type. NumPy arrays inside a list are read as the
//   lists of their values.
// The whole tensor is converted before anything else happens: an error leaves nothing behind.
namespace {

constexpr std::size_t max_value_depth = 64;

// "[1][0]" for an item's place in the nested lists ("" at the top).
std::string item_path(const std::vector<Py_ssize_t>& path) {
  std::string out;
  for (const Py_ssize_t i : path) out += fmt::format("[{}]", i);
  return out;
}

// " (item [1][0])", or "" at the top.
std::string at_item(const std::vector<Py_ssize_t>& path) {
  return path.empty() ? std::string() : fmt::format(" (item {})", item_path(path));
}

class value_reader {
 public:
  value_reader(dtype t, const std::string& what) : t_(t), what_(what) {
    const py::module_ np = py::module_::import("numpy");
    np_ndarray_ = np.attr("ndarray");
    np_bool_ = np.attr("bool_");
    np_integer_ = np.attr("integer");
    np_floating_ = np.attr("floating");
    np_complex_ = np.attr("complexfloating");
  }

  tensor read(const py::handle& obj) {
    const shape dims = shape_of_values(obj);
    out_ = memory::host_tensor(t_, dims);
    next_ = static_cast<std::byte*>(out_.raw_data());
    std::vector<Py_ssize_t> path;
    fill(obj, 0, dims, path);
    return std::move(out_);
  }

 private:
  // obj's items when it is a list, a tuple or an array of rank >= 1 (as a list), else null.
  py::object items_of(const py::handle& obj) const {
    if (PyList_Check(obj.ptr()) != 0 || PyTuple_Check(obj.ptr()) != 0) {
      return py::reinterpret_borrow<py::object>(obj);
    }
    if (py::isinstance(obj, np_ndarray_) && obj.attr("ndim").cast<int>() > 0) {
      return obj.attr("tolist")();
    }
    return {};
  }

  // The dimensions, from the first item at each depth (fill checks every other item).
  shape shape_of_values(const py::handle& obj) const {
    std::vector<std::int64_t> dims;
    py::object cur = py::reinterpret_borrow<py::object>(obj);
    for (;;) {
      const py::object items = items_of(cur);
      if (!items) break;
      if (dims.size() == max_value_depth) {
        throw_python(PyExc_ValueError,
                     fmt::format("{}: the lists nest deeper than {} levels (a list that "
                                 "contains itself?)",
                                 what_, max_value_depth));
      }
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.ptr());
      dims.push_back(n);
      if (n == 0) break;
      cur = py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(items.ptr(), 0));
    }
    return shape(dims);
  }

  void fill(const py::handle& obj, std::size_t depth, const shape& dims,
            std::vector<Py_ssize_t>& path) {
    const py::object items = items_of(obj);
    if (depth == dims.rank()) {
      if (items) {
        throw_python(
            PyExc_ValueError,
            fmt::format("{}: the nested lists are ragged: item {} is a {} of {} where "
                        "a number was expected (as at item {}); the shape so far is {}",
                        what_, item_path(path), type_name(obj),
                        PySequence_Fast_GET_SIZE(items.ptr()), first_path(depth), to_string(dims)));
      }
      write(obj, path);
      return;
    }
    if (!items) {
      throw_python(PyExc_ValueError,
                   fmt::format("{}: the nested lists are ragged: item {} is a {} where a list "
                               "of {} was expected (as at item {}); the shape so far is {}",
                               what_, item_path(path), type_name(obj), dims[depth],
                               first_path(depth), to_string(dims)));
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.ptr());
    if (n != dims[depth]) {
      throw_python(
          PyExc_ValueError,
          fmt::format("{}: the nested lists are ragged: {} has {} item{} where {} "
                      "were expected (as at {}); the shape so far is {}",
                      what_, path.empty() ? "the list" : "item " + item_path(path), n,
                      n == 1 ? "" : "s", dims[depth],
                      depth == 0 ? "the top" : "item " + first_path(depth), to_string(dims)));
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (i >= PySequence_Fast_GET_SIZE(items.ptr())) {
        throw_python(PyExc_ValueError, fmt::format("{}: a list changed while it was read", what_));
      }
      // A reference of our own: the item stays alive whatever the list does meanwhile.
      const auto item =
          py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(items.ptr(), i));
      path.push_back(i);
      fill(item, depth + 1, dims, path);
      path.pop_back();
    }
  }

  // "[0][0]" with `depth` zeros: where shape_of_values looked.
  static std::string first_path(std::size_t depth) {
    return depth == 0 ? std::string("[0]") : item_path(std::vector<Py_ssize_t>(depth, 0));
  }

  template <class T>
  void put(T v) {
    std::memcpy(next_, &v, sizeof v);
    next_ += sizeof v;
  }

  void write(const py::handle& obj, const std::vector<Py_ssize_t>& path) {
    PyObject* o = obj.ptr();
    if (PyBool_Check(o) != 0 || py::isinstance(obj, np_bool_)) {
      write_bool(truth(obj));
    } else if (PyLong_Check(o) != 0) {
      write_int(obj, path);
    } else if (py::isinstance(obj, np_integer_)) {
      write_int(py::reinterpret_steal<py::object>(PyNumber_Index(o)), path);
    } else if (PyFloat_Check(o) != 0 || py::isinstance(obj, np_floating_)) {
      const double d = PyFloat_AsDouble(o);
      if (d == -1.0 && PyErr_Occurred() != nullptr) throw py::error_already_set();
      write_float(d, obj, path);
    } else if (PyComplex_Check(o) != 0 || py::isinstance(obj, np_complex_)) {
      throw_python(PyExc_TypeError,
                   fmt::format("{}: {}{} is a complex number; loom has no complex dtype", what_,
                               py::repr(obj).cast<std::string>(), at_item(path)));
    } else if (py::isinstance(obj, np_ndarray_)) {
      write(obj.attr("item")(), path);  // a 0-d array
    } else {
      throw_python(PyExc_TypeError,
                   fmt::format("{}: {} is a {}, not a number (a {} tensor is made of numbers)",
                               what_, path.empty() ? "the value" : "item " + item_path(path),
                               type_name(obj), to_string(t_)));
    }
  }

  static bool truth(const py::handle& obj) {
    const int b = PyObject_IsTrue(obj.ptr());
    if (b < 0) throw py::error_already_set();
    return b == 1;
  }

  void write_bool(bool b) {
    switch (t_) {
      case dtype::boolean:
        put<std::uint8_t>(b ? 1 : 0);
        break;
      case dtype::i8:
        put<std::int8_t>(b ? 1 : 0);
        break;
      case dtype::u8:
        put<std::uint8_t>(b ? 1 : 0);
        break;
      case dtype::i32:
        put<std::int32_t>(b ? 1 : 0);
        break;
      case dtype::i64:
        put<std::int64_t>(b ? 1 : 0);
        break;
      default:
        store_real(b ? 1.0 : 0.0);
        break;
    }
  }

  // The range of an integer dtype.
  static std::pair<std::int64_t, std::int64_t> range_of(dtype t) {
    switch (t) {
      case dtype::i8:
        return {-128, 127};
      case dtype::u8:
        return {0, 255};
      case dtype::i32:
        return {std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()};
      default:
        return {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
    }
  }

  void put_integer(std::int64_t v) {
    switch (t_) {
      case dtype::i8:
        put(static_cast<std::int8_t>(v));
        break;
      case dtype::u8:
        put(static_cast<std::uint8_t>(v));
        break;
      case dtype::i32:
        put(static_cast<std::int32_t>(v));
        break;
      default:
        put(v);
        break;
    }
  }

  [[noreturn]] void does_not_fit(const std::string& value, const std::vector<Py_ssize_t>& path) {
    const auto [lo, hi] = range_of(t_);
    throw_python(PyExc_OverflowError, fmt::format("{}: {}{} does not fit {} ({} to {})", what_,
                                                  value, at_item(path), to_string(t_), lo, hi));
  }

  void write_int(const py::handle& obj, const std::vector<Py_ssize_t>& path) {
    if (!obj) throw py::error_already_set();
    if (t_ == dtype::boolean) {
      write_bool(truth(obj));
      return;
    }
    if (is_floating(t_)) {
      const double d = PyLong_AsDouble(obj.ptr());
      if (d == -1.0 && PyErr_Occurred() != nullptr) {
        PyErr_Clear();
        throw_python(PyExc_OverflowError,
                     fmt::format("{}: {}{} is too large for any float (a float64 "
                                 "holds up to about 1.8e308)",
                                 what_, describe_int(obj), at_item(path)));
      }
      store_real(d);
      return;
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
    const auto [lo, hi] = range_of(t_);
    if (overflow != 0 || v < lo || v > hi) {
      does_not_fit(describe_int(obj), path);
    }
    put_integer(v);
  }

  void write_float(double d, const py::handle& obj, const std::vector<Py_ssize_t>& path) {
    if (t_ == dtype::boolean) {
      write_bool(d != 0.0);  // NaN is true, as bool(nan)
      return;
    }
    if (is_floating(t_)) {
      store_real(d);
      return;
    }
    const std::string value = "the float " + py::repr(obj).cast<std::string>();
    if (std::isnan(d)) {
      throw_python(PyExc_ValueError,
                   fmt::format("{}: {}{} cannot be converted to {} (NaN has no integer value)",
                               what_, value, at_item(path), to_string(t_)));
    }
    const double whole = std::trunc(d);  // toward zero, as NumPy casts
    const auto [lo, hi] = range_of(t_);
    // lo and hi + 1 are 0 or powers of two, exact as doubles (hi itself may not be: 2**63 - 1).
    if (!(whole >= static_cast<double>(lo) && whole < static_cast<double>(hi) + 1.0)) {
      does_not_fit(value, path);
    }
    put_integer(static_cast<std::int64_t>(whole));
  }

  // A double rounded to a float with the last bit sticky (round to odd): rounding that float
  // again to a type of at most 22 significant bits gives the double correctly rounded, with
  // no double rounding.
  static float round_to_odd(double d) {
    float f = static_cast<float>(d);
    if (std::isnan(d) || static_cast<double>(f) == d) return f;
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
  }

  void store_real(double d) {
    switch (t_) {
      case dtype::f64:
        put(d);
        break;
      case dtype::f32:
        put(static_cast<float>(d));
        break;
      case dtype::f16:
        put(half(round_to_odd(d)).bits);
        break;
      case dtype::bf16:
        put(bfloat16(round_to_odd(d)).bits);
        break;
      default:
        break;  // integer and bool dtypes never get here
    }
  }

  dtype t_;
  const std::string& what_;
  py::object np_ndarray_, np_bool_, np_integer_, np_floating_, np_complex_;
  tensor out_;
  std::byte* next_ = nullptr;
};

}  // namespace

bool is_python_values(const py::handle& obj) {
  PyObject* o = obj.ptr();
  if (PyList_Check(o) != 0 || PyTuple_Check(o) != 0 || PyLong_Check(o) != 0 ||
      PyFloat_Check(o) != 0) {
    return true;
  }
  // NumPy's scalars of a real kind are numbers too (np.int64(3), np.float32(0.5), np.True_).
  const py::module_ np = py::module_::import("numpy");
  return py::isinstance(obj, np.attr("integer")) || py::isinstance(obj, np.attr("floating")) ||
         py::isinstance(obj, np.attr("bool_"));
}

tensor tensor_of_values(const py::handle& obj, dtype t, const std::string& what) {
  return value_reader(t, what).read(obj);
}

tensor to_tensor(const py::handle& obj, const std::string& what) {
  if (py::isinstance<tensor>(obj)) return obj.cast<tensor>();
  const py::module_ np = py::module_::import("numpy");
  if (py::isinstance(obj, np.attr("ndarray"))) {
    tensor t = from_buffer(obj);
    if (t.defined()) return t;
    // A dtype or layout the buffer protocol cannot give loom (misaligned data included): a
    // native, contiguous copy in memory of NumPy's own (aligned) when NumPy can make one of a
    // loom dtype.
    py::object copy = np.attr("array")(obj, py::arg("order") = "C");
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
  if (obj.is_none() || PyUnicode_Check(obj.ptr()) != 0 || PyBytes_Check(obj.ptr()) != 0) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: cannot make a tensor of a {} (a tensor is made of numbers: a "
                             "number, a list of numbers, an array or a tensor)",
                             what, type_name(obj)));
  }
  // The protocols' errors, with the value named: "feed 'x': from_dlpack: ...".
  const auto naming = [&](auto&& import) -> tensor {
    try {
      return import();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_Exception)) throw;
      const std::string message =
          fmt::format("{}: {}", what, py::str(e.value()).cast<std::string>());
      py::raise_from(e, e.type().ptr(), message.c_str());
      throw py::error_already_set();
    }
  };
  if (py::hasattr(obj, "__dlpack__")) return naming([&] { return from_dlpack_object(obj); });
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    return naming([&] { return from_cuda_array_interface(obj, py::none()); });
  }
  if (py::hasattr(obj, "__array_interface__")) check_array_interface(obj, what);
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
             if (type && is_python_values(data))
               return tensor_of_values(data, *type, "Tensor(data)");
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
           [](const tensor& t) {
             const auto d = dlpack_device_of(t);
             return py::make_tuple(d.first, d.second);
           })
      .def_property_readonly("__cuda_array_interface__", &cuda_array_interface,
                             "The CUDA array interface (version 3) of a tensor in GPU memory");

  m.def("from_dlpack", py::overload_cast<const py::handle&, const py::object&>(&from_dlpack_object),
        py::arg("x"), py::kw_only(), py::arg("stream") = py::none(),
        "A loom tensor sharing x's memory: x is a DLPack capsule or has __dlpack__ (NumPy, "
        "PyTorch, CuPy); the producer's deleter runs when loom lets go. For GPU memory the "
        "producer orders its work before `stream` (a cudaStream_t as an int, 1 or 2), which the "
        "tensor's buffer records; without one, before loom's interop stream, which is waited "
        "for before this returns");
  m.def("from_cuda_array_interface", &from_cuda_array_interface, py::arg("obj"), py::kw_only(),
        py::arg("stream") = py::none(),
        "A loom tensor viewing the GPU memory of obj (anything with __cuda_array_interface__: "
        "Numba, CuPy, PyTorch), keeping obj alive. The producer's 'stream' is waited for: "
        "made to come before `stream` when one is given, else on the host");
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
