// The views of the array kernels, made the same way on every device: a view shares its
// input's buffer and only changes the shape, strides and offset. Each backend decides what
// to do with a view that is not dense (a dense copy of its own). Also concat's plan, which
// every backend's concat starts from.
//
// Note [array views]: reshape of a contiguous input, squeeze, expand_dims and broadcast_to
// (of any input) and transpose whose permuted view is already dense return views sharing the
// input's buffer: no copy, and the executor may run them inline. split returns views when a
// piece is a contiguous block of its input (splits along the outermost non-trivial axis of a
// dense tensor); other pieces, slice and concat are dense copies. A view keeps its whole
// buffer alive, and because the buffer then has more than one owner no kernel writes into it
// in place (see kernel_context::forward_input_or_allocate_output and the variable updates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// `in` with its dimensions in the order `perm` (a full permutation of its rank).
[[nodiscard]] tensor transpose_view(const tensor& in, const std::vector<std::int64_t>& perm);

/// The block of `in` of shape `s` starting at index `begin` (one entry per dimension);
/// the caller has checked that it lies inside.
[[nodiscard]] tensor block_view(const tensor& in, const std::vector<std::int64_t>& begin,
                                const shape& s);

/// The piece of `in` along `axis` from index `at`, `size` entries long.
[[nodiscard]] tensor piece_view(const tensor& in, std::size_t axis, std::int64_t at,
                                std::int64_t size);

/// `in` without the dimensions marked in `drop` (all of size 1).
[[nodiscard]] tensor squeeze_view(const tensor& in, const std::vector<bool>& drop);

/// `in` with a dimension of size 1 inserted at position `at` (0..rank).
[[nodiscard]] tensor expand_dims_view(const tensor& in, std::size_t at);

/// `in` broadcast to `target` (checked by array_rules::check_broadcast): stride 0 along the
/// dimensions it repeats.
[[nodiscard]] tensor broadcast_view(const tensor& in, const shape& target);

/// What every concat kernel starts from: the output shape and the axis (the op rule
/// array_rules::concat_shape over ctx's inputs; a mismatch fails naming the node), and whether
/// every input is contiguous.
struct concat_plan {
  shape out;
  std::size_t axis = 0;
  bool all_dense = true;
};
[[nodiscard]] concat_plan plan_concat(const kernel_context& ctx, std::int64_t axis);

}  // namespace loom::common
