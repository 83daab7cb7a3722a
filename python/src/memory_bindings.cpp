// loom.memory: the process's host pool, its statistics (per device and per library), loans,
// NumPy's data allocator, and the C ABI allocator (allocate / deallocate, for the plug-ins of
// python/loom/cuda.py).
//
// Note [NumPy allocator]
// install_numpy_allocator() makes loom's host pool (cpu:0's resource, the one loom.Tensor
// copies and host tensors come from) NumPy's data allocator through NEP 49's
// PyDataMem_SetHandler: new arrays' data then comes from the same pool as loom's tensors.
// NumPy's calls go through a statistics_adaptor of their own, so stats() tells NumPy's
// bytes from loom's. NumPy's realloc and free do not always pass the block's size, so each
// block starts with a 64-byte header holding it (64 keeps the data 64-byte aligned).
// Every array remembers the handler that allocated it and frees through it, so
// uninstalling (back to NumPy's default) is safe while arrays from loom's pool are alive:
// the handler, its adaptor and the pool are never destroyed.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <fmt/format.h>
#include <numpy/arrayobject.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/c_api.h"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/library_resources.hpp"
#include "loom/memory/loans.hpp"
#include "loom/memory/statistics_adaptor.hpp"

namespace loom::python {

py::dict memory_stats_dict(const memory_stats& st);  // session_bindings.cpp

namespace {

constexpr std::size_t header = 64;

memory::memory_resource& host_pool() {
  return memory::get_device_resource({device_type::cpu, 0});
}

// NumPy's view of the pool, made at install: never destroyed (arrays may outlive
// everything else, and free through it).
memory::statistics_adaptor* numpy_adaptor = nullptr;

memory::statistics_adaptor& numpy_resource() {
  if (numpy_adaptor == nullptr) numpy_adaptor = new memory::statistics_adaptor(host_pool());
  return *numpy_adaptor;
}

void* numpy_malloc(void*, std::size_t size) noexcept {
  try {
    auto* p = static_cast<std::byte*>(numpy_resource().allocate(size + header, header));
    std::memcpy(p, &size, sizeof size);
    return p + header;
  } catch (...) {
    return nullptr;  // NumPy raises MemoryError
  }
}

void numpy_free(void*, void* ptr, std::size_t) noexcept {
  if (ptr == nullptr) return;
  auto* p = static_cast<std::byte*>(ptr) - header;
  std::size_t size = 0;
  std::memcpy(&size, p, sizeof size);
  numpy_resource().deallocate(p, size + header, header);
}

void* numpy_calloc(void* ctx, std::size_t n, std::size_t elsize) noexcept {
  std::size_t size = 0;
  if (__builtin_mul_overflow(n, elsize, &size)) return nullptr;
  void* p = numpy_malloc(ctx, size);
  if (p != nullptr) std::memset(p, 0, size);
  return p;
}

void* numpy_realloc(void* ctx, void* ptr, std::size_t new_size) noexcept {
  if (ptr == nullptr) return numpy_malloc(ctx, new_size);
  std::size_t old_size = 0;
  std::memcpy(&old_size, static_cast<std::byte*>(ptr) - header, sizeof old_size);
  void* p = numpy_malloc(ctx, new_size);
  if (p == nullptr) return nullptr;  // the old block stays valid, as realloc's does
  std::memcpy(p, ptr, std::min(old_size, new_size));
  numpy_free(ctx, ptr, old_size);
  return p;
}

PyDataMem_Handler* loom_handler() {
  static PyDataMem_Handler h = [] {
    PyDataMem_Handler x{};
    std::snprintf(x.name, sizeof x.name, "loom_host_pool");
    x.version = 1;
    x.allocator =
        PyDataMemAllocator{nullptr, &numpy_malloc, &numpy_calloc, &numpy_realloc, &numpy_free};
    return x;
  }();
  return &h;
}

// The handler NumPy had before install (to put back), and ours as a capsule: owned
// references kept for the life of the process (not py::objects, whose destructors would run
// after the interpreter is gone).
PyObject* previous_handler = nullptr;
PyObject* loom_capsule = nullptr;

bool installed() {
  const py::object current = py::reinterpret_steal<py::object>(PyDataMem_GetHandler());
  if (!current) throw py::error_already_set();
  return PyCapsule_GetPointer(current.ptr(), "mem_handler") == loom_handler();
}

loom_device to_loom_device(device_id d) {
  return loom_device{static_cast<std::int32_t>(d.type), d.index};
}

// Raises the Python exception for the C ABI's last error on this thread.
[[noreturn]] void raise_c_api_error() {
  const std::string message = loom_last_error_message();
  switch (loom_last_error()) {
    case LOOM_ERROR_OUT_OF_MEMORY:
      throw_python(PyExc_MemoryError, message);
    case LOOM_ERROR_INVALID_ARGUMENT:
      throw_python(PyExc_ValueError, message);
    case LOOM_ERROR_NO_DEVICE:
      throw_python(PyExc_KeyError, message);
    default:
      throw_python(PyExc_RuntimeError, message);
  }
}

// loom.memory.stats(device, library=...): one library's figures.
py::dict library_stats_dict(device_id device, const std::string& library, bool host) {
  if (host && library == "numpy") {
    return memory_stats_dict(numpy_adaptor != nullptr ? numpy_adaptor->get_stats()
                                                      : memory_stats{});
  }
  if (std::string why = memory::check_library_name(library); !why.empty()) {
    throw_python(PyExc_ValueError, why);
  }
  return memory_stats_dict(memory::library_stats(device, library).value_or(memory_stats{}));
}

py::dict loan_dict(const memory::loan& l) {
  return py::dict(py::arg("ticket") = l.ticket,
                  py::arg("pointer") = reinterpret_cast<std::uintptr_t>(l.pointer),
                  py::arg("bytes") = l.bytes, py::arg("borrower") = l.borrower);
}

}  // namespace

void bind_memory(py::module_& m) {
  if (_import_array() < 0) throw py::error_already_set();

  m.def(
      "install_numpy_allocator",
      [] {
        if (installed()) return false;
        if (loom_capsule == nullptr) {
          loom_capsule = PyCapsule_New(loom_handler(), "mem_handler", nullptr);
          if (loom_capsule == nullptr) throw py::error_already_set();
        }
        PyObject* old = PyDataMem_SetHandler(loom_capsule);
        if (old == nullptr) throw py::error_already_set();
        Py_XDECREF(previous_handler);
        previous_handler = old;
        return true;
      },
      "Makes loom's host pool NumPy's data allocator (NEP 49); False when it already was");
  m.def(
      "uninstall_numpy_allocator",
      [] {
        if (!installed()) return false;
        PyObject* ours = PyDataMem_SetHandler(previous_handler);
        if (ours == nullptr) throw py::error_already_set();
        Py_DECREF(ours);
        return true;
      },
      "Gives NumPy its previous allocator back (arrays from loom's pool stay valid); False "
      "when loom's was not installed");
  m.def("numpy_allocator_installed", &installed);
  m.def(
      "configure_host_pool",
      [](const py::object& initial_size_arg, const py::object& growth_step_arg,
         const py::object& max_size_arg, const py::object& granularity_arg) {
        const std::size_t initial_size =
            size_of_arg(initial_size_arg, "configure_host_pool: initial_size");
        const std::size_t growth_step =
            size_of_arg(growth_step_arg, "configure_host_pool: growth_step");
        const std::size_t granularity =
            size_of_arg(granularity_arg, "configure_host_pool: granularity");
        std::optional<std::size_t> max_size;
        if (!max_size_arg.is_none()) {
          max_size = size_of_arg(max_size_arg, "configure_host_pool: max_size");
          if (*max_size == 0) {
            throw_python(PyExc_ValueError,
                         "configure_host_pool: max_size is 0, which would leave the host pool "
                         "no memory at all (None: no limit)");
          }
        }
        if (numpy_adaptor != nullptr) {
          throw_python(PyExc_RuntimeError,
                       "configure_host_pool: NumPy's allocator has used the host pool; "
                       "configure it before install_numpy_allocator()");
        }
        memory::bfc_pool_options o;
        o.name = "cpu:0";
        o.initial_size = initial_size;
        o.growth_step = growth_step;
        if (max_size) o.max_size = *max_size;
        o.granularity = granularity;
        // Never destroyed: tensors from it may live until the process ends.
        auto* pool = new memory::bfc_pool(memory::host_resource::instance(), std::move(o));
        memory::memory_resource* old = memory::set_device_resource({device_type::cpu, 0}, pool);
        // The old pool keeps what is still in use and gives back its wholly free regions.
        if (auto* old_pool = dynamic_cast<memory::bfc_pool*>(old)) (void)old_pool->trim();
      },
      py::kw_only(), py::arg("initial_size") = 0, py::arg("growth_step") = std::size_t{64} << 20,
      py::arg("max_size") = py::none(), py::arg("granularity") = 256,
      "Replaces the host pool (cpu:0's resource: loom.Tensor copies, host tensors, NumPy's "
      "allocator) with a bfc_pool of these options (docs/memory.md): preallocated "
      "(initial_size, growth_step=0) or growing, up to max_size. Tensors of the old pool stay "
      "valid. Raises ValueError for invalid options.");
  m.def(
      "stats",
      [](const std::string& device_name, const std::optional<std::string>& library) {
        const device_id device = parse_device_id(device_name);
        const bool host = device == device_id{device_type::cpu, 0};
        if (library) return py::object(library_stats_dict(device, *library, host));
        py::dict out;
        memory::memory_resource* r = memory::find_device_resource(device);
        if (r == nullptr) {
          throw_python(PyExc_KeyError,
                       fmt::format("no memory resource serves {} (for a GPU: a session on it, or "
                                   "one of the plug-ins of loom.cuda, makes one)",
                                   to_string(device)));
        }
        const auto st = r->stats();
        if (st) out["pool"] = memory_stats_dict(*st);
        // Each library's share: NumPy's (on cpu:0; nothing until install_numpy_allocator made
        // its adaptor) and those of the C ABI's loom_allocate_for.
        std::vector<std::pair<std::string, memory_stats>> shares;
        if (host) {
          const auto np = numpy_adaptor != nullptr ? numpy_adaptor->get_stats() : memory_stats{};
          out["numpy"] = memory_stats_dict(np);
          shares.emplace_back("numpy", np);
        }
        py::dict libs;
        for (const std::string& name : memory::libraries(device)) {
          const memory_stats ls = memory::library_stats(device, name).value_or(memory_stats{});
          libs[py::str(name)] = memory_stats_dict(ls);
          shares.emplace_back(name, ls);
        }
        out["libraries"] = libs;
        if (st) {
          // What the pool serves that no library asked for: loom's own tensors.
          memory_stats loom = *st;
          for (const auto& [name, share] : shares) {
            loom.bytes_in_use -= std::min(loom.bytes_in_use, share.bytes_in_use);
            loom.allocations_in_use -= std::min(loom.allocations_in_use, share.allocations_in_use);
            loom.num_allocs -= std::min(loom.num_allocs, share.num_allocs);
            loom.num_deallocs -= std::min(loom.num_deallocs, share.num_deallocs);
          }
          out["loom"] = py::dict(py::arg("bytes_in_use") = loom.bytes_in_use,
                                 py::arg("allocations_in_use") = loom.allocations_in_use,
                                 py::arg("num_allocs") = loom.num_allocs,
                                 py::arg("num_deallocs") = loom.num_deallocs);
        }
        return py::object(std::move(out));
      },
      py::arg("device") = "cpu:0", py::arg("library") = py::none(),
      "A device's memory statistics. Without `library`: the pool serving the device ('pool'), "
      "each library's share ('libraries', by name: those that allocated through "
      "loom_allocate_for or the plug-ins of loom.cuda; on cpu:0 also 'numpy', through "
      "install_numpy_allocator) and loom's own ('loom': the pool less every share). With "
      "`library` ('torch', 'cupy', 'numba', 'numpy', ...): that library's figures (zeros when "
      "it has allocated nothing there). KeyError when nothing serves the device.");
  m.def(
      "allocate",
      [](const py::object& nbytes_arg, const std::string& device_name,
         const std::optional<std::string>& library, const py::object& alignment_arg,
         std::uintptr_t stream_handle) {
        const std::size_t nbytes = size_of_arg(nbytes_arg, "allocate: nbytes");
        const std::size_t alignment = size_of_arg(alignment_arg, "allocate: alignment");
        const loom_device d = to_loom_device(parse_device_id(device_name));
        auto* s = reinterpret_cast<void*>(stream_handle);
        void* p = nullptr;
        {
          const without_gil release;  // a GPU pool may wait for a stream
          p = library ? loom_allocate_for(library->c_str(), nbytes, alignment, d, s)
                      : loom_allocate(nbytes, alignment, d, s);
        }
        if (p == nullptr) raise_c_api_error();
        return reinterpret_cast<std::uintptr_t>(p);
      },
      py::arg("nbytes"), py::kw_only(), py::arg("device") = "cpu:0",
      py::arg("library") = py::none(), py::arg("alignment") = 0, py::arg("stream") = 0,
      "A block of `nbytes` from the pool serving `device`, through the C ABI (loom_allocate, "
      "or loom_allocate_for counted for `library`), as an address; give it back with "
      "deallocate and the same arguments. `alignment` 0 means 64; `stream` is a "
      "cudaStream_t as an integer (0: the default stream). MemoryError, ValueError, KeyError "
      "(no resource serves the device).");
  m.def(
      "deallocate",
      [](std::uintptr_t address, const py::object& nbytes_arg, const std::string& device_name,
         const std::optional<std::string>& library, const py::object& alignment_arg,
         std::uintptr_t stream_handle) {
        const std::size_t nbytes = size_of_arg(nbytes_arg, "deallocate: nbytes");
        const std::size_t alignment = size_of_arg(alignment_arg, "deallocate: alignment");
        const loom_device d = to_loom_device(parse_device_id(device_name));
        auto* p = reinterpret_cast<void*>(address);
        auto* s = reinterpret_cast<void*>(stream_handle);
        {
          const without_gil release;
          if (library) {
            loom_deallocate_for(library->c_str(), p, nbytes, alignment, d, s);
          } else {
            loom_deallocate(p, nbytes, alignment, d, s);
          }
        }
        if (loom_last_error() != LOOM_OK) raise_c_api_error();
      },
      py::arg("address"), py::arg("nbytes"), py::kw_only(), py::arg("device") = "cpu:0",
      py::arg("library") = py::none(), py::arg("alignment") = 0, py::arg("stream") = 0,
      "Gives back a block from allocate (same nbytes, device, library, alignment; `stream`: "
      "where its last use was ordered). ValueError, leaving the block alone, for a library "
      "that allocated nothing on the device.");
  m.def(
      "libraries",
      [](const std::string& device_name) {
        return memory::libraries(parse_device_id(device_name));
      },
      py::arg("device") = "cpu:0",
      "The libraries that allocated on `device` through loom_allocate_for, in order of first "
      "use");
  m.def(
      "outstanding_loans",
      [] {
        py::list out;
        for (const auto& l : memory::outstanding_loans()) out.append(loan_dict(l));
        return out;
      },
      "Memory lent through DLPack and not given back yet");
}

}  // namespace loom::python
