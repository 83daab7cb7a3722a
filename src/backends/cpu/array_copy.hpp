// The CPU backend's strided copy: the data movement under transpose, concat, split, slice
// and every "make this view dense" in the array kernels.
//
// Note [strided copy]: a copy is described as dimensions plus source and destination
// strides (in elements). Before copying, dimensions of size 1 are dropped and neighbours
// that are contiguous in both source and destination are merged, so most copies become one
// of three shapes:
//   - rows: the innermost dimension is dense on both sides; each row is one memcpy (long
//     rows are cut into pieces so that a single big block still uses every thread);
//   - transpose: the destination is dense in its innermost dimension and the source is dense
//     in another one; the pair is copied in square tiles that fit in L1, so both the reads
//     and the writes stay in cache lines already loaded (the cache-blocked transpose);
//   - anything else: an element loop with the innermost strides (broadcast sources too).
// Copies move bytes, so one instantiation per element size (1, 2, 4, 8) serves every
// dtype. Work is split over the device's threads through kernel_context::parallel_for.
#pragma once

#include <cstddef>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::cpu {

/// Copies element (i0, i1, ...) of `dims` from src + Σ ik·src_strides[k] to
/// dst + Σ ik·dst_strides[k], strides and offsets counted in elements of `elem_size` bytes
/// (1, 2, 4 or 8). The destination elements must not overlap each other or the source.
/// Empty dims copy nothing. Runs on ctx's threads.
void strided_copy(const kernel_context& ctx, std::size_t elem_size, const shape& dims,
                  const void* src, const shape& src_strides, void* dst, const shape& dst_strides);

/// Copies the elements of `src` (any strides) in row-major order to dense memory at `dst`.
void copy_dense(const kernel_context& ctx, const tensor& src, void* dst);

/// The CPU's dense copy, for the array kernels every backend shares
/// (src/kernel/common/array_kernels.hpp): sets output i to a new dense tensor of shape `out`
/// holding the elements of `src` (any strides) in row-major order.
class dense_copy {
 public:
  explicit dense_copy(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(std::size_t i, const tensor& src, const shape& out) const;

 private:
  kernel_context& ctx_;
};

}  // namespace loom::cpu
