// What the kernels of all_gather and reduce_scatter check and produce on every backend (the
// CPU's in src/backends/cpu/collective_kernels.cpp, the GPU's in
// src/backends/cuda/nccl_communicator.cpp): the group the node was built for, and the output
// shape, dimension 0 times (gather) or over (scatter) the group's size.
#pragma once

#include <cstdint>
#include <string>

#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// The output shape of all_gather (`gather`) or reduce_scatter of `x` over a group of
/// `ranks` named `group`; fails the node when `group_size` (the node's, 0: unknown) is not
/// `ranks`, when x has rank 0, or when reduce_scatter's dimension 0 is not a multiple of
/// `ranks`.
inline shape collective_blocks_shape(kernel_context& ctx, const tensor& x, bool gather,
                                     std::int64_t group_size, int ranks,
                                     const std::string& group) {
  if (group_size != 0 && group_size != ranks) {
    ctx.fail("the node was built for {} ranks, but group '{}' has {}", group_size, group, ranks);
  }
  if (gather && x.rank() == 0) {
    ctx.fail("all_gather needs a tensor of rank 1 or more, got {}", x.describe());
  }
  if (!gather && (x.rank() == 0 || x.dim(0) % ranks != 0)) {
    ctx.fail("reduce_scatter needs dimension 0 of {} to be a multiple of the group's {} ranks",
             x.describe(), ranks);
  }
  shape s = x.shape();
  s[0] = gather ? s[0] * ranks : s[0] / ranks;
  return s;
}

}  // namespace loom::common
