// Host launchers of the CUDA softmax, log_softmax and softmax_cross_entropy kernels
// (softmax.cu), over raw device pointers; reduction_kernels.cpp maps tensors onto them.
//
// Note [cuda softmax]
// Softmax works on a dense [outer, n, inner] view split around its axis. With inner == 1 a
// team per row (a warp for rows of up to 512 elements, eight rows per block; else a block
// of up to 1024 threads, with the row kept in shared memory as floats when it fits) takes the
// row's maximum (NaN ignored, as on CPU), then Σ exp(x - max), then writes; with inner > 1
// a thread takes one column through the same three passes, neighbouring threads reading
// neighbouring columns. 16-bit floats compute in float, f64 in double. An output may be its
// input's buffer: every element is read before any thread writes it (the passes are
// separated by the team's reductions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// Whether softmax, log_softmax and softmax_cross_entropy take t (f32, f64, f16, bf16).
bool softmax_supports(elem_type t);

/// y = softmax (log: log_softmax) of dense x of type t, viewed as [outer, n, inner], along n
/// (n > 0). y may be x. Queued on `stream`.
void launch_softmax(elem_type t, bool log, const void* x, void* y, std::int64_t outer,
                    std::int64_t n, std::int64_t inner, cudaStream_t stream);

/// Sparse softmax cross-entropy over logits [rows, classes] of type t (classes > 0) and
/// labels [rows] (int32 when labels_i32, else int64): loss[r] = log Σ exp(x - max) -
/// (x[label] - max), backprop = softmax(x) - one_hot(label). backprop may be logits. A label
/// outside [0, classes) gives that row NaN loss and NaN backprop (the GPU does not stop to
/// report it; see reduction_kernels.cpp).
void launch_softmax_xent(elem_type t, bool labels_i32, const void* logits, const void* labels,
                         void* loss, void* backprop, std::int64_t rows, std::int64_t classes,
                         cudaStream_t stream);

}  // namespace loom::cuda::kernels
