// Host launchers of the CUDA gathers of array_select.cu: gather_elements and gather_nd over
// raw device pointers (dense operands). Plain C++ for nvcc and g++ alike;
// src/backends/cuda/array_kernels.cpp maps tensors onto these calls. Each queues its work on
// `stream` and returns at once; empty work launches nothing. The kernels move elements of 1,
// 2, 4 or 8 bytes; another size returns false and launches nothing. Indices are int64
// (`index64`) or int32; a negative one counts from the end; one still outside its dimension
// gives an element of zero bits (Note [cuda value checks] in elementwise_kernels.cpp: the CPU
// kernels are the ones that check).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::kernels {

/// Dimensions gather_elements and gather_nd take.
inline constexpr int select_max_dims = 8;

/// gather_elements: out[i] = data[i with index[i] along `axis`], i over `dims` (indices'
/// shape, also the output's), data's element strides `data_strides`, data's extent `n` along
/// the axis.
struct elements_layout {
  int rank = 0;
  int axis = 0;
  std::int64_t count = 0;  // output elements
  std::int64_t n = 0;
  std::int64_t dims[select_max_dims] = {};
  std::int64_t data_strides[select_max_dims] = {};
};
bool launch_gather_elements(std::size_t elem_bytes, bool index64, const void* data,
                            const void* indices, void* out, const elements_layout& layout,
                            cudaStream_t stream);

/// gather_nd: for each of batches * tuples index tuples of q entries, the `slice` elements at
/// b * batch_stride + Σ wrap(idx[k]) * dim_strides[k] of data; out is [batches * tuples,
/// slice].
struct nd_layout {
  int q = 0;
  std::int64_t tuples = 1;
  std::int64_t slice = 1;
  std::int64_t batch_stride = 0;
  std::int64_t count = 0;  // output elements
  std::int64_t dims[select_max_dims] = {};
  std::int64_t dim_strides[select_max_dims] = {};
};
bool launch_gather_nd(std::size_t elem_bytes, bool index64, const void* data, const void* indices,
                      void* out, const nd_layout& layout, cudaStream_t stream);

}  // namespace loom::cuda::kernels
