// The NVRTC compiler wrapper (src/backends/cuda/nvrtc_compiler.hpp): compilation to cubin
// and PTX, NVRTC's log in errors and warnings, the process-wide cache, and the choice of
// architecture. Everything but loading runs without a GPU.
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/nvrtc_compiler.hpp"
#include "cuda/cuda_test_support.hpp"

namespace loom {
namespace {

using cuda::nvrtc_compile;

// Each test uses its own sources (a tag in a comment), so cache counts are its own.
std::string axpy_source(const std::string& tag) {
  return "// " + tag + R"(
extern "C" __global__ void axpy(long long n, float a, const float* x, float* y) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";
}

std::vector<int> supported_archs() {
  int n = 0;
  EXPECT_EQ(nvrtcGetNumSupportedArchs(&n), NVRTC_SUCCESS);
  std::vector<int> archs(static_cast<std::size_t>(n));
  if (n > 0) {
    EXPECT_EQ(nvrtcGetSupportedArchs(archs.data()), NVRTC_SUCCESS);
  }
  return archs;
}

TEST(Nvrtc, CompilesACubinForAnSmArchitecture) {
  const auto bin = nvrtc_compile(axpy_source("cubin"), "sm_90");
  ASSERT_NE(bin, nullptr);
  EXPECT_TRUE(bin->is_cubin);
  EXPECT_EQ(bin->arch, "sm_90");
  EXPECT_TRUE(bin->log.empty()) << bin->log;
  // A cubin is an ELF image.
  ASSERT_GE(bin->image.size(), 4u);
  EXPECT_EQ(std::string(bin->image.data(), 4),
            "\x7f"
            "ELF");
}

TEST(Nvrtc, CompilesPtxForAComputeArchitecture) {
  const auto bin = nvrtc_compile(axpy_source("ptx"), "compute_90");
  EXPECT_FALSE(bin->is_cubin);
  ASSERT_FALSE(bin->image.empty());
  EXPECT_EQ(bin->image.back(), '\0');  // cudaLibraryLoadData reads PTX up to its NUL
  const std::string ptx(bin->image.data());
  EXPECT_NE(ptx.find(".target sm_90"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find(".entry axpy"), std::string::npos) << ptx;
  // The options say no FMA contraction: a * x[i] + y[i] stays a multiply and an add.
  EXPECT_EQ(ptx.find("fma.rn.f32"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find("mul.rn.f32"), std::string::npos) << ptx;
}

TEST(Nvrtc, OptionsKeepIeeeArithmetic) {
  const auto& o = cuda::nvrtc_options();
  for (const char* want : {"--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"}) {
    EXPECT_NE(std::find(o.begin(), o.end(), want), o.end()) << want;
  }
}

TEST(Nvrtc, ACompileErrorThrowsWithNvrtcsLog) {
  const std::string bad = R"(extern "C" __global__ void broken(float* y) {
  y[0] = undefined_thing + 1.0f;
}
)";
  const std::size_t before = cuda::nvrtc_cache_size();
  for (int attempt = 0; attempt < 2; ++attempt) {  // failures are not cached: it fails again
    try {
      (void)nvrtc_compile(bad, "sm_90", "broken_program.cu");
      ADD_FAILURE() << "expected a cuda_error";
    } catch (const cuda_error& e) {
      const std::string m = e.what();
      for (const char* part : {"NVRTC could not compile", "broken_program.cu", "sm_90",
                               "undefined_thing", "is undefined", "(2)"}) {
        EXPECT_NE(m.find(part), std::string::npos) << m << " lacks " << part;
      }
      EXPECT_EQ(e.code(), static_cast<int>(NVRTC_ERROR_COMPILATION));
    }
  }
  EXPECT_EQ(cuda::nvrtc_cache_size(), before);
}

TEST(Nvrtc, WarningsAreKeptInTheLog) {
  // A source that compiles with a warning: the log the fused kernel tests check for
  // emptiness does carry warnings.
  const auto bin = nvrtc_compile(R"(extern "C" __global__ void warns(float* y) {
  y[0] = y[1] / 0.0f;
}
)",
                                 "sm_90");
  EXPECT_NE(bin->log.find("warning"), std::string::npos) << bin->log;
  EXPECT_NE(bin->log.find("division by zero"), std::string::npos) << bin->log;
}

