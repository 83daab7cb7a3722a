// loom._loom._cuda: what python/loom/cuda.py needs from C++ (the CUDA interop calls of
// loom/cuda/interop.hpp, which raise TypeError in builds without CUDA), and the two C
// functions PyTorch's CUDAPluggableAllocator loads from this extension.
//
// Note [torch allocator]
// torch.cuda.memory.CUDAPluggableAllocator(path, "loom_torch_malloc", "loom_torch_free")
// dlopens `path` (this extension, already loaded by Python, so the same copy of loom) and
// calls the two functions for every allocation PyTorch makes on a GPU, with the device and
// the stream the block is for. They allocate from the process's pool of that GPU through the
// C ABI under the library name "torch" (loom.memory.stats(device="cuda:0", library="torch")),
// with 256-byte alignment (cudaMalloc's guarantee, which PyTorch's kernels assume for
// vectorised loads), and make the pool serve the C ABI on first use. The free is ordered on
// the stream PyTorch passes (the block's allocation stream): the pool reuses the block at
// once on that stream and on others only after an event (Note [stream-ordered memory]).
// Nothing throws into PyTorch: a failed malloc returns NULL, which PyTorch reports as out of
// memory.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/types.h>

#include <cstdint>

#include "bindings.hpp"
#include "loom/cuda/info.hpp"
#include "loom/cuda/interop.hpp"
#include "loom/memory/c_api.h"

namespace {

constexpr const char* torch_library = "torch";
constexpr std::size_t torch_alignment = 256;

}  // namespace

extern "C" {

/// PyTorch's pluggable allocator's malloc (Note [torch allocator]).
LOOM_API void* loom_torch_malloc(ssize_t size, int device, void* stream) noexcept {
  if (size < 0) return nullptr;
  const loom_device d{LOOM_DEVICE_CUDA, device};
  const auto bytes = static_cast<std::size_t>(size);
  void* p = loom_allocate_for(torch_library, bytes, torch_alignment, d, stream);
  if (p == nullptr && loom_last_error() == LOOM_ERROR_NO_DEVICE) {
    try {
      loom::interop::cuda_serve_c_api(device);
    } catch (...) {
      return nullptr;
    }
    p = loom_allocate_for(torch_library, bytes, torch_alignment, d, stream);
  }
  return p;
}

/// PyTorch's pluggable allocator's free (Note [torch allocator]).
LOOM_API void loom_torch_free(void* ptr, ssize_t size, int device, void* stream) noexcept {
  if (ptr == nullptr || size < 0) return;
  loom_deallocate_for(torch_library, ptr, static_cast<std::size_t>(size), torch_alignment,
                      loom_device{LOOM_DEVICE_CUDA, device}, stream);
}

}  // extern "C"

namespace loom::python {

void bind_cuda(py::module_& m) {
  m.def("available", &interop::cuda_interop_available,
        "True when loom was built with the CUDA backend");
  m.def("device_count", &cuda::device_count, "GPUs this process can use (0 without CUDA)");
  m.def("availability", &cuda::availability, "Why there is no GPU, or '' when there is one");
  m.def("describe", [] { return cuda::describe(); });
  m.def("trim", &cuda::trim, py::arg("ordinal") = 0, py::call_guard<without_gil>(),
        "Hands the free regions of GPU `ordinal`'s pool back to CUDA; returns the bytes");
  m.def("serve_c_api", &interop::cuda_serve_c_api, py::arg("ordinal"),
        py::call_guard<without_gil>(),
        "Makes the process's pool of GPU `ordinal` serve the C ABI (and so the plug-ins)");
  m.def("memory_info", &interop::cuda_memory_info, py::arg("ordinal"),
        py::call_guard<without_gil>(), "(free, total) bytes of GPU `ordinal`");
  m.def("current_device", &interop::cuda_current_device);
  m.def(
      "interop_stream",
      [](int ordinal) {
        return interop::protocol_stream_number(interop::cuda_interop_stream(ordinal));
      },
      py::arg("ordinal"), "loom's interop stream of GPU `ordinal`, as an integer");
  m.def(
      "stream_wait",
      [](int ordinal, std::int64_t consumer, std::int64_t producer) {
        interop::cuda_stream_wait(ordinal, interop::stream_from_protocol(consumer),
                                  interop::stream_from_protocol(producer));
      },
      py::arg("ordinal"), py::arg("consumer"), py::arg("producer"), py::call_guard<without_gil>(),
      "Makes stream `consumer` wait for the work queued on `producer` so far (an event)");
  m.def(
      "stream_synchronize",
      [](int ordinal, std::int64_t s) {
        interop::cuda_stream_synchronize(ordinal, interop::stream_from_protocol(s));
      },
      py::arg("ordinal"), py::arg("stream"), py::call_guard<without_gil>(),
      "Waits on the host for the work queued on `stream` so far");
  m.def(
      "pointer_device",
      [](std::uintptr_t address) {
        return to_string(interop::cuda_pointer_device(reinterpret_cast<const void*>(address)));
      },
      py::arg("address"), "Where memory at `address` lives: 'cuda:0', 'cuda_host:0', 'cpu:0'");
  m.attr("torch_malloc") = "loom_torch_malloc";
  m.attr("torch_free") = "loom_torch_free";
}

}  // namespace loom::python
