// Checking CUDA, cuBLAS and NVRTC calls: every failure becomes a typed loom exception
// whose message names the call, where it was made, and CUDA's own name and text for the
// error. Out-of-memory codes become loom::out_of_memory (a std::bad_alloc), so pools and
// callers treat a GPU that is full like a host that is.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <string>

#include "loom/core/error.hpp"

namespace loom {

/// A CUDA, cuBLAS or NVRTC call failed (not for lack of memory). `code` is the library's
/// status value.
class cuda_error : public error {
 public:
  cuda_error(const std::string& message, int code) : error(message), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

namespace cuda {

/// Throws loom::out_of_memory for cudaErrorMemoryAllocation, else loom::cuda_error:
/// "<call> failed at <file>:<line>: cudaErrorX: <text>". Clears CUDA's sticky last error
/// for non-sticky errors, so the process stays usable.
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_nvrtc_error(nvrtcResult e, const char* call, const char* file, int line);

/// "cudaErrorNoDevice: no CUDA-capable device is detected".
[[nodiscard]] std::string describe(cudaError_t e);

}  // namespace cuda
}  // namespace loom

#define LOOM_CUDA_CHECK(expr)                                                      \
  do {                                                                             \
    const cudaError_t loom_cuda_status_ = (expr);                                  \
    if (loom_cuda_status_ != cudaSuccess) {                                        \
      ::loom::cuda::throw_cuda_error(loom_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

#define LOOM_CUBLAS_CHECK(expr)                                                      \
  do {                                                                               \
    const cublasStatus_t loom_cublas_status_ = (expr);                               \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                              \
      ::loom::cuda::throw_cublas_error(loom_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

#define LOOM_NVRTC_CHECK(expr)                                                     \
  do {                                                                             \
    const nvrtcResult loom_nvrtc_status_ = (expr);                                 \
    if (loom_nvrtc_status_ != NVRTC_SUCCESS) {                                     \
      ::loom::cuda::throw_nvrtc_error(loom_nvrtc_status_, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
