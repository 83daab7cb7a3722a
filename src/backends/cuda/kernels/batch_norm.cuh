// Host launcher of the CUDA batch_norm kernel (batch_norm.cu), over raw device pointers;
// normalization_kernels.cpp maps tensors onto it. x is seen as [outer, channels, inner];
// each element computes y = x · a + b with a = scale / sqrt(var + epsilon) and
// b = bias - mean · a of its channel, in float for f32/f16/bf16 and double for f64 (the CPU
// kernel computes a and b in double once per channel: results agree to the compute type's
// rounding).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// Whether batch_norm takes t (f32, f64, f16, bf16).
bool batch_norm_supports(elem_type t);

/// y [outer, channels, inner] from x of that shape and scale, bias, mean, var [channels], all
/// of type t and dense (outer · channels · inner > 0); y may be x. Queued on `stream`.
void launch_batch_norm(elem_type t, const void* x, const void* scale, const void* bias,
                       const void* mean, const void* var, void* y, std::int64_t outer,
                       std::int64_t channels, std::int64_t inner, double epsilon,
                       cudaStream_t stream);

}  // namespace loom::cuda::kernels
