// The element-wise epilogue of fused_matmul on the GPU: out = act(out + bias[column] +
// residual) over a dense row-major [rows, columns] matrix, each step as the unfused op's
// kernel computes and rounds it (Note [cuda matmul epilogues] in nn_matmul.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda::kernels {

/// Element types of the epilogue (loom's f16/bf16 are bit-compatible with __half and
/// __nv_bfloat16), numbered as loom::dtype numbers them.
enum class epilogue_type : int { f32, f64, f16, bf16 };

/// The activations of fused_matmul: the unary kernels' own functors (elementwise_ops.cuh),
/// and clip the maximum and minimum ones', in the order of loom::nn_rules::activation.
enum class epilogue_activation : int { none, relu, gelu, gelu_tanh, tanh, sigmoid, clip };

/// out[r, c] = act(out[r, c] + bias[c] + residual[r, c]) for `rows` x `columns` elements,
/// computed in float (double for f64), each step's value rounded to the type as the
/// unfused bias_add, add and activation round theirs; `bias` and `residual` may be null.
/// Activation clip is minimum(maximum(v, clip_min), clip_max), the bounds converted to the
/// type first (Note [clip activation] in nn_rules.hpp); the other activations ignore them.
/// Queued on `stream`; returns the launch status.
cudaError_t matmul_epilogue(void* out, const void* bias, const void* residual, std::int64_t rows,
                            std::int64_t columns, epilogue_type type, epilogue_activation act,
                            double clip_min, double clip_max, cudaStream_t stream);

}  // namespace loom::cuda::kernels
