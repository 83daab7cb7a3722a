#include "cuda_check.hpp"

#include <fmt/format.h>

#include <new>

namespace loom::cuda {

std::string describe(cudaError_t e) {
  return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
}

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  // Non-sticky errors stay as the thread's last error until read; read it so the next
  // check does not report this one again. (Sticky errors, a kernel's illegal address, leave
  // the context unusable whatever we do; the message says which it was.)
  (void)cudaGetLastError();
  const std::string message = fmt::format("{} failed at {}:{}: {}", call, file, line, describe(e));
  if (e == cudaErrorMemoryAllocation) throw out_of_memory(message, 0, call);
  throw cuda_error(message, static_cast<int>(e));
}

void throw_cublas_error(cublasStatus_t e, const char* call, const char* file, int line) {
  const std::string message = fmt::format("{} failed at {}:{}: {}: {}", call, file, line,
                                          cublasGetStatusName(e), cublasGetStatusString(e));
  if (e == CUBLAS_STATUS_ALLOC_FAILED) throw out_of_memory(message, 0, call);
  throw cuda_error(message, static_cast<int>(e));
}

void throw_nvrtc_error(nvrtcResult e, const char* call, const char* file, int line) {
  const std::string message =
      fmt::format("{} failed at {}:{}: {}", call, file, line, nvrtcGetErrorString(e));
  if (e == NVRTC_ERROR_OUT_OF_MEMORY) throw out_of_memory(message, 0, call);
  throw cuda_error(message, static_cast<int>(e));
}

}  // namespace loom::cuda
