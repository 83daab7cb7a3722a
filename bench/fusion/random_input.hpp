// Deterministic float32 inputs for the fusion suite's benchmarks.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::bench {

/// A host tensor of shape `s` with values in [lo, hi) from an LCG seeded by `seed`.
inline tensor random_f32(const shape& s, std::uint32_t seed, float lo, float hi) {
  tensor t = memory::host_tensor(dtype::f32, s);
  float* p = t.data<float>();
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::int64_t i = 0; i < s.num_elements(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
  }
  return t;
}

}  // namespace loom::bench
