// Host launcher of the CUDA bias_add kernel (bias_add.cu), over raw device pointers;
// nn_kernels.cpp maps tensors onto it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// Whether bias_add takes t (f32, f64, f16, bf16, i32, i64, i8, u8).
bool bias_add_supports(elem_type t);

/// out[i] = x[i] + bias[(i / inner) % channels] over `count` dense elements of type t (NHWC:
/// inner 1; NCHW: inner = the spatial size). 16-bit floats add in float; integers wrap as
/// the CPU kernel's static_cast does. out may be x. Queued on `stream`.
void launch_bias_add(elem_type t, const void* x, const void* bias, void* out, std::int64_t count,
                     std::int64_t channels, std::int64_t inner, cudaStream_t stream);

}  // namespace loom::cuda::kernels
