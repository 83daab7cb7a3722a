// Note [lazy CUDA libraries]: cuBLAS, cuBLASLt and NVRTC are hundreds of megabytes; linked
// directly, every process that links loom (the `loom` tool, the Python extension, a user's
// program) would map and relocate them at start, about 260 MB resident for `loom --help`,
// and would not start at all on a machine without them. So loom does not link them: this file
// defines the functions loom calls (the same names and signatures as NVIDIA's headers declare),
// and each forwards to the real one, found with dlsym in the library that dlopen loads the
// first time any of its functions is called. The CUDA runtime (libcudart, under a megabyte)
// stays linked; it loads the driver itself.
//
// A library is looked up by its soname (so LD_LIBRARY_PATH and the system's paths apply),
// then under $CUDA_HOME and $CUDA_PATH, then in the toolkit's library folder of the build. When it cannot be loaded, its
// functions return the library's "not initialised" status (the status-string functions say
// which library is missing and why), and load_libraries() says so: the device probe
// (cuda_info.cpp) calls it and then reports no usable GPU, so loom runs on the CPU.
#include "cuda_libraries.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nccl.h>
#include <nvrtc.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace loom::cuda {
namespace {

struct library {
  const char* soname;
  const char* package;  // what provides it
  std::once_flag once;
  void* handle = nullptr;
  std::string error;  // why it could not be loaded
};

library cublas_lib{LOOM_CUBLAS_SONAME, "CUDA's cuBLAS (libcublas)", {}, nullptr, {}};
library cublaslt_lib{LOOM_CUBLASLT_SONAME, "CUDA's cuBLASLt (libcublasLt)", {}, nullptr, {}};
library nvrtc_lib{LOOM_NVRTC_SONAME, "CUDA's NVRTC (libnvrtc)", {}, nullptr, {}};
// NCCL: loaded only by a process that makes an NCCL communicator (loom/distributed/nccl.hpp).
library nccl_lib{"libnccl.so.2", "NCCL (libnccl2, or the CUDA toolkit's libnccl)", {}, nullptr, {}};

// The folders to try after the soname alone: $CUDA_HOME and $CUDA_PATH (lib64, lib), then the
// toolkit's library folder of the build.
std::vector<std::string> fallback_folders() {
  std::vector<std::string> out;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(var);
    if (root == nullptr || *root == '\0') continue;
    out.push_back(std::string(root) + "/lib64");
    out.push_back(std::string(root) + "/lib");
  }
  out.emplace_back(LOOM_CUDA_LIBRARY_DIR);
  return out;
}

void* handle_of(library& lib) {
  std::call_once(lib.once, [&lib] {
    lib.handle = dlopen(lib.soname, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle != nullptr) return;
    const std::string first = dlerror();
    const std::vector<std::string> folders = fallback_folders();
    for (const std::string& folder : folders) {
      lib.handle = dlopen((folder + "/" + lib.soname).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle != nullptr) return;
    }
    lib.error = fmt::format("{} could not be loaded ({}; nor from {}); install {}", lib.soname,
                            first, fmt::join(folders, ", "), lib.package);
  });
  return lib.handle;
}

// The function `name` of `lib`, or nullptr when the library is missing.
template <class F>
F find(library& lib, const char* name) {
  void* h = handle_of(lib);
  return h == nullptr ? nullptr : reinterpret_cast<F>(dlsym(h, name));
}

// Why a library is missing, for the status-string functions.
const char* missing(library& lib) {
  (void)handle_of(lib);
  return lib.error.c_str();
}

}  // namespace

const std::string& load_libraries() {
  static const std::string why = [] {
    std::string out;
    for (library* lib : {&cublas_lib, &cublaslt_lib, &nvrtc_lib}) {
      if (handle_of(*lib) == nullptr) out += (out.empty() ? "" : "; ") + lib->error;
    }
    return out;
  }();
  return why;
}

const std::string& load_nccl() {
  (void)handle_of(nccl_lib);
  return nccl_lib.error;
}

library_sonames sonames() noexcept {
  return {LOOM_CUBLAS_SONAME, LOOM_CUBLASLT_SONAME, LOOM_NVRTC_SONAME};
}

bool library_loaded(const char* soname) {
  // A bare soname matches a loaded library of that soname, wherever it was loaded from.
  void* h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) dlclose(h);  // drops the reference RTLD_NOLOAD took
  return h != nullptr;
}

}  // namespace loom::cuda

using loom::cuda::cublas_lib;
using loom::cuda::cublaslt_lib;
using loom::cuda::nvrtc_lib;
using loom::cuda::nccl_lib;

