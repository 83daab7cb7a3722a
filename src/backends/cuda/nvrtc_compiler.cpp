// nvrtc_compiler: NVRTC compilation, the process-wide cache, and loading through cudart's
// library API (Note [nvrtc cache] in nvrtc_compiler.hpp).
#include "nvrtc_compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "cuda_check.hpp"

namespace loom::cuda {
namespace {

// One (source, arch): compiled, then loaded, then its kernels looked up, each once.
struct cache_slot {
  std::mutex mutex;
  std::shared_ptr<const nvrtc_binary> binary;
  cudaLibrary_t library = nullptr;
  std::unordered_map<std::string, cudaKernel_t> kernels;
};

struct compile_cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<cache_slot>> slots;
};

// Never destroyed: libraries stay loaded for the process's lifetime, and unloading them
// from a static destructor could run after cudart itself has shut down.
compile_cache& the_cache() {
  static compile_cache* const cache = new compile_cache;
  return *cache;
}

std::shared_ptr<cache_slot> slot_of(const std::string& source, const std::string& arch) {
  compile_cache& c = the_cache();
  std::string key;
  key.reserve(arch.size() + 1 + source.size());
  key += arch;
  key += '\n';
  key += source;
  const std::lock_guard<std::mutex> lock(c.mutex);
  auto& s = c.slots[std::move(key)];
  if (s == nullptr) s = std::make_shared<cache_slot>();
  return s;
}

// Frees the program however the compilation ends.
struct program_guard {
  nvrtcProgram p = nullptr;
  ~program_guard() {
    if (p != nullptr) (void)nvrtcDestroyProgram(&p);
  }
};

std::string program_log(nvrtcProgram p) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(p, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(p, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

std::shared_ptr<const nvrtc_binary> compile(const std::string& source, const std::string& arch,
                                            const std::string& name) {
  const bool cubin = arch.starts_with("sm_");
  if (!cubin && !arch.starts_with("compute_")) {
    throw cuda_error(fmt::format("NVRTC: '{}' is not an architecture (sm_XX or compute_XX)", arch),
                     static_cast<int>(NVRTC_ERROR_INVALID_OPTION));
  }
  program_guard prog;
  LOOM_NVRTC_CHECK(nvrtcCreateProgram(&prog.p, source.c_str(), name.c_str(), 0, nullptr, nullptr));
  std::vector<std::string> options = nvrtc_options();
  options.push_back("--gpu-architecture=" + arch);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  const nvrtcResult status =
      nvrtcCompileProgram(prog.p, static_cast<int>(argv.size()), argv.data());
  std::string log = program_log(prog.p);
  if (status != NVRTC_SUCCESS) {
    throw cuda_error(fmt::format("NVRTC could not compile {} for {}: {}\n{}", name, arch,
                                 nvrtcGetErrorString(status), log),
                     static_cast<int>(status));
  }
  auto bin = std::make_shared<nvrtc_binary>();
  bin->arch = arch;
  bin->is_cubin = cubin;
  bin->log = std::move(log);
  std::size_t size = 0;
  if (cubin) {
    LOOM_NVRTC_CHECK(nvrtcGetCUBINSize(prog.p, &size));
    bin->image.resize(size);
    LOOM_NVRTC_CHECK(nvrtcGetCUBIN(prog.p, bin->image.data()));
  } else {
    LOOM_NVRTC_CHECK(nvrtcGetPTXSize(prog.p, &size));  // with the terminating NUL
    bin->image.resize(size);
    LOOM_NVRTC_CHECK(nvrtcGetPTX(prog.p, bin->image.data()));
  }
  return bin;
}

// The slot's binary, compiled now if it is not yet. The caller holds the slot's mutex.
const nvrtc_binary& binary_of(cache_slot& s, const std::string& source, const std::string& arch,
                              const std::string& name) {
  if (s.binary == nullptr) s.binary = compile(source, arch, name);
  return *s.binary;
}

}  // namespace

const std::vector<std::string>& nvrtc_options() {
  static const std::vector<std::string> options = {
      "--std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false",
  };
  return options;
}

std::string nvrtc_arch(int major, int minor) {
  int count = 0;
  LOOM_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&count));
  std::vector<int> archs(static_cast<std::size_t>(count));
  if (count > 0) LOOM_NVRTC_CHECK(nvrtcGetSupportedArchs(archs.data()));
  const int cc = major * 10 + minor;
  if (std::find(archs.begin(), archs.end(), cc) != archs.end()) return fmt::format("sm_{}", cc);
  int best = -1;
  for (int a : archs) {
    if (a <= cc) best = std::max(best, a);
  }
  if (best < 0) {
    throw cuda_error(fmt::format("NVRTC cannot compile for a device of compute capability {}.{}: "
                                 "the oldest architecture it has is sm_{}",
                                 major, minor,
                                 archs.empty() ? 0 : *std::min_element(archs.begin(), archs.end())),
                     static_cast<int>(NVRTC_ERROR_INVALID_OPTION));
  }
  return fmt::format("compute_{}", best);
}

std::shared_ptr<const nvrtc_binary> nvrtc_compile(const std::string& source,
                                                  const std::string& arch,
                                                  const std::string& name) {
  const auto s = slot_of(source, arch);
  const std::lock_guard<std::mutex> lock(s->mutex);
  (void)binary_of(*s, source, arch, name);
  return s->binary;
}

cudaKernel_t nvrtc_kernel(const std::string& source, const std::string& arch,
                          const std::string& kernel_name) {
  const auto s = slot_of(source, arch);
  const std::lock_guard<std::mutex> lock(s->mutex);
  if (auto it = s->kernels.find(kernel_name); it != s->kernels.end()) return it->second;
  const nvrtc_binary& bin = binary_of(*s, source, arch, kernel_name + ".cu");
  if (s->library == nullptr) {
    LOOM_CUDA_CHECK(cudaLibraryLoadData(&s->library, bin.image.data(), nullptr, nullptr, 0, nullptr,
                                        nullptr, 0));
  }
  cudaKernel_t k = nullptr;
  LOOM_CUDA_CHECK(cudaLibraryGetKernel(&k, s->library, kernel_name.c_str()));
  s->kernels.emplace(kernel_name, k);
  return k;
}

std::size_t nvrtc_cache_size() {
  compile_cache& c = the_cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  std::size_t n = 0;
  for (const auto& [key, s] : c.slots) {
    const std::lock_guard<std::mutex> slot_lock(s->mutex);
    if (s->binary != nullptr) ++n;
  }
  return n;
}

}  // namespace loom::cuda
