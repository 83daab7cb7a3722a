// Host launchers of the CUDA element-wise kernels (elementwise_unary.cu, elementwise_binary.cu,
// elementwise_cast.cu), over raw device pointers. Plain C++ without loom's headers, so that
// nvcc never sees fmt or the graph; elementwise_kernels.cpp maps tensors onto these calls.
//
// Note [cuda element-wise layout]
// The output is always dense; every input is described against the output's row-major index
// i by an ew_layout: either flat (rank 0: input k's element i is at i * flat[k], flat[k] being
// 1 for a dense operand of the output's size and 0 for a single element, the common cases and
// the fast path), or general: the output's dimensions after the plan's simplification
// (size-1 dimensions dropped, neighbours merged where every operand steps through them as
// through one; ew::make_plan, src/kernel/common/elementwise_plan.hpp) with each input's
// element stride along each, 0 where it is broadcast. The kernels unravel i against dims (in
// 32-bit arithmetic when the count allows, which is several times cheaper than 64-bit
// division on the GPU) and add up the strides. Pointers passed in point at each operand's
// element 0 (the tensor's offset applied).
//
// Every launcher queues its work on `stream` and returns; an empty output launches nothing.
// Float16 and bfloat16 are computed in float and rounded to nearest even on store, as on CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::kernels {

/// Element types, numbered as loom::dtype (elementwise_kernels.cpp checks that they agree):
/// loom's dtype header is not visible to nvcc.
enum class elem_type : int { f32, f64, f16, bf16, i32, i64, i8, u8, boolean };

/// Dimensions an ew_layout holds (after merging).
inline constexpr int ew_max_dims = 8;
/// Inputs an ew_layout describes (where has three).
inline constexpr int ew_max_inputs = 3;

/// How the inputs map onto the dense output (Note [cuda element-wise layout]). Passed to the
/// kernels by value.
struct ew_layout {
  /// Output elements.
  std::int64_t count = 0;
  /// 0: flat; else the number of entries of dims and strides in use.
  int rank = 0;
  /// Flat layouts: input k's element i is at i * flat[k].
  std::int64_t flat[ew_max_inputs] = {};
  std::int64_t dims[ew_max_dims] = {};
  /// strides[k][d]: input k's stride (elements) along dims[d].
  std::int64_t strides[ew_max_inputs][ew_max_dims] = {};
};

enum class unary_op : int {
  neg,
  abs,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  gelu_erf,
  gelu_tanh,
  erf,
  square,
  reciprocal,
  logical_not,
  sin,
  cos,
  tan,
  asin,
  acos,
  atan,
  sinh,
  cosh,
  asinh,
  acosh,
  atanh,
  log1p,
  expm1,
  floor,
  ceil,
  round,
  sign,
  softplus,
  softsign,
  silu,
  mish,
  hard_swish,
  // With attributes (unary_attrs):
  elu,               // alpha
  selu,              // alpha, gamma
  celu,              // alpha, beta = alpha (the exponent's divisor)
  leaky_relu,        // alpha
  hard_sigmoid,      // alpha, beta
  thresholded_relu,  // alpha
  // bool results:
  isnan,
  isinf,  // detect_positive, detect_negative
  isfinite,
};

/// The attribute values of the unary ops that have some (see unary_op). elu, selu and celu
/// compute x > 0 ? gamma x : gamma alpha (e^(x / beta) - 1).
struct unary_attrs {
  double alpha = 0.0;
  double beta = 1.0;
  double gamma = 1.0;
  bool detect_positive = true;
  bool detect_negative = true;
};

enum class binary_op : int {
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  equal,
  not_equal,
  less,
  less_equal,
  greater,
  greater_equal,
  logical_and,
  logical_or,
  relu_grad,
  mod,   // with the divisor's sign (NumPy's mod)
  fmod,  // with the dividend's sign (C's fmod and %)
};

/// y = op(x) with x laid out by `layout` (input 0) and y dense of layout.count elements of
/// type t (bool for isnan, isinf, isfinite); `attrs` holds the op's attribute values.
/// Returns false, launching nothing, when op does not take t.
bool launch_unary(unary_op op, elem_type t, const void* x, void* y, const ew_layout& layout,
                  cudaStream_t stream, const unary_attrs& attrs = {});

/// out = op(a, b) (inputs 0 and 1 of `layout`), both of type t; out is of type t, or bool for
/// the comparisons and logical ops. Returns false, launching nothing, when op does not take t.
/// Integer division by zero gives 0 (Note [cuda value checks] in elementwise_kernels.cpp).
bool launch_binary(binary_op op, elem_type t, const void* a, const void* b, void* out,
                   const ew_layout& layout, cudaStream_t stream);

/// y = x converted from `from` to `to` (from != to), as the CPU's cast converts: float to
/// integer truncates and saturates (NaN -> 0), integer to integer wraps, to bool is x != 0,
/// to float16 / bfloat16 rounds through float. Returns false for unknown types.
bool launch_cast(elem_type from, elem_type to, const void* x, void* y, const ew_layout& layout,
                 cudaStream_t stream);

/// out = c ? x : y (inputs 0, 1, 2 of `layout`) for elements of `elem_bytes` bytes (1, 2, 4
/// or 8): where moves bits. Returns false for another size.
bool launch_where(std::size_t elem_bytes, const bool* c, const void* x, const void* y, void* out,
                  const ew_layout& layout, cudaStream_t stream);

/// out[i] = the element whose bits are the low `elem_bytes` bytes of `bits` (1, 2, 4 or 8),
/// for i < count. Returns false for another size.
bool launch_fill(std::size_t elem_bytes, std::uint64_t bits, void* out, std::int64_t count,
                 cudaStream_t stream);

/// out[i] = start + i * delta computed in double (no fused multiply-add, so the values are
/// the CPU's bit for bit) and converted to t as cast converts a double. Returns false for bool.
bool launch_range(elem_type t, double start, double delta, void* out, std::int64_t count,
                  cudaStream_t stream);

}  // namespace loom::cuda::kernels
