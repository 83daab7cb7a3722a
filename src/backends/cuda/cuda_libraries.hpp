// cuBLAS, cuBLASLt and NVRTC, loaded when first used (Note [lazy CUDA libraries]).
#pragma once

#include <string>

namespace loom::cuda {

/// Loads cuBLAS, cuBLASLt and NVRTC now, once per process. Returns "" when all three are
/// there, else why not (the library and dlopen's message, and what to install).
[[nodiscard]] const std::string& load_libraries();

/// Loads NCCL (libnccl.so.2) now, once per process: "" when it is there, else why not. Only
/// NCCL communicators load it (loom/distributed/nccl.hpp).
[[nodiscard]] const std::string& load_nccl();

/// The sonames loom loads: "libcublas.so.13" and so on.
struct library_sonames {
  const char* cublas;
  const char* cublaslt;
  const char* nvrtc;
};
[[nodiscard]] library_sonames sonames() noexcept;

/// Whether `soname` is mapped into this process (for tests of the lazy loading).
[[nodiscard]] bool library_loaded(const char* soname);

}  // namespace loom::cuda
