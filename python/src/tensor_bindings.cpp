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
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "loom/core/error.hpp"
#include "loom/interop/cuda_interop.hpp"
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

// The DLPack device of a tensor: (type code, index).
std::pair<int, int> dlpack_device_of(const tensor& t) {
  const device_id d = t.defined() ? t.device() : device_id{device_type::cpu, 0};
  return {static_cast<int>(d.type), d.index};
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
    stream_number = stream.cast<std::int64_t>();
  }
  if (!dl_device.is_none()) {
    const auto dev = dl_device.cast<std::pair<int, int>>();
    if (dev != own) {
      throw_python(
          PyExc_BufferError,
          fmt::format("cannot export a tensor on {} to DLPack device ({}, {}); loom "
                      "exports it to ({}, {}) only",
                      to_string(t.device()), dev.first, dev.second, own.first, own.second));
    }
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
    const py::gil_scoped_release release;
    interop::prepare_export(t, stream_number);
  } catch (const unsupported_error&) {
    throw;  // a build without CUDA: TypeError
  } catch (const invalid_argument& e) {
    throw_python(PyExc_BufferError, fmt::format("__dlpack__: {}", e.what()));
  }
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

// Consumes a capsule (Note [capsules]); GPU memory in it is ordered on `s`.
tensor from_capsule(const py::handle& capsule, stream s = {}) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr) throw py::error_already_set();
  const std::string_view n(name);
  if (n == used_legacy_name || n == used_versioned_name) {
    throw_python(PyExc_BufferError,
                 fmt::format("the DLPack capsule was already consumed (its name is '{}')", n));
  }
  if (n == legacy_name) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), legacy_name));
    tensor t = interop::from_dlpack(m, s);  // throws before taking m
    PyCapsule_SetName(capsule.ptr(), used_legacy_name);
    return t;
  }
  if (n == versioned_name) {
    auto* m =
        static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), versioned_name));
    tensor t = interop::from_dlpack(m, s);
    PyCapsule_SetName(capsule.ptr(), used_versioned_name);
    return t;
  }
  throw_python(PyExc_ValueError,
               fmt::format("a capsule named '{}' is not a DLPack tensor (expected '{}' or '{}')", n,
                           legacy_name, versioned_name));
}

