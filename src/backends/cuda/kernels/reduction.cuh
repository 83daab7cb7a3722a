// Host launchers of the CUDA reduction kernels (reduction.cu): reduce_sum / mean / max / min /
// prod / l1 / l2 / sum_square / log_sum / log_sum_exp / any / all over a dense input viewed as [outer, n, inner] (n reduced), argmax along one axis,
// and a fill for empty reductions. Plain C++ over raw device pointers, so that nvcc never
// sees loom's headers; reduction_kernels.cpp maps tensors onto these calls.
//
// Note [cuda reduction plan]
// [outer, n, inner] with inner == 1 reduces rows: a warp per row for short rows (up to 256
// elements), a block of 256 threads per row otherwise. With inner > 1 it reduces columns: a
// block of 32 x 8 threads takes 32 neighbouring columns (coalesced loads along inner) and
// splits the n rows over its 8 thread rows. When that leaves too few blocks to fill the GPU
// and n is long (a full reduction, [1e6, 4] over axis 0), n is cut into `chunks` pieces:
// a first launch writes each piece's partial accumulator to a temporary, a second combines
// them in order. The plan depends on the shape alone (Note [cuda deterministic reductions]).
// Accumulators are as on CPU: float sums in double (f16/bf16 in float), integer sums and
// products in wrapping 64-bit integers, products of floats and max/min in the compute type,
// log_sum_exp as a (maximum, rescaled sum) pair of doubles, any/all in an int.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// The reductions, numbered as reduction_rules::reduce_kind (reduction_kernels.cpp checks).
enum class reduce_op : int {
  sum,
  mean,
  max,
  min,
  prod,
  l1,
  l2,
  sum_square,
  log_sum,
  log_sum_exp,
  any,
  all
};

/// How one reduction of a dense [outer, n, inner] input runs (Note [cuda reduction plan]).
struct reduce_plan {
  std::int64_t outer = 1;
  std::int64_t n = 1;
  std::int64_t inner = 1;
  /// Pieces n is cut into (1: one launch, no temporary).
  std::int64_t chunks = 1;
  /// Elements of n per piece (the last may be shorter).
  std::int64_t chunk_len = 1;
  /// Device bytes the launch needs for partials (0 when chunks == 1).
  std::size_t temp_bytes = 0;
};

/// The plan for reducing [outer, n, inner] of type t with op (n > 0, outer·inner > 0).
/// `widen`: a float16 / bfloat16 sum into float32 (reduce_sum's output_type), accumulated as
/// the float32 sum of the widened values is.
reduce_plan plan_reduce(elem_type t, reduce_op op, std::int64_t outer, std::int64_t n,
                        std::int64_t inner, bool widen = false);

/// Whether op takes t (sum, max, min, prod, l1, sum_square: f32, f64, f16, bf16, i32, i64;
/// mean, l2, log_sum, log_sum_exp: the floats; any, all: bool).
bool reduce_supports(elem_type t, reduce_op op);

/// y[o, j] = op over x[o, :, j] (y dense [outer, inner], of type t), by `plan`; `temp` holds
/// plan.temp_bytes bytes of device memory when that is not 0. Queued on `stream`.
void launch_reduce(const reduce_plan& plan, elem_type t, reduce_op op, const void* x, void* y,
                   void* temp, cudaStream_t stream, bool widen = false);

/// count elements of elem_bytes (1, 2, 4 or 8) bytes at p set to the low bytes of `bits`.
void launch_fill(void* p, std::int64_t count, int elem_bytes, std::uint64_t bits,
                 cudaStream_t stream);

/// Whether argmax takes t (f32, f64, f16, bf16, i32, i64, i8, u8).
bool argmax_supports(elem_type t);

/// y[o, j] = the index of the maximum (is_min: the minimum) of x[o, :, j] (n > 0): the first
/// on ties, the first NaN when there is one (NumPy); the last of them with `last` (ONNX's
/// select_last_index). y is int32 (out_i32) or int64, dense [outer, inner].
void launch_argmax(elem_type t, bool out_i32, bool is_min, bool last, const void* x, void* y,
                   std::int64_t outer, std::int64_t n, std::int64_t inner, cudaStream_t stream);

}  // namespace loom::cuda::kernels
