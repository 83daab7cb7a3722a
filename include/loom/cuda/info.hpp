// cuda/info: what the process can tell about CUDA, without including any CUDA header.
//
// loom's public CUDA headers live together in loom/cuda/: this one (every build), interop.hpp
// (every build; without the backend its functions throw) and resources.hpp (CUDA builds
// only). loom's CUDA backend (src/backends/cuda) is built when the CUDA toolkit is found
// (CMake option LOOM_CUDA); code outside the library asks is_built() rather than testing a
// macro. A build with it behaves exactly as one without on a machine with no GPU or no
// driver: the CUDA device factory makes no devices, placement uses the CPU, and the
// gpu-labelled tests skip saying why (availability()). Builds with the backend implement
// these functions in src/backends/cuda/cuda_info.cpp, builds without it in
// src/backends/no_cuda.cpp. docs/cuda.md has the long form.
#pragma once

#include <cstddef>
#include <string>

namespace loom::cuda {

/// True when loom was built with the CUDA backend.
[[nodiscard]] bool is_built() noexcept;

/// GPUs this process can use (after CUDA_VISIBLE_DEVICES): 0 without the backend, without a
/// driver, or without a GPU. Never throws.
[[nodiscard]] int device_count() noexcept;

/// Why device_count() is 0 ("loom was built without CUDA", "no CUDA driver: CUDA driver
/// version is insufficient for CUDA runtime version", "no CUDA GPU is visible"), or "" when
/// GPUs are present. Never throws.
[[nodiscard]] std::string availability();

/// Hands every wholly free region of GPU `ordinal`'s process pool (Note [cuda memory]) back
/// to CUDA, as TensorFlow users release memory at run time; returns the bytes released. 0
/// when that pool has not been made (no device for that GPU yet, no GPU, or no backend).
/// Propagates loom::cuda_error when CUDA fails while waiting for a stream.
std::size_t trim(int ordinal);

/// "CUDA runtime 13.0, driver 13.0, 1 GPU: NVIDIA H200 (sm_90, 139.8 GiB)", or the reason
/// none is available. For `loom devices` and logs.
[[nodiscard]] std::string describe();

}  // namespace loom::cuda
