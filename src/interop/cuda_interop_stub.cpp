// loom/interop/cuda_interop.hpp for builds without the CUDA backend: nothing but
// cuda_interop_available() works (the backend's src/backends/cuda/interop_cuda.cpp
// implements them otherwise).
#ifndef LOOM_HAVE_CUDA

#include <fmt/format.h>

#include "loom/core/error.hpp"
#include "loom/interop/cuda_interop.hpp"

namespace loom::interop {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw unsupported_error(
      fmt::format("{}: loom was built without CUDA (the CUDA toolkit was not found, or "
                  "LOOM_CUDA was off)",
                  what));
}

}  // namespace

bool cuda_interop_available() noexcept {
  return false;
}

void cuda_stream_wait(int, stream, stream) {
  no_cuda("cuda_stream_wait");
}

void cuda_stream_synchronize(int, stream) {
  no_cuda("cuda_stream_synchronize");
}

stream cuda_interop_stream(int) {
  no_cuda("cuda_interop_stream");
}

device_id cuda_pointer_device(const void*) {
  no_cuda("cuda_pointer_device");
}

int cuda_current_device() {
  no_cuda("cuda_current_device");
}

std::pair<std::size_t, std::size_t> cuda_memory_info(int) {
  no_cuda("cuda_memory_info");
}

void cuda_serve_c_api(int) {
  no_cuda("cuda_serve_c_api");
}

}  // namespace loom::interop

#endif  // LOOM_HAVE_CUDA
