// The views of the array kernels (Note [array views] in src/backends/cpu/array_kernels.cpp),
// made the same way on every device: a view shares its input's buffer and only changes the
// shape, strides and offset. Each backend decides what to do with a view that is not
// dense (a dense copy of its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/tensor.hpp"

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

}  // namespace loom::common
