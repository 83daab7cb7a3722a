// Shared by the CUDA tests (tests/cuda, built only with the CUDA backend; CTest label
// "gpu"). Tests that need a GPU start with LOOM_REQUIRE_GPU(): without one they
// skip, saying why; tests that need none (code generation, NVRTC compilation, option
// checks) run everywhere.
#pragma once

#include <gtest/gtest.h>

#include "loom/cuda/info.hpp"

#define LOOM_REQUIRE_GPU()                                                       \
  do {                                                                           \
    if (::loom::cuda::device_count() == 0) {                                     \
      GTEST_SKIP() << "needs a CUDA GPU: " << ::loom::cuda::availability();      \
    }                                                                            \
  } while (0)
