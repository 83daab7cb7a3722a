// Moved: CUDA's public headers live in include/loom/cuda/. This one forwards to
// loom/cuda/resources.hpp so that code written against the old path keeps compiling; new code
// includes loom/cuda/resources.hpp.
#pragma once

#include "loom/cuda/resources.hpp"
