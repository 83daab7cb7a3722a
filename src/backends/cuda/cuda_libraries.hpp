// cuBLAS, cuBLASLt and NVRTC, loaded when first used (Note [lazy CUDA libraries]).
#pragma once

#include <string>

namespace loom::cuda {

// cuda_libraries.cpp is compiled with hidden visibility (its forwarding functions must never
// stand in for another library's cuBLAS or NVRTC); loom's own functions here stay visible to
// what links a shared libloom (the sanitizer builds' tests).
#define LOOM_CUDA_LIBRARIES_API [[gnu::visibility("default")]]

/// Loads cuBLAS, cuBLASLt and NVRTC now, once per process. Returns "" when all three are
/// there, else why not (the library and dlopen's message, and what to install).
LOOM_CUDA_LIBRARIES_API [[nodiscard]] const std::string& load_libraries();

/// Loads NCCL (libnccl.so.2) now, once per process: "" when it is there, else why not. Only
/// NCCL communicators load it (loom/distributed/nccl.hpp).
LOOM_CUDA_LIBRARIES_API [[nodiscard]] const std::string& load_nccl();

/// The sonames loom loads: "libcublas.so.13" and so on.
struct library_sonames {
  const char* cublas;
  const char* cublaslt;
  const char* nvrtc;
};
LOOM_CUDA_LIBRARIES_API [[nodiscard]] library_sonames sonames() noexcept;

/// Whether `soname` is mapped into this process (for tests of the lazy loading).
LOOM_CUDA_LIBRARIES_API [[nodiscard]] bool library_loaded(const char* soname);

}  // namespace loom::cuda
