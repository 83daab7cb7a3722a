// Host launchers of the CUDA training batch norm passes (batch_norm_train.cu), over raw
// device pointers; normalization_train_kernels.cpp maps the ops onto them. x is seen as
// [outer, channels, inner] (normalization_rules::batch_norm_geometry, both layouts); the
// per-channel arithmetic between the passes is the host's (kernel/common/
// batch_norm_train_math.hpp), as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// Whether the passes take x of t (f32, f64, f16, bf16).
bool batch_norm_train_supports(elem_type t);

/// Per channel c of x (type t, dense, outer · inner > 0 values a channel), into out [2, C]
/// (float64): without dy, the mean and m2 (the sum of squared deviations: one pass, in
/// float64, of the deviations from the channel's first value, corrected for that value's
/// distance from the mean); with dy (type t), Σ dy and Σ dy (x - centre[c]) (centre: the
/// saved mean, float64 [C]). One block a channel. Queued on `stream`.
void launch_batch_norm_channel_sums(elem_type t, const void* x, const void* dy,
                                    const double* centre, double* out, std::int64_t outer,
                                    std::int64_t channels, std::int64_t inner,
                                    cudaStream_t stream);

/// out = (x - cm) a + b per channel (dy null), or dy a + (x - cm) q + b (the dx pass), with
/// the coefficients coef [4, C] (cm, a, q, b) in the compute type (float; float64 for
/// float64 x); out may be x or dy. Queued on `stream`.
void launch_batch_norm_apply(elem_type t, const void* x, const void* dy, void* out,
                             const void* coef, std::int64_t outer, std::int64_t channels,
                             std::int64_t inner, cudaStream_t stream);

}  // namespace loom::cuda::kernels
