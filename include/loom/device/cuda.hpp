// Moved: CUDA's public headers live in include/loom/cuda/. This one forwards to
// loom/cuda/info.hpp so that code written against the old path keeps compiling; new code
// includes loom/cuda/info.hpp.
#pragma once

#include "loom/cuda/info.hpp"
