// Array ops: shape changes and data movement. reshape, transpose, concat, split, slice,
// gather, one_hot, squeeze, expand_dims, pad, gather_grad, broadcast_to; shape_of,
// dynamic_reshape, expand, constant_of_shape (shapes given by int64 tensors at run time),
// tile, flip, strided_slice, cumsum and the gradient ops expand_grad, strided_slice_grad;
// topk, gather_elements, scatter_elements, gather_nd, scatter_nd; the builders sort, stack
// and einsum.
//
// Every builder adds one node to x's graph and runs inference, so a shape or attribute that
// cannot fit (a reshape to a different element count, a perm that is not a permutation, a
// slice past the end, ...) throws loom::invalid_argument naming the node, wherever the
// shapes are known; what is only known at run time fails then with a loom::node_error.
// Each op works on every dtype (f32 f64 f16 bf16 i32 i64 i8 u8 bool), except gather_grad
// (every dtype but bool).
//
// Views and copies (Note [array views] in src/kernel/common/array_views.hpp): reshape of a
// contiguous tensor, squeeze and expand_dims return views that share the input's buffer;
// split returns views when each piece is a contiguous block of its input (splitting along
// the first non-trivial axis of a contiguous tensor); broadcast_to returns a view with
// stride 0 on the broadcast dimensions; transpose, concat, slice, gather, one_hot, pad and
// gather_grad write new contiguous tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// x with shape `shape` (row-major order kept). One dimension may be -1: it is inferred
/// from x's element count. Throws loom::invalid_argument when the counts cannot match or
/// `shape` holds more than one -1 or a dimension below -1.
output reshape(output x, const std::vector<std::int64_t>& shape, const node_options& o = {});

/// x with its dimensions permuted: output dim i is x's dim perm[i]. An empty perm reverses
/// the dimensions. Throws loom::invalid_argument when perm is not a permutation of
/// 0..rank-1.
output transpose(output x, const std::vector<std::int64_t>& perm = {}, const node_options& o = {});

/// The inputs joined along `axis` (negative counts from the end). All inputs have one
/// dtype and rank >= 1, and equal dimensions except on `axis`; throws loom::invalid_argument
/// naming the first input that differs. Needs at least one input.
output concat(const std::vector<output>& values, std::int64_t axis = 0, const node_options& o = {});

/// x cut along `axis` into `num_splits` pieces of equal size (the dimension must divide).
std::vector<output> split(output x, std::int64_t num_splits, std::int64_t axis = 0,
                          const node_options& o = {});

/// x cut along `axis` into pieces of the given sizes, which must add up to the dimension;
/// one size may be -1 (the rest of the dimension).
std::vector<output> split_sizes(output x, const std::vector<std::int64_t>& sizes,
                                std::int64_t axis = 0, const node_options& o = {});

/// The block of x starting at `begin` with extent `size` per dimension (-1: to the end), as
/// TensorFlow's Slice. begin and size have x's rank; the block must lie inside x.
output slice(output x, const std::vector<std::int64_t>& begin,
             const std::vector<std::int64_t>& size, const node_options& o = {});

/// NumPy's take: the entries of `params` along `axis` picked by `indices` (int32 or int64).
/// The output's shape is params.shape[:axis] + indices.shape + params.shape[axis+1:].
/// An index outside [0, params.shape[axis]) fails at run time (loom::node_error naming the
/// position and the value); negative indices do not wrap (see the overload with
/// wrap_negative for ONNX's Gather, where they do).
output gather(output params, output indices, std::int64_t axis = 0, const node_options& o = {});
/// gather as ONNX Gather with `wrap_negative`: an index in [-n, 0) counts from the end
/// (n + index); outside [-n, n) fails at run time on the CPU. Without it, as above.
output gather(output params, output indices, std::int64_t axis, bool wrap_negative,
              const node_options& o = {});

/// A one-hot encoding of `indices` (int32 or int64): a new dimension of size `depth` is
/// inserted at `axis` (-1: last), holding `on` where its position equals the index and
/// `off` elsewhere. Indices outside [0, depth) give all-`off` rows, as in TensorFlow.
output one_hot(output indices, std::int64_t depth, dtype t = dtype::f32, double on = 1.0,
               double off = 0.0, std::int64_t axis = -1, const node_options& o = {});

/// x without the dimensions listed in `axes` (each must be 1), or without every dimension
/// of size 1 when `axes` is empty. A view.
output squeeze(output x, const std::vector<std::int64_t>& axes = {}, const node_options& o = {});