// One forwarding definition: RET NAME PARAMS { ... return real ARGS; }, or FAIL when the
// library is missing. The declarations (and their C linkage) are NVIDIA's headers'.
#define LOOM_FORWARD(lib, ret, fail, name, params, args)                                       \
  ret name params {                                                                           \
    static const auto real = loom::cuda::find<decltype(&name)>(lib, #name);                   \
    if (real == nullptr) return fail;                                                          \
    return real args;                                                                          \
  }

#define LOOM_CUBLAS(name, params, args) \
  LOOM_FORWARD(cublas_lib, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, name, params, args)
#define LOOM_CUBLASLT(name, params, args) \
  LOOM_FORWARD(cublaslt_lib, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, name, params, args)
#define LOOM_NVRTC(name, params, args) \
  LOOM_FORWARD(nvrtc_lib, nvrtcResult, NVRTC_ERROR_INTERNAL_ERROR, name, params, args)

// ---- cuBLAS (cublas_v2.h maps cublasCreate to cublasCreate_v2, and so on) -----------------
LOOM_CUBLAS(cublasCreate_v2, (cublasHandle_t * handle), (handle))
LOOM_CUBLAS(cublasDestroy_v2, (cublasHandle_t handle), (handle))
LOOM_CUBLAS(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
LOOM_FORWARD(cublas_lib, const char*, loom::cuda::missing(cublas_lib), cublasGetStatusName,
             (cublasStatus_t status), (status))
LOOM_FORWARD(cublas_lib, const char*, loom::cuda::missing(cublas_lib), cublasGetStatusString,
             (cublasStatus_t status), (status))

// ---- cuBLASLt --------------------------------------------------------------------------------
LOOM_CUBLASLT(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
LOOM_CUBLASLT(cublasLtDestroy, (cublasLtHandle_t handle), (handle))
LOOM_CUBLASLT(cublasLtMatmul,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
               cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc,
               const void* beta, const void* c, cublasLtMatrixLayout_t c_desc, void* d,
               cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
               size_t workspace_bytes, cudaStream_t stream),
              (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
               workspace, workspace_bytes, stream))
LOOM_CUBLASLT(cublasLtMatmulAlgoGetHeuristic,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
               cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc,
               cublasLtMatrixLayout_t d_desc, cublasLtMatmulPreference_t preference,
               int requested, cublasLtMatmulHeuristicResult_t results[], int* returned),
              (handle, desc, a_desc, b_desc, c_desc, d_desc, preference, requested, results,
               returned))
LOOM_CUBLASLT(cublasLtMatmulDescCreate,
              (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
              (desc, compute, scale))
LOOM_CUBLASLT(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
LOOM_CUBLASLT(cublasLtMatmulDescSetAttribute,
              (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
               size_t bytes),
              (desc, attr, buf, bytes))
LOOM_CUBLASLT(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
LOOM_CUBLASLT(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
LOOM_CUBLASLT(cublasLtMatmulPreferenceSetAttribute,
              (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
               const void* buf, size_t bytes),
              (pref, attr, buf, bytes))
LOOM_CUBLASLT(cublasLtMatrixLayoutCreate,
              (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
               int64_t ld),
              (layout, type, rows, cols, ld))
LOOM_CUBLASLT(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
LOOM_CUBLASLT(cublasLtMatrixLayoutSetAttribute,
              (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
               size_t bytes),
              (layout, attr, buf, bytes))

// ---- NVRTC -------------------------------------------------------------------------------------
LOOM_FORWARD(nvrtc_lib, const char*, loom::cuda::missing(nvrtc_lib), nvrtcGetErrorString,
             (nvrtcResult result), (result))
LOOM_NVRTC(nvrtcGetNumSupportedArchs, (int* count), (count))
LOOM_NVRTC(nvrtcGetSupportedArchs, (int* archs), (archs))
LOOM_NVRTC(nvrtcCreateProgram,
           (nvrtcProgram * prog, const char* src, const char* name, int headers,
            const char* const* header_sources, const char* const* include_names),
           (prog, src, name, headers, header_sources, include_names))
LOOM_NVRTC(nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))
LOOM_NVRTC(nvrtcCompileProgram, (nvrtcProgram prog, int count, const char* const* options),
           (prog, count, options))
LOOM_NVRTC(nvrtcGetPTXSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
LOOM_NVRTC(nvrtcGetPTX, (nvrtcProgram prog, char* ptx), (prog, ptx))
LOOM_NVRTC(nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
LOOM_NVRTC(nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin), (prog, cubin))
LOOM_NVRTC(nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* bytes), (prog, bytes))
LOOM_NVRTC(nvrtcGetProgramLog, (nvrtcProgram prog, char* log), (prog, log))

// ---- NCCL ------------------------------------------------------------------------------------
#define LOOM_NCCL(name, params, args) \
  LOOM_FORWARD(nccl_lib, ncclResult_t, ncclSystemError, name, params, args)
LOOM_NCCL(ncclGetUniqueId, (ncclUniqueId * id), (id))
LOOM_NCCL(ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank),
          (comm, nranks, id, rank))
LOOM_NCCL(ncclCommDestroy, (ncclComm_t comm), (comm))
LOOM_NCCL(ncclCommAbort, (ncclComm_t comm), (comm))
LOOM_NCCL(ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* error), (comm, error))
LOOM_NCCL(ncclGroupStart, (), ())
LOOM_NCCL(ncclGroupEnd, (), ())
LOOM_NCCL(ncclAllReduce,
          (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream),
          (send, recv, count, type, op, comm, stream))
LOOM_NCCL(ncclBroadcast,
          (const void* send, void* recv, size_t count, ncclDataType_t type, int root,
           ncclComm_t comm, cudaStream_t stream),
          (send, recv, count, type, root, comm, stream))
LOOM_NCCL(ncclAllGather,
          (const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
           cudaStream_t stream),
          (send, recv, count, type, comm, stream))
LOOM_NCCL(ncclReduceScatter,
          (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
           ncclComm_t comm, cudaStream_t stream),
          (send, recv, count, type, op, comm, stream))
LOOM_NCCL(ncclSend,
          (const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
           cudaStream_t stream),
          (send, count, type, peer, comm, stream))
LOOM_NCCL(ncclRecv,
          (void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
           cudaStream_t stream),
          (recv, count, type, peer, comm, stream))
LOOM_FORWARD(nccl_lib, const char*, loom::cuda::missing(nccl_lib), ncclGetErrorString,
             (ncclResult_t result), (result))
