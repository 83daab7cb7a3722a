// Strided-to-dense copy on the GPU: the gather behind cuda_device::contiguous_copy.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::kernels {

/// Tensors of up to this many dimensions (after merging dimensions that are contiguous with
/// each other) take the kernel below.
inline constexpr int max_strided_rank = 8;

/// A strided view: element (i0, ..., i_{rank-1}) is at src[Σ ik · strides[k]] (elements).
struct strided_layout {
  int rank = 0;
  std::int64_t sizes[max_strided_rank] = {};
  std::int64_t strides[max_strided_rank] = {};
};

/// dst[i] = element i (row-major) of the view of `src`, for `n` elements of `element_size`
/// bytes (1, 2, 4, 8 or 16). Queued on `stream`; returns the launch status.
cudaError_t strided_copy(const void* src, void* dst, std::size_t element_size,
                         const strided_layout& layout, std::int64_t n, cudaStream_t stream);

}  // namespace loom::cuda::kernels