TEST(Nvrtc, BadArchitecturesAreErrors) {
  for (const char* arch : {"sm90", "gfx90a", "sm_1"}) {
    try {
      (void)nvrtc_compile(axpy_source("bad arch"), arch);
      ADD_FAILURE() << "expected a cuda_error for " << arch;
    } catch (const cuda_error& e) {
      EXPECT_NE(std::string(e.what()).find(arch), std::string::npos) << e.what();
    }
  }
}

TEST(Nvrtc, TheCacheReturnsTheSameBinaryForTheSameSourceAndArch) {
  const std::size_t before = cuda::nvrtc_cache_size();
  const auto a = nvrtc_compile(axpy_source("cache"), "sm_90");
  const auto b = nvrtc_compile(axpy_source("cache"), "sm_90", "another_name.cu");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(cuda::nvrtc_cache_size(), before + 1);
  // Another architecture or another source is another entry.
  const auto c = nvrtc_compile(axpy_source("cache"), "sm_80");
  const auto d = nvrtc_compile(axpy_source("cache 2"), "sm_90");
  EXPECT_NE(c.get(), a.get());
  EXPECT_NE(d.get(), a.get());
  EXPECT_EQ(c->arch, "sm_80");
  EXPECT_EQ(cuda::nvrtc_cache_size(), before + 3);
}

TEST(Nvrtc, ThreadsAskingForTheSameSourceCompileItOnce) {
  const std::size_t before = cuda::nvrtc_cache_size();
  std::vector<const cuda::nvrtc_binary*> got(4, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = nvrtc_compile(axpy_source("threads"), "sm_90").get(); });
  }
  for (auto& t : threads) t.join();
  for (const auto* g : got) EXPECT_EQ(g, got[0]);
  EXPECT_EQ(cuda::nvrtc_cache_size(), before + 1);
}

TEST(Nvrtc, TheArchitectureFollowsTheDevice) {
  const auto archs = supported_archs();
  ASSERT_FALSE(archs.empty());
  EXPECT_EQ(cuda::nvrtc_arch(9, 0), "sm_90");  // CUDA 12 and 13 both compile for Hopper
  // Every architecture NVRTC lists gets a cubin.
  for (int a : archs) EXPECT_EQ(cuda::nvrtc_arch(a / 10, a % 10), "sm_" + std::to_string(a));
  // A device newer than any of them gets PTX of the newest.
  const int newest = *std::max_element(archs.begin(), archs.end());
  EXPECT_EQ(cuda::nvrtc_arch(99, 9), "compute_" + std::to_string(newest));
  // One older than all of them is an error naming its capability.
  try {
    (void)cuda::nvrtc_arch(1, 0);
    ADD_FAILURE() << "expected a cuda_error";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("compute capability 1.0"), std::string::npos) << e.what();
  }
}

TEST(Nvrtc, LoadingAKernelNeedsAGpuAndIsCached) {
  const std::string src = axpy_source("load");
  if (cuda::device_count() == 0) {
    // Without a driver the compile succeeds and the load fails, as a cuda_error.
    EXPECT_THROW((void)cuda::nvrtc_kernel(src, "sm_90", "axpy"), cuda_error);
    return;
  }
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, device), cudaSuccess);
  const std::string arch = cuda::nvrtc_arch(p.major, p.minor);
  const cudaKernel_t k = cuda::nvrtc_kernel(src, arch, "axpy");
  EXPECT_NE(k, nullptr);
  EXPECT_EQ(cuda::nvrtc_kernel(src, arch, "axpy"), k);
  // A name the library lacks.
  EXPECT_THROW((void)cuda::nvrtc_kernel(src, arch, "no_such_kernel"), cuda_error);
}

}  // namespace
}  // namespace loom
