// In-place variable updates on the GPU: dst += src or dst -= src (assign_add, assign_sub).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda::kernels {

/// Element types of update(): loom's dtype codes are not visible to nvcc, so the caller maps.
enum class update_type { f32, f64, f16, bf16, i32, i64 };

/// dst[i] = dst[i] ± src[i] for i < n (subtract when `subtract`); f16/bf16 computed in float.
/// Queued on `stream`; returns the launch status.
cudaError_t update(update_type t, void* dst, const void* src, std::int64_t n, bool subtract,
                   cudaStream_t stream);

}  // namespace loom::cuda::kernels
