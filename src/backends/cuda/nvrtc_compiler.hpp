// nvrtc_compiler: CUDA C++ source compiled at run time with NVRTC, cached per process, and
// loaded through the CUDA runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel,
// CUDA 12+), never through the driver library directly.
//
// Note [nvrtc cache]
// A plan makes one kernel object per node, and many nodes (many plans, many sessions) hold
// the same expression: so compiled code is cached process-wide by (source, architecture),
// each distinct kernel compiled once, and loaded once. Entries live as long as the process
// (a library stays loaded: kernels of live plans point into it). Two threads asking for
// the same new entry compile it once; different entries compile concurrently. A failed
// compilation is not cached: it throws every time it is asked for.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace loom::cuda {

/// Compiled code: a cubin (for an "sm_XX" target) or PTX (for "compute_XX", which the
/// driver compiles when it loads it; NUL-terminated).
struct nvrtc_binary {
  std::string arch;         // the --gpu-architecture it was compiled for
  bool is_cubin = false;    // cubin, else PTX
  std::vector<char> image;  // what cudaLibraryLoadData takes
  std::string log;          // NVRTC's log: empty when it compiled without a warning
};

/// The options every compilation gets besides the architecture: C++17, no FMA contraction,
/// IEEE division and square root, no flush to zero (Note [fused cuda kernel]).
[[nodiscard]] const std::vector<std::string>& nvrtc_options();

/// The NVRTC target for a device of compute capability major.minor: "sm_<major><minor>"
/// (a cubin) when this NVRTC can compile for it, else "compute_<cc>" (PTX for the driver to
/// compile) with the newest architecture NVRTC has that is not newer than the device's.
/// Throws loom::cuda_error when the device is older than every architecture NVRTC has.
[[nodiscard]] std::string nvrtc_arch(int major, int minor);

/// `source` compiled for `arch` ("sm_90", "compute_90") with nvrtc_options(), from the
/// process-wide cache (Note [nvrtc cache]): the same pointer for the same (source, arch).
/// `name` names the program in NVRTC's messages. Throws loom::cuda_error whose message
/// holds NVRTC's log when the source does not compile (or the arch is not one NVRTC knows).
/// Thread-safe.
[[nodiscard]] std::shared_ptr<const nvrtc_binary> nvrtc_compile(
    const std::string& source, const std::string& arch, const std::string& name = "loom_kernel.cu");

/// The kernel `kernel_name` (an extern "C" symbol) of `source` compiled for `arch`, loaded
/// (once per binary, with cudaLibraryLoadData) and ready for cudaLaunchKernel (cast to
/// const void*). Throws loom::cuda_error when compilation, loading or lookup fails.
/// Thread-safe.
[[nodiscard]] cudaKernel_t nvrtc_kernel(const std::string& source, const std::string& arch,
                                        const std::string& kernel_name);

/// Entries in the process-wide cache (compiled binaries).
[[nodiscard]] std::size_t nvrtc_cache_size();

}  // namespace loom::cuda
