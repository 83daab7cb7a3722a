// The CUDA seams of builds without the CUDA backend (src/CMakeLists.txt compiles this file
// only then; the backend's src/backends/cuda/cuda_info.cpp and interop_cuda.cpp are the ones
// with it): loom/cuda/info.hpp answers that there is no GPU, and in loom/cuda/interop.hpp
// nothing but cuda_interop_available() works.
#include <fmt/format.h>

#include "loom/core/error.hpp"
#include "loom/cuda/info.hpp"
#include "loom/cuda/interop.hpp"
#include "loom/distributed/nccl.hpp"

namespace loom {
namespace cuda {

bool is_built() noexcept {
  return false;
}
int device_count() noexcept {
  return 0;
}
std::string availability() {
  return "loom was built without CUDA";
}
std::string describe() {
  return availability();
}

std::size_t trim(int /*ordinal*/) {
  return 0;
}

}  // namespace cuda

namespace interop {
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

}  // namespace interop
}  // namespace loom

namespace loom::distributed {

std::string nccl_availability() {
  return "loom was built without CUDA, so without NCCL";
}

std::shared_ptr<communicator> make_nccl_communicator(const std::shared_ptr<communicator>& bootstrap,
                                                     int cuda_ordinal) {
  const int rank = bootstrap ? bootstrap->rank() : 0;
  throw distributed_error(fmt::format("rank {}: an NCCL communicator on cuda:{}: {}", rank,
                                      cuda_ordinal, nccl_availability()),
                          rank);
}

}  // namespace loom::distributed
