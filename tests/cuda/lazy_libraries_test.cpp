// Note [lazy CUDA libraries]: cuBLAS, cuBLASLt and NVRTC are not mapped until loom first needs
// them. An executable of its own: nothing here may touch them before the first test, and the
// tests run in this order (ctest also runs each in a process of its own).
#include <gtest/gtest.h>

#include "backends/cuda/cuda_libraries.hpp"
#include "backends/cuda/nvrtc_compiler.hpp"
#include "cuda/cuda_test_support.hpp"

namespace loom {
namespace {

TEST(LazyCudaLibraries, NoneIsMappedAtStart) {
  const auto names = cuda::sonames();
  EXPECT_FALSE(cuda::library_loaded(names.cublas));
  EXPECT_FALSE(cuda::library_loaded(names.cublaslt));
  EXPECT_FALSE(cuda::library_loaded(names.nvrtc));
}

TEST(LazyCudaLibraries, TheFirstCallLoadsItsLibraryAlone) {
  // loom's choice of NVRTC target asks NVRTC which architectures it has (no GPU needed):
  // a Hopper device gets Hopper machine code.
  EXPECT_EQ(cuda::nvrtc_arch(9, 0), "sm_90");
  const auto names = cuda::sonames();
  EXPECT_TRUE(cuda::library_loaded(names.nvrtc));
  EXPECT_FALSE(cuda::library_loaded(names.cublaslt));
}

TEST(LazyCudaLibraries, AGpuProbeLoadsAllThree) {
  LOOM_REQUIRE_GPU();  // the probe: with a GPU present it loads the libraries
  EXPECT_EQ(cuda::load_libraries(), "");
  const auto names = cuda::sonames();
  EXPECT_TRUE(cuda::library_loaded(names.cublas));
  EXPECT_TRUE(cuda::library_loaded(names.cublaslt));
  EXPECT_TRUE(cuda::library_loaded(names.nvrtc));
}

}  // namespace
}  // namespace loom
