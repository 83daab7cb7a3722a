// loom/device/cuda.hpp for builds without the CUDA backend (src/backends/cuda/cuda_info.cpp
// is the one with it).
#ifndef LOOM_HAVE_CUDA

#include "loom/device/cuda.hpp"

namespace loom::cuda {

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

}  // namespace loom::cuda

#endif  // LOOM_HAVE_CUDA