/// x with a dimension of size 1 inserted at `axis` (in [-rank-1, rank]; negative counts
/// from the end of the output). A view.
output expand_dims(output x, std::int64_t axis, const node_options& o = {});

/// x surrounded by `constant_value`: `paddings` holds 2 values per dimension of x (before0,
/// after0, before1, after1, ...), each >= 0; output dimension d is x's plus both. The
/// gradient of slice. constant_value is converted to x's dtype (rounded for 16-bit floats,
/// truncated for integers, != 0 for bool). Throws loom::invalid_argument when paddings is
/// negative or does not have 2 entries per dimension.
output pad(output x, const std::vector<std::int64_t>& paddings, double constant_value = 0.0,
           const node_options& o = {});

/// The gradient of gather(params, indices, axis) for params of `params_shape`: zeros of
/// params_shape, plus dy's slices added at `indices` along `axis` (a duplicate index
/// accumulates every slice it picked). dy has gather's output shape,
/// params_shape[:axis] + indices.shape + params_shape[axis+1:]; params_shape's dimensions
/// may be -1 except the axis (taken from dy). As for gather, an index outside
/// [0, params_shape[axis]) fails at run time (loom::node_error naming the position and the
/// value); negative indices do not wrap. Every dtype but bool. The result does not depend on
/// the thread count (each output row sums its slices in the order of the indices).
output gather_grad(output dy, output indices, shape params_shape, std::int64_t axis = 0,
                   const node_options& o = {});

/// x broadcast to shape `s` by NumPy's rules (x's dimensions align with the last ones of s;
/// each is 1 or equal to s's). A view with stride 0 on the broadcast dimensions: no copy.
/// Throws loom::invalid_argument when x does not broadcast to s or s has a negative
/// dimension.
output broadcast_to(output x, shape s, const node_options& o = {});

/// x's shape at run time: int64 of shape [rank(x)]. Any dtype.
output shape_of(output x, const node_options& o = {});

/// x under the shape held by `shape` (int64, 1-D), as ONNX Reshape: an entry 0 copies x's
/// dimension at that position (with `allowzero`, it is a 0), one entry -1 is inferred from
/// x's element count. A view when x is dense. A target that does not fit fails at run time
/// (loom::node_error naming both shapes). Every dtype.
output dynamic_reshape(output x, output shape, bool allowzero = false, const node_options& o = {});

/// x broadcast with the shape held by `shape` (int64, 1-D), as ONNX Expand: the NumPy
/// broadcast of x's shape and `shape` both ways (a 1 in `shape` keeps x's dimension). A view
/// with stride 0 on the broadcast dimensions. Every dtype.
output expand(output x, output shape, const node_options& o = {});

/// The gradient of expand for an input of shape `shape` (int64, 1-D, e.g. shape_of(x)): dy
/// summed over the dimensions expand broadcast. Every dtype but bool.
output expand_grad(output dy, output shape, const node_options& o = {});

/// A tensor of dtype `t` and the shape held by `shape` (int64, 1-D; an empty shape gives a
/// scalar) filled with `value` (converted as one_hot's values), as ONNX ConstantOfShape.
output constant_of_shape(output shape, dtype t = dtype::f32, double value = 0.0,
                         const node_options& o = {});

/// numpy.tile with one multiple (>= 0) per dimension of x: output dimension d is x's times
/// multiples[d]. Throws loom::invalid_argument unless multiples has x's rank. A dense copy.
output tile(output x, const std::vector<std::int64_t>& multiples, const node_options& o = {});

/// numpy.flip: x with its entries in reverse order along `axes` (negative from the end;
/// empty: every axis). A dense copy.
output flip(output x, const std::vector<std::int64_t>& axes = {}, const node_options& o = {});

/// ONNX Slice: along axes[i] (empty: 0..n-1), the entries from starts[i] towards ends[i]
/// (excluded) every steps[i] (empty: 1; negative steps walk backwards; 0 is an error).
/// Negative starts and ends count from the end, then clamp to the dimension (INT64_MAX or
/// INT64_MIN: to the end). A dense copy. Every dtype.
output strided_slice(output x, const std::vector<std::int64_t>& starts,
                     const std::vector<std::int64_t>& ends,
                     const std::vector<std::int64_t>& axes = {},
                     const std::vector<std::int64_t>& steps = {}, const node_options& o = {});

/// strided_slice whose starts and ends are int64 tensors [len(axes)] read at run time (ONNX
/// Slice with computed bounds); `axes` and `steps` as strided_slice's. CPU only; the sliced
/// dimensions are unknown to inference. Not differentiable.
output dynamic_slice(output x, output starts, output ends, const std::vector<std::int64_t>& axes = {},
                     const std::vector<std::int64_t>& steps = {}, const node_options& o = {});