// A stream argument of loom's importers: None, or an int other than 0 and below -1.
std::optional<std::int64_t> stream_argument(const py::object& stream, const char* what) {
  if (stream.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(stream)) {
    throw_python(PyExc_TypeError, fmt::format("{}: stream must be None or an int, not a {}", what,
                                              type_name(stream)));
  }
  const auto n = stream.cast<std::int64_t>();
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
tensor from_dlpack_object(const py::handle& x, const py::object& stream) {
  const std::optional<std::int64_t> wanted = stream_argument(stream, "from_dlpack");
  if (PyCapsule_CheckExact(x.ptr()) != 0) {
    return from_capsule(x, wanted ? interop::stream_from_protocol(*wanted) : loom::stream{});
  }
  if (!py::hasattr(x, "__dlpack__")) {
    throw_python(
        PyExc_TypeError,
        fmt::format("{} has no __dlpack__ method and is not a DLPack capsule", type_name(x)));
  }
  std::pair<int, int> dev{kDLCPU, 0};
  if (py::hasattr(x, "__dlpack_device__")) {
    dev = x.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (dev.first != kDLCPU && dev.first != kDLCUDA && dev.first != kDLCUDAHost &&
        dev.first != kDLCUDAManaged) {
      throw_python(PyExc_BufferError,
                   fmt::format("the tensor is on DLPack device ({}, {}); loom imports CPU (1), "
                               "CUDA (2), CUDA host (3) and CUDA managed (13) memory",
                               dev.first, dev.second));
    }
  }
  const bool streams = dev.first == kDLCUDA || dev.first == kDLCUDAManaged;
  std::optional<std::int64_t> consumer;  // the stream the producer orders its work before
  if (streams) {
    consumer = wanted ? *wanted
                      : interop::protocol_stream_number(interop::cuda_interop_stream(dev.second));
  }
  py::object stream_arg = consumer ? py::object(py::int_(*consumer)) : py::object(py::none());
  // Ask for a versioned capsule; producers that predate DLPack 1.0 (NumPy 1.x, PyTorch 1.x)
  // take no max_version and give the legacy one.
  py::object capsule;
  try {
    capsule = streams ? x.attr("__dlpack__")(py::arg("stream") = stream_arg,
                                             py::arg("max_version") = py::make_tuple(1, 0))
                      : x.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule =
        streams ? x.attr("__dlpack__")(py::arg("stream") = stream_arg) : x.attr("__dlpack__")();
  }
  if (streams && !wanted) {
    tensor t = from_capsule(capsule);  // ready for any stream once the host has waited
    const py::gil_scoped_release release;
    interop::cuda_stream_synchronize(dev.second, interop::stream_from_protocol(*consumer));
    return t;
  }
  return from_capsule(capsule,
                      consumer ? interop::stream_from_protocol(*consumer) : loom::stream{});
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
      const py::gil_scoped_release release;
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
  if (Py_IsInitialized() != 0) {
    const PyGILState_STATE state = PyGILState_Ensure();
    Py_DECREF(static_cast<PyObject*>(context));
    PyGILState_Release(state);
  }
}

// loom.from_cuda_array_interface(obj, stream=None): a tensor viewing obj's GPU memory (no
// copy), keeping obj alive. Everything is checked before any CUDA call. A producer "stream"
// is waited for as from_dlpack waits (Note [interop streams]).
tensor from_cuda_array_interface(const py::handle& obj, const py::object& stream) {
  const std::optional<std::int64_t> wanted = stream_argument(stream, "from_cuda_array_interface");
  if (!py::hasattr(obj, "__cuda_array_interface__")) {
    throw_python(PyExc_TypeError, fmt::format("from_cuda_array_interface: a {} has no "
                                              "__cuda_array_interface__",
                                              type_name(obj)));
  }
  const py::object iface = obj.attr("__cuda_array_interface__");
  if (!py::isinstance<py::dict>(iface)) {
    throw_python(PyExc_TypeError,
                 fmt::format("from_cuda_array_interface: __cuda_array_interface__ is a {}, not a "
                             "dict",
                             type_name(iface)));
  }
  const auto d = iface.cast<py::dict>();
  const auto bad = [](const std::string& why) -> void {
    throw_python(PyExc_ValueError, "from_cuda_array_interface: " + why);
  };
  for (const char* key : {"shape", "typestr", "data", "version"}) {
    if (!d.contains(key)) bad(fmt::format("the interface has no '{}'", key));
  }
  const auto version = d["version"].cast<std::int64_t>();
  if (version < 0 || version > 3) {
    bad(fmt::format("version {} (loom reads versions 0 to 3)", version));
  }
  if (d.contains("mask") && !d["mask"].is_none()) {
    throw_python(PyExc_TypeError,
                 "from_cuda_array_interface: masked arrays are not supported (mask is not None)");
  }
  const dtype t = dtype_of_typestr(py::str(d["typestr"]).cast<std::string>());
  const auto esize = static_cast<std::int64_t>(size_of(t));
  const auto dims_in = d["shape"].cast<std::vector<std::int64_t>>();
  const std::size_t rank = dims_in.size();
  shape dims = shape::filled(rank, 0);
  shape strides = shape::filled(rank, 0);
  std::int64_t count = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    if (dims_in[i] < 0) bad(fmt::format("dimension {} is {}", i, dims_in[i]));
    dims[i] = dims_in[i];
    if (__builtin_mul_overflow(count, dims_in[i], &count)) bad("the element count overflows");
  }
  std::vector<std::int64_t> byte_strides;
  if (d.contains("strides") && !d["strides"].is_none()) {
    byte_strides = d["strides"].cast<std::vector<std::int64_t>>();
    if (byte_strides.size() != rank) {
      bad(fmt::format("{} strides for {} dimensions", byte_strides.size(), rank));
    }
  }
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::int64_t next = 1;
  for (std::size_t i = rank; i-- > 0;) {
    std::int64_t s = next;
    if (!byte_strides.empty()) {
      if (byte_strides[i] % esize != 0) {
        bad(fmt::format("stride {} of dimension {} is not a multiple of the item size {}",
                        byte_strides[i], i, esize));
      }
      s = byte_strides[i] / esize;
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
  const auto data = d["data"].cast<py::tuple>();
  if (data.size() != 2) bad("'data' is not a (pointer, read_only) pair");
  const auto address = data[0].cast<std::uintptr_t>();
  const bool read_only = data[1].cast<bool>();
  if (address == 0 && count != 0) bad(fmt::format("a null pointer for {} elements", count));
  std::optional<std::int64_t> producer;
  if (version >= 3 && d.contains("stream") && !d["stream"].is_none()) {
    const auto n = d["stream"].cast<std::int64_t>();
    if (n == 0) bad("stream 0 is disallowed by version 3 (ambiguous)");
    if (n < 0) bad(fmt::format("stream {} is no CUDA stream", n));
    producer = n;
  }
  // CUDA from here on: where the memory is, and the producer's stream.
  device_id dev{device_type::cuda, 0};
  {
    const py::gil_scoped_release release;
    dev = address != 0 ? interop::cuda_pointer_device(reinterpret_cast<const void*>(address))
                       : device_id{device_type::cuda, interop::cuda_current_device()};
  }
  if (dev.type == device_type::cpu) {
    bad(fmt::format("the pointer 0x{:x} is host memory CUDA does not know, not GPU memory",
                    address));
  }
  loom::stream ordered{};
  if (producer && dev.type != device_type::cuda_host) {
    const py::gil_scoped_release release;
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
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    return from_cuda_array_interface(obj, py::none());
  }
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
