// The CUDA backend's device factories (cuda_info.cpp, beside loom/cuda/info.hpp's answers
// about the GPUs present).
#pragma once

#include "loom/device/device_factory.hpp"

namespace loom {

/// Registers the CUDA backend's factories: GPUs, one device per visible GPU, and a
/// GPU-compatible CPU factory (pinned memory when a GPU is present), both at priority 10,
/// above the CPU factory's 0. Called by backends::register_builtin (src/backends/builtin.cpp).
void register_cuda_device_factories(device_factory_registry& registry);

}  // namespace loom
