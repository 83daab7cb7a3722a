// Moved: CUDA's public headers live in include/loom/cuda/. This one forwards to
// loom/cuda/interop.hpp so that code written against the old path keeps compiling; new code
// includes loom/cuda/interop.hpp.
#pragma once

#include "loom/cuda/interop.hpp"
