// The window arithmetic shared by the nn ops' inference (nn_ops.cpp) and their kernels
// (src/backends/cpu/nn_*.cpp), so that both agree on every output size.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace loom::nn_attrs {

/// [top, bottom, left, right] from a padding attribute of 4 values, or of 2 ([h, w],
/// symmetric). The attribute's validator has checked the length.
inline std::array<std::int64_t, 4> padding4(const std::vector<std::int64_t>& p) {
  if (p.size() == 2) return {p[0], p[0], p[1], p[1]};
  return {p[0], p[1], p[2], p[3]};
}

/// Output size along one spatial dimension: (in + pad0 + pad1 - dilation * (k - 1) - 1) /
/// stride + 1; -1 when `in` or `k` is unknown (-1); -2 when the (dilated) window is larger
/// than the padded input.
inline std::int64_t window_out_size(std::int64_t in, std::int64_t k, std::int64_t stride,
                                    std::int64_t dilation, std::int64_t pad0, std::int64_t pad1) {
  if (in < 0 || k < 0) return -1;
  const std::int64_t span = dilation * (k - 1) + 1;
  const std::int64_t padded = in + pad0 + pad1;
  if (padded < span) return -2;
  return (padded - span) / stride + 1;
}

}  // namespace loom::nn_attrs
