// Host launchers of the CUDA array kernels (array.cu): strided copies, pad, gather,
// gather_grad, one_hot, gather_elements and gather_nd, over raw device pointers. Plain C++
// for nvcc and g++ alike; array_kernels.cpp maps tensors onto these calls. Every launcher
// queues its work on `stream` and returns at once; empty work launches nothing. Kernels that
// only move elements are instantiated per element size (1, 2, 4 or 8 bytes), not per dtype;
// an unsupported size or type returns false (or cudaErrorInvalidValue) and launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "elementwise.cuh"

namespace loom::cuda::kernels {

/// Copies layout.count elements of `elem_bytes` bytes: element i (row-major over
/// layout.dims) from src + off_0(i) to dst + off_1(i), where off_k unravels i through
/// layout.strides[k] (or is i * layout.flat[k] for a flat layout; Note [cuda element-wise
/// layout]). Destination elements must not overlap each other or the source.
bool launch_copy(std::size_t elem_bytes, const void* src, void* dst, const ew_layout& layout,
                 cudaStream_t stream);

/// Dimensions pad takes.
inline constexpr int pad_max_dims = 8;

/// A padded dense output of `rank` dimensions: out[i] = in[i - before] where that lies inside
/// in_dims, else the constant.
struct pad_layout {
  int rank = 0;
  std::int64_t count = 0;  // output elements
  std::int64_t out_dims[pad_max_dims] = {};
  std::int64_t in_dims[pad_max_dims] = {};
  std::int64_t before[pad_max_dims] = {};
  std::int64_t in_strides[pad_max_dims] = {};  // elements
};

/// pad: every output element written once, the constant being the low `elem_bytes` bytes of
/// `value_bits`.
bool launch_pad(std::size_t elem_bytes, const void* in, void* out, std::uint64_t value_bits,
                const pad_layout& layout, cudaStream_t stream);

/// gather on dense operands: out[o, j, i] = params[o, idx[j], i] for o < outer, j < k,
/// i < inner, with idx int64 (`index64`) or int32; with `wrap_negative`, an index in [-n, 0)
/// reads n + idx. An index outside [0, n) (after wrapping) gives an element of zero bits
/// (Note [cuda value checks] in elementwise_kernels.cpp).
bool launch_gather(std::size_t elem_bytes, bool index64, bool wrap_negative, const void* params,
                   const void* indices, void* out, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, std::int64_t k, cudaStream_t stream);

/// one_hot on dense operands: out[p, d, s] = idx[p, s] == d ? on : off for p < prefix,
/// d < depth, s < suffix; on and off are the low `elem_bytes` bytes of their bits.
bool launch_one_hot(std::size_t elem_bytes, bool index64, const void* indices, void* out,
                    std::int64_t prefix, std::int64_t depth, std::int64_t suffix,
                    std::uint64_t on_bits, std::uint64_t off_bits, cudaStream_t stream);

/// Device scratch memory launch_gather_grad needs for `count` indices into `n` rows.
std::size_t gather_grad_scratch_bytes(std::int64_t count, std::int64_t n);

/// gather_grad on dense operands (count > 0, outer * n * inner > 0): out[o, r, :] = the sum,
/// in increasing j, of dy[o, j, :] over the positions j with idx[j] == r, in the CPU's sum
/// type (float for float32 and the 16-bit floats, double for float64, wrapping uint64 for
/// integers), so results are the CPU's bit for bit. Positions are grouped by a stable radix
/// sort of the indices (in `scratch`, gather_grad_scratch_bytes large); indices outside
/// [0, n) add nothing. Type t may not be bool. Returns the first CUDA error.
cudaError_t launch_gather_grad(elem_type t, bool index64, const void* dy, const void* indices,
                               void* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                               std::int64_t count, void* scratch, std::size_t scratch_bytes,
                               cudaStream_t stream);

/// Dimensions gather_elements and gather_nd take. Both wrap a negative index (counting from
/// the end); one still outside its dimension gives an element of zero bits.
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