/// The gradient of strided_slice for an input of `input_shape` (all known): zeros of that
/// shape with dy written where strided_slice read. Every dtype but bool.
output strided_slice_grad(output dy, shape input_shape, const std::vector<std::int64_t>& starts,
                          const std::vector<std::int64_t>& ends,
                          const std::vector<std::int64_t>& axes = {},
                          const std::vector<std::int64_t>& steps = {}, const node_options& o = {});

/// ONNX CumSum: running sums of x along `axis`; `exclusive` leaves out each entry itself,
/// `reverse` sums from the end. Floats sum in double and round each result; integers sum in
/// int64 and wrap. f32 f64 f16 bf16 i32 i64; x has rank >= 1.
output cumsum(output x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false,
              const node_options& o = {});

/// ONNX TopK: the k (0 <= k <= the dimension) largest (or smallest) entries of x along
/// `axis`, and their indices (int64): {values, indices}, each x's shape with the axis k. Ties
/// go to the lower index first; NaN counts as larger than every number. The results are
/// sorted (largest first, or smallest first) whether or not `sorted` is set. Every dtype but
/// bool.
std::vector<output> topk(output x, std::int64_t k, std::int64_t axis = -1, bool largest = true,
                         bool sorted = true, const node_options& o = {});

/// x sorted along `axis` (ascending, or descending), stable: topk with k the whole dimension
/// ({values, indices}). Throws loom::invalid_argument unless the dimension is known.
std::vector<output> sort(output x, std::int64_t axis = -1, bool descending = false,
                         const node_options& o = {});

/// ONNX GatherElements: out[i...] = data[i... with index[i...] along `axis`]. indices
/// (int32 or int64) has data's rank and no larger dimension except along the axis; the output
/// has indices' shape. Negative indices count from the end; one outside [-n, n) fails at run
/// time (loom::node_error naming its position and value). Every dtype.
output gather_elements(output data, output indices, std::int64_t axis = 0,
                       const node_options& o = {});

/// ONNX ScatterElements: data with updates[i...] put at (i... with index[i...] along `axis`)
/// - written ("none"; of duplicate indices the last in row-major order wins), added ("add")
/// or multiplied ("mul"). updates has indices' shape; indices as gather_elements. Every dtype
/// (bool adds as or and multiplies as and).
output scatter_elements(output data, output indices, output updates, std::int64_t axis = 0,
                        const std::string& reduction = "none", const node_options& o = {});

/// ONNX GatherND: indices [B..., M..., q] (int32 or int64) picks, for each of its index
/// tuples, the slice data[B..., i0, ..., iq-1, ...]; the first batch_dims dimensions of data
/// and indices match. The output is indices.shape[:-1] + data.shape[batch_dims + q:].
/// Negative indices count from the end; out of range fails at run time. Every dtype.
output gather_nd(output data, output indices, std::int64_t batch_dims = 0,
                 const node_options& o = {});

/// ONNX ScatterND: data with updates' slices written ("none"), added ("add") or multiplied
/// ("mul") at the index tuples of indices (as gather_nd; updates has gather_nd's output
/// shape). batch_dims as gather_nd's (0 in ONNX). Every dtype.
output scatter_nd(output data, output indices, output updates,
                  const std::string& reduction = "none", std::int64_t batch_dims = 0,
                  const node_options& o = {});

/// The inputs (one dtype, one shape) stacked along a new dimension at `axis` (in
/// [-rank-1, rank], negative counting from the end of the output), as numpy.stack:
/// expand_dims of each, then concat. Needs at least one input.
output stack(const std::vector<output>& values, std::int64_t axis = 0, const node_options& o = {});

/// numpy.einsum over float operands of fully known shapes: `equation` names each operand's
/// dimensions with letters ("ij,jk->ik", "bhqd,bhkd->bhqk"); "..." stands for the dimensions
/// not named (the same sizes in every operand that has them, right-aligned); without "->" the
/// output is the ellipsis, then the letters used once, in alphabetical order. A letter
/// repeated within a term takes that operand's diagonal ("ii->i"; "ii" alone is the trace).
/// Lowered when the graph is built onto reduce_sum, transpose, reshape, strided_slice and
/// batched matmul (operands contracted left to right), so it has their gradients and
/// devices. Throws loom::invalid_argument naming the equation for a term that does not fit
/// its operand, a letter of two sizes, an output letter in no operand or repeated in it.
output einsum(const std::string& equation, const std::vector<output>& operands,
              const node_options& o = {});

}  // namespace loom::ops
