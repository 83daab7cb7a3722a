// The rules of the array ops, written once: output shapes, geometry and argument checks of
// reshape, squeeze, expand_dims, transpose, concat, split, slice, pad, gather, gather_grad,
// one_hot, broadcast_to, dynamic_reshape, expand, tile, flip, strided_slice and cumsum, as
// pure functions over shapes and attribute values. Shape
// inference (src/graph/ops/array_ops.cpp) calls them when the shapes they need are known;
// every backend's kernel calls them once per run, before it touches data.
//
// Each throws loom::invalid_argument carrying the message alone: inference reports it as it
// is (inference_context::fail does the same), a kernel names its node and device in front
// (kernel_context::fail, through loom::common::apply_rule). The tensors a message names are
// written by `text` callbacks, called only when a check fails: kernels pass
// tensor::describe() (dtype, shape, device), inference the tensor type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/shape.hpp"

namespace loom::array_rules {

using ints = std::vector<std::int64_t>;
/// The description of the tensor a rule checks, for its message.
using text_fn = std::function<std::string()>;
/// The description of input i, for the messages of rules over several inputs.
using texts_fn = std::function<std::string(std::size_t)>;

/// `axis` wrapped into [0, rank). Throws "axis A is outside [-r, r) for X".
[[nodiscard]] std::size_t wrap_axis(std::int64_t axis, std::size_t rank, const text_fn& what);

/// reshape: `target` with its -1 (at most one) resolved for `n` elements. Throws "cannot
/// reshape X (n elements) to [...]" when no shape fits (a -1 among dimensions holding 0
/// elements fits none).
[[nodiscard]] shape reshape_shape(const ints& target, std::int64_t n, const text_fn& what);

/// squeeze: the dimensions of `s` (all known) that go: `axes`, or every dimension of size 1
/// when `axes` is empty. Throws on an axis out of range (wrap_axis) or of a size other than 1.
[[nodiscard]] std::vector<bool> squeezed_dims(const shape& s, const ints& axes,
                                              const text_fn& what);

/// expand_dims: where the new dimension goes in the rank+1 result. Throws "axis A is outside
/// [-r-1, r] for X".
[[nodiscard]] std::size_t expand_dims_position(std::int64_t axis, std::size_t rank,
                                               const text_fn& what);

/// transpose: the permutation for a rank-`rank` input, reversed dimensions when `perm` is
/// empty (the attribute's validator has made it a permutation). Throws when its length is
/// not the rank.
[[nodiscard]] ints transpose_perm(const ints& perm, std::size_t rank, const text_fn& what);

/// concat of `inputs` (all dimensions known) along `axis`: the output shape and the axis.
struct concat_geometry {
  shape out;
  std::size_t axis = 0;
};
/// Throws when input 0 is a scalar, the axis is out of range, or an input differs from input
/// 0 in rank or in a dimension other than the axis.
[[nodiscard]] concat_geometry concat_shape(const std::vector<shape>& inputs, std::int64_t axis,
                                           const texts_fn& what);

/// split: the axis of a rank-`rank` input. Throws for a scalar, or an axis out of range.
[[nodiscard]] std::size_t split_axis(std::int64_t axis, std::size_t rank, const text_fn& what);

/// split: the piece sizes along dimension `axis` of size `dim` (known): `num_splits` equal
/// pieces, or `sizes` with its -1 (at most one) resolved. Throws when they do not fit.
[[nodiscard]] ints split_sizes(std::int64_t dim, std::size_t axis, std::int64_t num_splits,
                               const ints& sizes, const text_fn& what);

/// slice of `in` from `begin`, `size` entries per dimension (-1: to the end): the output
/// shape; dimensions unknown in `in` (-1) take size's value. Throws when begin or size do not
/// have the input's rank, or the block reaches outside a known dimension.
[[nodiscard]] shape slice_shape(const ints& begin, const ints& size, const shape& in,
                                const text_fn& what);

/// pad: the output shape, `in` grown by paddings (before, after) per dimension; unknown
/// dimensions stay unknown. Throws unless there are 2 paddings per dimension.
[[nodiscard]] shape pad_shape(const shape& in, const ints& paddings, const text_fn& what);

/// gather of indices along `axis` of params, and its gradient: params read as [outer, n,
/// inner] and gather's output as [outer, count, inner] (count: the number of indices).
struct gather_geometry {
  shape out;  // gather: params[:axis] + indices + params[axis+1:]; gather_grad: params
  std::size_t axis = 0;
  std::int64_t outer = 1;
  std::int64_t n = 0;
  std::int64_t inner = 1;
};
/// gather of `indices` along `axis` of `params` (all known).
/// Throws when params is a scalar or the axis is out of range ("... for params X").
[[nodiscard]] gather_geometry gather_shape(const shape& params, const shape& indices,
                                           std::int64_t axis, const text_fn& params_text);

/// gather_grad: out is params_shape with the dimensions it leaves unknown taken from dy.
/// Throws when the axis is out of range, dy is not gather's output for params_shape and
/// indices, or the gathered dimension stays unknown.
[[nodiscard]] gather_geometry gather_grad_shape(const shape& params_shape, std::int64_t axis,
                                                const shape& dy, const shape& indices,
                                                const text_fn& dy_text,
                                                const text_fn& indices_text);

/// one_hot of `indices` with `depth` classes at `axis` (-1: last): the output shape, and
/// indices read as [prefix, suffix] around the new dimension.
struct one_hot_geometry {
  shape out;
  std::int64_t prefix = 1;
  std::int64_t suffix = 1;
};
/// Throws "axis A is outside [-1, r] for indices X".
[[nodiscard]] one_hot_geometry one_hot_shape(const shape& indices, std::int64_t depth,
                                             std::int64_t axis, const text_fn& indices_text);

/// broadcast_to: checks that `in` broadcasts to `target`, NumPy-style (unknown dimensions of
/// `in` pass). Throws when the target has fewer dimensions or a dimension is neither 1 nor
/// the target's.
void check_broadcast(const shape& in, const shape& target, const text_fn& what);

/// dynamic_reshape (ONNX Reshape): `spec` resolved against `in` (all known): a 0 copies in's
/// dimension at the same position (unless `allowzero`, where it is a 0), one -1 is inferred
/// from the element count. Throws "cannot reshape X to [spec]: ..." when an entry is below -1,
/// there are two -1, a 0 has no dimension to copy, allowzero meets both 0 and -1, or the
/// element counts differ.
[[nodiscard]] shape dynamic_reshape_shape(const ints& spec, const shape& in, bool allowzero,
                                          const text_fn& what);

/// expand (ONNX Expand): the NumPy broadcast of `in` and `target` (both ways: a 1 in `target`
/// keeps in's dimension). Unknown dimensions of `in` (-1) stay unknown unless target's is
/// above 1. Throws "cannot expand X to [target]: dimension ..." when neither is 1 nor equal,
/// or target has a negative entry.
[[nodiscard]] shape expand_shape(const shape& in, const ints& target, const text_fn& what);

/// expand's gradient: the axes of `out` (expand's output shape) that sum back to `in`
/// (leading extra dimensions, and dimensions where `in` is 1 and `out` is not). Throws unless
/// `in` broadcasts to `out`.
[[nodiscard]] ints expand_grad_axes(const shape& in, const shape& out, const text_fn& what);

/// tile (numpy.tile with one multiple per dimension): in's dimensions times `multiples`.
/// Unknown dimensions stay unknown. Throws when multiples does not have in's rank.
[[nodiscard]] shape tile_shape(const shape& in, const ints& multiples, const text_fn& what);

/// flip: which of `rank` dimensions reverse (`axes` negative from the end; empty: all).
/// Throws on an axis out of range or named twice.
[[nodiscard]] std::vector<bool> flip_dims(std::size_t rank, const ints& axes, const text_fn& what);

/// strided_slice (ONNX Slice): per dimension of the input, the first index, the step and the
/// count taken. Dimensions not sliced start at 0 with step 1 and keep their size.
struct strided_slice_geometry {
  shape out;   // counts; -1 where the input's dimension is unknown and sliced
  ints start;  // first index read per dimension
  ints step;   // step per dimension (1 where not sliced)
};
/// Slice of `in` by starts, ends, axes (empty: 0..n-1) and steps (empty: all 1), as ONNX:
/// negative starts and ends count from the end, then clamp to [0, dim] (step > 0) or
/// [-1, dim-1] (step < 0); INT64_MAX and INT64_MIN are "to the end". Throws when starts and
/// ends (and axes, steps when given) differ in length, an axis is out of range or repeats,
/// or a step is 0.
[[nodiscard]] strided_slice_geometry strided_slice_shape(const shape& in, const ints& starts,
                                                         const ints& ends, const ints& axes,
                                                         const ints& steps, const text_fn& what);

/// gather_elements and scatter_elements (ONNX GatherElements / ScatterElements): indices has
/// data's rank, and no dimension larger than data's except along `axis`; updates (scatter)
/// has indices' shape. The axis in [0, rank). Throws naming the tensors that do not fit.
[[nodiscard]] std::size_t elements_axis(const shape& data, const shape& indices,
                                        const shape* updates, std::int64_t axis,
                                        const texts_fn& what);

/// gather_nd and scatter_nd (ONNX GatherND / ScatterND, scatter_nd with batch_dims as well):
/// data [B..., D...] and indices [B..., M..., q] with b = batch_dims leading dimensions
/// equal, q <= rank(data) - b. Each index tuple picks a slice data[B..., i0..iq-1, ...].
struct nd_geometry {
  shape out;                 // gather_nd's output: indices.shape[:-1] + data.shape[b+q:]
  std::int64_t batches = 1;  // product of the batch dimensions
  std::int64_t tuples = 1;   // index tuples per batch element (product of M)
  std::int64_t q = 0;        // entries per tuple
  std::int64_t slice = 1;    // elements per picked slice
  shape dims;                // data's dimensions the tuple indexes: data.shape[b:b+q]
};
/// Throws when batch_dims is negative or not below both ranks, the batch dimensions differ,
/// indices is a scalar or its last dimension exceeds rank(data) - b.
[[nodiscard]] nd_geometry nd_shape(const shape& data, const shape& indices, std::int64_t batch_dims,
                                   const texts_fn& what);

/// scatter_nd: also checks that updates is gather_nd's output for data and indices.
void check_scatter_nd_updates(const nd_geometry& g, const shape& updates, const texts_fn& what);

/// topk along `axis` of `in` (known): k in [0, dim], the output shape (in with the axis k),
/// and in read as [outer, n, inner]. Throws "k K is outside [0, n] for X" or on a bad axis.
struct topk_geometry {
  shape out;
  std::size_t axis = 0;
  std::int64_t outer = 1;
  std::int64_t n = 0;
  std::int64_t inner = 1;
};
[[nodiscard]] topk_geometry topk_shape(const shape& in, std::int64_t k, std::int64_t axis,
                                       const text_fn& what);

}  // namespace loom::array_rules
